"""The arguments of the commands that run a trained model: `eval` and `predict` (inference.py; a language
model's continuations: export/generate.py; a registry's deployment: continual/serve.py). Argparse only, no
torch: imported to parse its command, before torch (ecotrain/cli/commands.py lists the commands); the handlers
are in cli/models.py."""

from __future__ import annotations

from ecotrain.base.runfiles import TOKENIZER


def evaluate(ev) -> None:
    ev.add_argument("target", metavar="RUN_OR_CKPT", help="a run folder or a checkpoint folder; with --registry, a "
                    "version (`current`)")
    ev.add_argument("--data", nargs="+", default=[], metavar="FILE|KEY=VALUE", help="a .npz/.csv file and/or "
                    "overrides of the run's data section (num_samples=2000); default: the run's own data")
    ev.add_argument("--split", choices=["test", "val", "train", "all"], help="default: test, or all when the data "
                    "has no test split")
    ev.add_argument("--out", help="metrics JSON path (default RUN/eval-<label>.json)")
    _serving(ev)


def predict(pr) -> None:
    pr.add_argument("target", metavar="RUN_OR_CKPT", help="a run folder or a checkpoint folder; an exported .pt2 or "
                    ".onnx file (`ecotrain export`); with --registry, a version (`current`)")
    pr.add_argument("--data", nargs="+", default=[], metavar="FILE|KEY=VALUE", help="a .npz/.csv file (labels "
                    "optional) and/or overrides of the run's data section (a classifier: required)")
    pr.add_argument("--out", help="predictions CSV, e.g. preds.csv (a classifier: required); a language model's "
                    "continuations (default: stdout)")
    pr.add_argument("--prompt", action="append", metavar="TEXT", help="a language model: a prompt to continue "
                    "(repeat for more)")
    pr.add_argument("--prompts", metavar="FILE", help="a language model: a UTF-8 file of prompts, one per line")
    pr.add_argument("--max-new-tokens", type=int, help="tokens to add to each prompt (default 100); "
                    "past the model's context the window slides")
    pr.add_argument("--sample", action="store_true", help="sample the next token (default: greedy, the most likely)")
    pr.add_argument("--temperature", type=float, help="with --sample: logits / T (default 1)")
    pr.add_argument("--top-k", type=int, help="with --sample: keep the K most likely tokens")
    pr.add_argument("--seed", type=int, help="with --sample: the generator's seed, per prompt (default 0)")
    pr.add_argument("--format", choices=["text", "jsonl"], help="a language model's output: text, "
                    "or JSON lines with token counts (default text)")
    pr.add_argument("--tokenizer", metavar="FILE", help="a language model whose run carries no tokenizer: its "
                    f"{TOKENIZER}")
    pr.add_argument("--split", choices=["test", "val", "train", "all"], help="default: test, or all when the data "
                    "has no test split")
    _serving(pr)


def _serving(p) -> None:
    """The flags eval and predict share: which model of a deployment, or which domain's statistics, serves."""
    p.add_argument("--registry", help="serve the registry's deployment: the base version given, each cohort's "
                   "version, the learned router (docs/updates.md); --data is one .npz")
    p.add_argument("--cohort", help="with --registry: the cohort of every request (default: the .npz's "
                   "integer `cohort` column, else the router decides)")
    p.add_argument("--domain", help="a model trained with batchnorm policy domain: that domain's BatchNorm "
                   "statistics for every sample (unknown: the pre-trained ones; default: the .npz's `domain` "
                   "column, else the run's own domain)")
