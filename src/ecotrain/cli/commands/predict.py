"""`ecotrain predict RUN_OR_CKPT`: a trained model's predictions with class probabilities (CSV,
export/inference.py); an exported .pt2/.onnx file's (export/predict.py); a language model's continuations
of prompts (export/generate.py, docs/lm.md); a registry's deployment (continual/serve.py)."""

from __future__ import annotations

from ecotrain.base.runfiles import TOKENIZER
from ecotrain.cli.shared import registry_served, serving

NAME = "predict"
HELP = ("write a trained model's predictions with class probabilities (CSV); a language model's "
        "continuations of prompts (--prompt, docs/lm.md)")
TRAINS = False


def arguments(pr) -> None:
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
    serving(pr)


def run(args, ctx) -> int:
    from ecotrain.base.errors import ConfigError
    from ecotrain.export.predict import cmd_predict_exported, is_exported

    lm_flags = (args.prompt, args.prompts, args.max_new_tokens, args.temperature, args.top_k, args.seed,
                args.format, args.tokenizer)
    if args.sample or any(v is not None for v in lm_flags):  # a language model continues prompts
        from ecotrain.export.generate import cmd_continue

        return cmd_continue(args, ctx)
    if is_exported(args.target):  # a .pt2/.onnx from `ecotrain export`: no run folder, no model class
        return cmd_predict_exported(args, ctx)
    if not args.data or args.out is None:
        raise ConfigError(f"predict {args.target}: give --data FILE|KEY=VALUE and --out CSV (a language model: "
                          "--prompt TEXT or --prompts FILE)")
    if registry_served(args):
        from ecotrain.continual import serve

        rows, path, counts = serve.predict(args.registry, args.target, args.data[0], args.out, args.cohort)
        ctx.committed()
        print(f"wrote {rows} predictions to {path} (served by " + ", ".join(f"{v}: {n}" for v, n in counts.items())
              + ")")
        return 0
    from ecotrain.export.inference import predict

    rows, path = predict(args.target, args.data, args.out, args.split, domain=args.domain)
    ctx.committed()
    print(f"wrote {rows} predictions to {path}")
    return 0
