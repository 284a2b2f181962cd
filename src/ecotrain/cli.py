"""The command line: `ecotrain fit RECIPE [key.sub=value ...]` and friends.

Every user error ends as one line `ecotrain: error: ...` and its exit code (see errors.py)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

from ecotrain import startup
from ecotrain.continual import commands as continual_commands
from ecotrain.errors import EXIT_FAILURE, EXIT_USAGE, EcotrainError, os_error_line
from ecotrain.fsnames import shown, tolerant_streams
from ecotrain.green import commands as green_commands
from ecotrain.log import setup_cli_logging
from ecotrain.preemption import Preemption
from ecotrain.runfiles import TOKENIZER, RunFiles
from ecotrain.speech import commands as speech_commands


class _Version(argparse.Action):
    """`ecotrain --version`: the installed distribution's version, read only when asked (importlib.metadata
    costs ~30 ms of start-up that `--help` need not pay)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        from importlib.metadata import version  # only on this path (see the class docstring)

        print(f"ecotrain {version('ecotrain')}")
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ecotrain", description="Train PyTorch models in production.")
    p.add_argument("--version", action=_Version)
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fit", help="train a recipe")
    f.add_argument("recipe", help="recipe YAML, e.g. recipes/mnist1d_cnn.yaml")
    f.add_argument("overrides", nargs="*", help="dotted overrides, e.g. optim.lr=3e-3 loop.max_epochs=5")
    f.add_argument("--run-dir", help="run folder (default runs/<recipe>-<timestamp>)")
    f.add_argument("--quiet", action="store_true", help="no progress bar, only the final lines")
    f.add_argument("--resume", metavar="auto|CKPT", help="auto: continue from the run folder's newest valid "
                   "checkpoint if there is one, else start fresh; or a checkpoint folder")
    f.add_argument("--init-from", metavar="CKPT", help="start from these weights (checkpoint folder, .safetensors, "
                   "or a state_dict file read with weights_only=True)")
    f.add_argument("--keep-optimizer", action="store_true", help="with --init-from a checkpoint: keep its optimizer state")
    f.add_argument("--allow-config-change", action="store_true", help="resume even though the config changed (listed)")
    f.add_argument("--overwrite", action="store_true", help="replace the run already in --run-dir (its files are deleted)")
    f.add_argument("--seeds", metavar="0,1,2", help="one run per seed in sibling folders (--run-dir D: D-s0, D-s1, ...) "
                   "and a group file D-group.json for compare/report")
    f.add_argument("--baseline", metavar="RECIPE", help="with --seeds: also train this recipe on the same seeds "
                   "(D-baseline-s0, ...: paired) and print compare's verdict (exit 0 PASS, 1 FAIL or INCONCLUSIVE)")
    f.add_argument("--until-decided", action="store_true", help="with --baseline: add one seed to both sides at a "
                   "time until the verdict is PASS or FAIL, judged by an interval valid at every look "
                   "(docs/evaluation.md)")
    f.add_argument("--max-seeds", type=int, default=20, help="--until-decided stops here (default 20 per side)")
    f.add_argument("--max-accuracy-drop", type=float, default=0.01, help="with --baseline: as compare's (default 0.01)")
    f.add_argument("--min-cost-cut", type=float, default=0.5, help="with --baseline: as compare's (default 0.5)")
    f.add_argument("--by", default="flops", choices=["flops", "cpu_seconds", "wall_seconds", "energy", "co2e", "cost"],
                   help="with --baseline: the cost figure (default flops: counted, the same on any machine)")
    f.add_argument("--metric", default="test_accuracy", help="with --baseline: summary.json key (default test_accuracy)")
    f.add_argument("--print-config", action="store_true", help="print the merged, validated config as YAML "
                   "and exit without training")
    f.add_argument("--carbon-forecast", metavar="FILE", help="grid-intensity forecast (Carbon Aware SDK or "
                   "ElectricityMaps JSON, or CSV time,gCO2e/kWh): pause at a checkpoint while the grid is dirty "
                   "(carbon.forecast; docs/green.md)")
    f.add_argument("--deadline", help="with --carbon-forecast: finish by this ISO time or duration (12h); the run "
                   "trains in the cleanest hours before it (carbon.deadline)")
    pl = sub.add_parser("plan", help="print the memory a recipe needs (parameters, gradients, optimizer, activations)")
    pl.add_argument("recipe")
    pl.add_argument("overrides", nargs="*", help="dotted overrides, e.g. data.batch_size=4")
    pl.add_argument("--budget", metavar="BYTES", help="measure plans (recompute, offload, chunked loss, optimizer offload, micro-batches) for this much "
                    "memory, e.g. 2GiB, and print the one fit would pick (memory.budget; docs/memory.md)")
    pl.add_argument("--out", metavar="HTML", help="with --budget: also write the measurements and the Pareto front "
                    "(memory vs step time) as a page")
    measure = pl.add_mutually_exclusive_group()
    measure.add_argument("--measure", action="store_true", default=None, help="measure the peak of memory.search_steps "
                         "real training steps in a fresh process, on CPU too (there: its peak RSS, interpreter "
                         "included); the default on CUDA")
    measure.add_argument("--no-measure", dest="measure", action="store_false", help="on CUDA: the estimate only")
    r = sub.add_parser("resume", help="continue a run from its newest valid checkpoint")
    r.add_argument("run_dir")
    r.add_argument("overrides", nargs="*", help="dotted overrides (need --allow-config-change)")
    r.add_argument("--quiet", action="store_true")
    r.add_argument("--allow-config-change", action="store_true")
    lg = sub.add_parser("ledger", help="print a run's cost ledger; --regions restates its CO2e on other grids")
    lg.add_argument("run_dir")
    lg.add_argument("--regions", help="comma-separated country codes, e.g. SE,FR,US,PL")
    c = sub.add_parser("compare", help="baseline vs candidate runs (seed groups): means with 95%% intervals and a "
                       "verdict (exit 0 PASS, 1 FAIL or INCONCLUSIVE; docs/evaluation.md)")
    c.add_argument("runs", nargs="*", metavar="RUN", help="BASELINE CANDIDATE; each may be a group file "
                   "(fit --seeds) or a comma list of run folders (seeds), e.g. a1,a2,a3 b1,b2,b3")
    c.add_argument("--baseline", nargs="+", metavar="RUN", help="baseline run folders (instead of the positionals)")
    c.add_argument("--candidate", nargs="+", metavar="RUN", help="candidate run folders")
    c.add_argument("--max-accuracy-drop", type=float, default=0.01, help="absolute, inclusive (default 0.01); "
                   "with several seeds per side the drop's 95%% interval must lie within it")
    c.add_argument("--min-cost-cut", type=float, default=0.5, help="fraction of the baseline's mean cost "
                   "(default 0.5)")
    c.add_argument("--by", default="co2e", choices=["flops", "cpu_seconds", "wall_seconds", "energy", "co2e", "cost"],
                   help="the cost figure (default co2e); flops is counted, the others are measured")
    c.add_argument("--metric", default="test_accuracy", help="summary.json key (default test_accuracy)")
    ev = sub.add_parser("eval", help="evaluate a trained model (run or checkpoint folder) in eval mode; prints and "
                        "writes its metrics (RUN/eval-<label>.json)")
    ev.add_argument("target", metavar="RUN_OR_CKPT", help="a run folder or a checkpoint folder; with --registry, a "
                    "version (`current`)")
    ev.add_argument("--data", nargs="+", default=[], metavar="FILE|KEY=VALUE", help="a .npz/.csv file and/or "
                    "overrides of the run's data section (num_samples=2000); default: the run's own data")
    ev.add_argument("--split", choices=["test", "val", "train", "all"], help="default: test, or all when the data "
                    "has no test split")
    ev.add_argument("--out", help="metrics JSON path (default RUN/eval-<label>.json)")
    pr = sub.add_parser("predict", help="write a trained model's predictions with class probabilities (CSV); a "
                        "language model's continuations of prompts (--prompt, docs/lm.md)")
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
    for p_ in (ev, pr):
        p_.add_argument("--registry", help="serve the registry's deployment: the base version given, each cohort's "
                        "version, the learned router (docs/updates.md); --data is one .npz")
        p_.add_argument("--cohort", help="with --registry: the cohort of every request (default: the .npz's "
                        "integer `cohort` column, else the router decides)")
        p_.add_argument("--domain", help="a model trained with batchnorm policy domain: that domain's BatchNorm "
                        "statistics for every sample (unknown: the pre-trained ones; default: the .npz's `domain` "
                        "column, else the run's own domain)")
    ex = sub.add_parser("export", help="trace a run's weights with torch.export (.pt2) or to ONNX, check it against "
                        "the eager model on the test split (export.json) and write the model card (docs/export.md)")
    ex.add_argument("run", metavar="RUN", help="a run folder, or a seed group's RUN-group.json (the seed with the best "
                    "validation figure ships)")
    ex.add_argument("--format", choices=["pt2", "onnx"], default="pt2", help="pt2: torch.export.save (default); "
                    "onnx: torch.onnx.export(dynamo=True), needs the onnx extra")
    ex.add_argument("--out", help="the exported file (default RUN/model.pt2 or RUN/model.onnx); export.json and "
                    "README.md go beside it")
    ex.add_argument("--tolerance", type=float, default=1e-4, help="largest output difference vs eager, relative to "
                    "the largest eager output (at least 1); above it: exit 1, nothing written (default 1e-4)")
    ex.add_argument("--domain", help="a model trained with batchnorm policy domain: that domain's statistics in the "
                    "program (one export per domain; default the run's own)")
    ex.add_argument("--no-card", action="store_true", help="do not write README.md beside the export")
    cd = sub.add_parser("card", help="write a Hugging Face model card (README.md): test metrics, how the model was "
                        "chosen, the data, co2_eq_emissions from the ledger")
    cd.add_argument("run", metavar="RUN", help="a run folder, or a seed group's RUN-group.json")
    cd.add_argument("--out", help="the card (default RUN/README.md; a README.md not written by ecotrain is refused)")
    bn = sub.add_parser("bn-report", help="print a run's BatchNorm report (methods: [{name: batchnorm}])")
    bn.add_argument("run_dir")
    rp = sub.add_parser("report", help="write report.html: learning curves, a fit diagnosis, cost, environment; "
                        "several runs: comparison and verdict")
    rp.add_argument("runs", nargs="+", metavar="RUN", help="run folders; a comma list is one group (seeds); with "
                    "two or more groups, each is compared with the first")
    rp.add_argument("--out", help="the HTML file (default RUN/report.html for one run, ./report.html for several)")
    rp.add_argument("--regions", help="grids of the CO2e-by-region chart, e.g. SE,FR,US (default SE,FR,GB,DE,US,CN,IN,PL,AU)")
    rp.add_argument("--by", default="co2e", choices=["flops", "cpu_seconds", "wall_seconds", "energy", "co2e", "cost"],
                    help="the verdict's cost figure (as compare)")
    rp.add_argument("--metric", default="test_accuracy", help="the verdict's summary.json key (as compare)")
    rp.add_argument("--max-accuracy-drop", type=float, default=0.01)
    rp.add_argument("--min-cost-cut", type=float, default=0.5)
    tk = sub.add_parser("tokenize", help="a text corpus into token files (train/val .bin, tokenizer.json, tokens.json) "
                        "for data.name=tokens:DIR")
    tk.add_argument("corpus", help="a text file (one document), a .jsonl file (a \"text\" per line) or a folder of them")
    tk.add_argument("--out", required=True, help="folder for the token files")
    tk.add_argument("--vocab-size", type=int, default=4096, help="BPE vocabulary size (default 4096)")
    tk.add_argument("--tokenizer", choices=["bpe", "bytes"], default="bpe", help="bpe: byte-level BPE trained on the "
                    "corpus (tokenizers library); bytes: the 256 byte values and end of document (default bpe)")
    tk.add_argument("--tokenizer-from", metavar="PATH", help="encode with this saved tokenizer instead of training "
                    "one: a tokenizer.json, or a run, registry version or tokenized folder holding one (the ids of "
                    "a model trained on another corpus, for `ecotrain update`)")
    tk.add_argument("--val-share", type=float, default=0.1, help="share of the documents for val.bin (default 0.1)")
    tk.add_argument("--test-share", type=float, default=0.0, help="share of the documents for test.bin (default 0)")
    lr = sub.add_parser("lr-find", help="LR range test: a plot and a suggested peak LR (writes no run folder)")
    lr.add_argument("recipe")
    lr.add_argument("overrides", nargs="*", help="dotted overrides, e.g. data.batch_size=200")
    lr.add_argument("--steps", type=int, default=200, help="optimizer steps of the sweep (default 200)")
    lr.add_argument("--start", type=float, default=1e-5, help="first LR (default 1e-5)")
    lr.add_argument("--end", type=float, default=1.0, help="last LR (default 1)")
    lr.add_argument("--smooth", type=float, default=0.9, help="EMA factor of the smoothed loss (default 0.9)")
    lr.add_argument("--diverge", type=float, default=4.0, help="stop once the smoothed loss exceeds this "
                    "times its minimum (default 4)")
    lr.add_argument("--out", help="plot path (default runs/<name>-lrfind.png; the curve beside it as .json)")
    for wing in (continual_commands, speech_commands, green_commands):  # commands beside their feature
        COMMANDS.update(wing.add_commands(sub))
    return p


