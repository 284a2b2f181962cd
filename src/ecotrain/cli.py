"""The command line: `ecotrain fit RECIPE [key.sub=value ...]` and friends.

Every user error ends as one line `ecotrain: error: ...` and its exit code (see errors.py)."""

from __future__ import annotations

import argparse
import sys

from ecotrain.errors import EXIT_DIVERGED, EcotrainError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ecotrain", description="Train PyTorch models in production.")
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fit", help="train a recipe")
    f.add_argument("recipe", help="recipe YAML, e.g. recipes/mnist1d_cnn.yaml")
    f.add_argument("overrides", nargs="*", help="dotted overrides, e.g. optim.lr=3e-3 loop.max_epochs=5")
    f.add_argument("--run-dir", help="run folder (default runs/<recipe>-<timestamp>)")
    f.add_argument("--quiet", action="store_true", help="no progress bar, only the final lines")
    return p




def cmd_fit(args) -> int:
    from ecotrain.config import load_config
    from ecotrain.trainer import fit

    cfg = load_config(args.recipe, args.overrides)
    result = fit(cfg, run_dir=args.run_dir, quiet=args.quiet)
    s = result.summary
    line = f"stopped: {s['stopped_because']} after {s['steps']} steps ({s['epochs']} epochs) in {s['train_seconds']:.1f}s"
    print(line)
    if "test_accuracy" in s:
        print(f"test_accuracy: {s['test_accuracy']:.4f}")
    print(f"run folder: {result.run_dir}")
    return EXIT_DIVERGED if s["stopped_because"] == "diverged" else 0


COMMANDS = {"fit": cmd_fit}


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except EcotrainError as exc:
        print(f"ecotrain: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("ecotrain: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