# command -> "module:function" of its handler, imported only when that command runs (_dispatch).
# Each wing's `add_commands(subparsers)` (argparse only, no torch) adds its own: continual.commands
# (update, versions, promote, rollback, review-queue; docs/updates.md), speech.commands (data
# speech-digits, speech-feedback; docs/speech.md), green.commands (green; docs/green.md).
COMMANDS: dict[str, str] = {
    "fit": "ecotrain.cli_fit:cmd_fit",
    "resume": "ecotrain.cli_models:cmd_resume",
    "plan": "ecotrain.cli_models:cmd_plan",
    "ledger": "ecotrain.cli_records:cmd_ledger",
    "compare": "ecotrain.cli_records:cmd_compare",
    "eval": "ecotrain.cli_models:cmd_eval",
    "predict": "ecotrain.cli_models:cmd_predict",
    "bn-report": "ecotrain.cli_models:cmd_bn_report",
    "export": "ecotrain.export.cli_export:cmd_export",
    "card": "ecotrain.export.card:cmd_card",  # reads finished runs: no torch
    "report": "ecotrain.cli_records:cmd_report",
    "lr-find": "ecotrain.lrfind:cmd_lr_find",
    "tokenize": "ecotrain.cli_tokenize:cmd_tokenize",
}


class CommandContext:
    """What a command's handler gets besides its arguments, `handler(args, ctx)`: no handler reads the
    CLI's globals. `preemption` is the stop-signal handler main() installed (None when _main runs on
    its own)."""

    def __init__(self, preemption) -> None:
        self.preemption = preemption

    def committed(self) -> None:
        """A command's file is in place: a stop signal from here on must not report it as interrupted."""
        if self.preemption is not None:
            self.preemption.settle()

    def trained(self, code: int) -> int:
        """A training run ended with `code`; a torchrun worker then ends with os._exit (see main)."""
        if _torchrun_worker():
            _HARD_EXIT.append(code)
        return code


def _dispatch(args) -> int:
    """Run the command's handler. Its module is imported here, the one place, and only now: the
    handlers' modules import torch at their top, and `ecotrain --help`, the parser and the signal
    handler must start without it (docs/architecture.md)."""
    module, _, name = COMMANDS[args.command].partition(":")
    handler = getattr(importlib.import_module(module), name)
    if args.command not in TRAINS:  # a training command's loop resumes the collector (startup.py)
        startup.resume()
    return handler(args, CommandContext(_PREEMPTION))


# Set by CommandContext.trained when this process trained under torchrun with several ranks: its files are closed and
# fsynced, and C++ teardown of the gloo group can abort at exit (distributed.py), so main() ends the
# worker with os._exit. An explicit record of what this process did, not an environment variable.
_HARD_EXIT: list[int] = []
_PREEMPTION = None  # the stop-signal handler main() installs first thing
TRAINS = ("fit", "resume", "update", "green")  # a stop signal finishes the step and checkpoints; the rest stop at once


def main(argv: list[str] | None = None) -> int:
    global _PREEMPTION
    startup.pause()  # no cyclic GC passes over the start-up's imports (startup.py); resumed below at the latest
    _PREEMPTION = Preemption()
    _PREEMPTION.install()  # before torch is imported: a SIGTERM during start-up is answered, not fatal
    setup_cli_logging()
    if argv is None:  # the program's own streams (main() inside a longer process leaves the caller's)
        tolerant_streams()
    try:
        code = _main(argv)
    finally:
        startup.resume()
        if argv is None:  # the `ecotrain` program: a signal during interpreter shutdown must not turn the
            _PREEMPTION.settle()  # command's exit code into -15 (its work is done); no caller to restore
            _PREEMPTION.stop_watching()
        else:
            _PREEMPTION.uninstall()  # the caller's handlers back (main() runs inside a longer process)
    if _HARD_EXIT or (code and _torchrun_worker()):  # a failed worker too: its peers are stuck in collectives
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _torchrun_worker() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ


def _main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("ECOTRAIN_DEBUG", "") not in ("", "0")
    argv = [a for a in argv if a != "--debug"]  # a flag of every command: the full traceback on the terminal
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    # overrides may follow options (`fit R --run-dir D key=v`), which argparse leaves over
    if rest and hasattr(args, "overrides") and all("=" in a and not a.startswith("-") for a in rest):
        args.overrides = [*args.overrides, *rest]
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command not in TRAINS and _PREEMPTION is not None:
        _PREEMPTION.stop_at_once()  # nothing to checkpoint: Ctrl-C stops now, exit 130
        if _PREEMPTION.requested:  # a signal during start-up
            print("ecotrain: interrupted", file=sys.stderr)
            return 130
    try:  # the handler's module is imported in here: a failure or Ctrl-C while importing meets the boundary too
        return _dispatch(args)
    except EcotrainError as exc:
        _say(f"ecotrain: error: {exc}")
        return exc.exit_code
    except KeyboardInterrupt:  # in training: a second Ctrl-C, which stops without the preemption checkpoint
        stopped = " (a second Ctrl-C stops at once, without a checkpoint)" if args.command in TRAINS else ""
        print(f"ecotrain: interrupted{stopped}{_resume_hint(args)}", file=sys.stderr)
        return 130
    except OSError as exc:  # a file the command could not read or write, wherever it was met
        return _failed(args, os_error_line(exc), EXIT_USAGE, debug)
    except (Exception, SystemExit) as exc:  # the boundary: a bug, or the user's own code, failing mid-command
        what = (f"user code called sys.exit({exc.code!r})" if isinstance(exc, SystemExit)
                else f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300])
        notes = getattr(exc, "__notes__", [])  # where: the step first, then the batch (data/loader.py)
        where = " ".join([n for n in notes if n.startswith("during training step")] +
                         [n for n in notes if n.startswith("on the batch")])
        return _failed(args, f"{args.command} failed: {what}{_user_frame(exc)}{' ' + where if where else ''}",
                       EXIT_FAILURE, debug)


def _failed(args, line: str, code: int, debug: bool) -> int:
    """One line on the terminal; the traceback in RUN/error.log (or the cache folder's, else a fresh
    temporary folder's), and on the terminal too with --debug / ECOTRAIN_DEBUG=1. Says which checkpoint
    a run can resume from. Never raises: it is what stands between an error and a traceback."""
    import traceback

    text = traceback.format_exc()
    log_path = _error_log(args, text)
    if debug:
        _say(text, end="")
    where = f"; traceback in {log_path}" if log_path else ""
    _say(f"ecotrain: error: {line}{_resume_hint(args)}{where}{'' if debug else ' (--debug shows it)'}")
    return code


def _say(text: str, end: str = "\n") -> None:
    """A line on stderr, undecodable names as \\xNN; a closed or broken stderr loses it, raises nothing."""
    try:
        print(shown(text), file=sys.stderr, end=end)
    except Exception:  # noqa: BLE001 - nowhere left to report to
        pass


def _error_log(args, text: str) -> Path | None:
    """Append the traceback to the first error.log that can be written: the run folder's (a training
    command), the cache folder's, a fresh private temporary folder's; None when none can."""
    try:
        run = Path(getattr(args, "run_dir", None) or getattr(args, "run", None) or "")
        try:  # the run folder may be the very path that failed (a name too long, a loop of links)
            has_run = str(run) not in ("", ".") and run.is_dir()
        except OSError:
            has_run = False
        trained = has_run and args.command in TRAINS  # a command that only reads a run never writes into it
        folders = ([run] if trained else []) + [_cache_folder(), None]
    except Exception:  # noqa: BLE001 - whatever args holds: the temporary folder still takes it
        folders = [None]
    entry = shown(f"--- ecotrain {' '.join(sys.argv[1:])}\n{text}\n")
    for folder in folders:
        try:
            if folder is None:  # no home, or none writable: mkdtemp's folder is new and ours (0700)
                import tempfile

                folder = Path(tempfile.mkdtemp(prefix="ecotrain-error-"))
            folder.mkdir(parents=True, exist_ok=True)
            with open(RunFiles(folder).error_log, "a", encoding="utf-8", errors="backslashreplace") as f:
                f.write(entry)
            return RunFiles(folder).error_log
        except Exception:  # noqa: BLE001 - the next place, then none
            continue
    return None


def _resume_hint(args) -> str:
    """'; checkpoint step-N is intact: `ecotrain resume RUN` continues from it' after a training command
    stopped by an error or a second Ctrl-C, when its run folder holds a checkpoint; else ''."""
    run = Path(getattr(args, "run_dir", None) or getattr(args, "run", None) or "")
    try:  # the run folder may be the very path that failed (a name too long, a loop of links)
        if args.command not in TRAINS or str(run) in ("", ".") or not RunFiles(run).checkpoints.is_dir():
            return ""
        from ecotrain.checkpoint import list_checkpoints  # here: it imports torch, which cli.py must not

        ckpts = list_checkpoints(run)  # newest first
    except Exception:  # noqa: BLE001 - a hint, part of the error boundary: never its own traceback
        return ""
    return f"; checkpoint {ckpts[0].name} is intact: `ecotrain resume {run}` continues from it" if ckpts else ""


def _user_frame(exc: BaseException) -> str:
    """' in <file>:<line> (<function>)' for the innermost frame of the traceback that is the user's code
    (not ecotrain, torch, or an installed package), or ''."""
    import sysconfig
    import traceback

    try:
        here = Path(__file__).resolve().parent
        libs = {Path(sysconfig.get_paths()[k]).resolve() for k in ("stdlib", "purelib", "platlib")}
        frames = traceback.extract_tb(exc.__traceback__)
    except Exception:  # noqa: BLE001 - part of the error boundary: a frame less, never a traceback
        return ""
    for frame in reversed(frames):
        if frame.filename.startswith("<"):
            continue
        try:
            path = Path(frame.filename).resolve()
        except (OSError, RuntimeError):  # a loop of links: not a frame to name
            continue
        if path.is_relative_to(here) or any(path.is_relative_to(p) for p in libs):
            continue
        return f" in your code at {path.name}:{frame.lineno} ({frame.name})"
    return ""


def _cache_folder() -> Path | None:
    from ecotrain.data.cache import cache_dir  # here: it imports torch, which cli.py must not

    return cache_dir()  # None: no home folder (data/cache.py)


if __name__ == "__main__":
    sys.exit(main())
