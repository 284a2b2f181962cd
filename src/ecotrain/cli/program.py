"""The command line: `ecotrain fit RECIPE [key.sub=value ...]` and friends.

Every user error ends as one line `ecotrain: error: ...` and its exit code (see errors.py)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ecotrain.base import startup
from ecotrain.base.cachedir import cache_dir
from ecotrain.cli.commands import BY_NAME, COMMANDS, TRAINS
from ecotrain.base.errors import EXIT_FAILURE, EXIT_USAGE, EcotrainError, os_error_line
from ecotrain.base.fsnames import shown, tolerant_streams
from ecotrain.base.log import setup_cli_logging
from ecotrain.core.preemption import Preemption
from ecotrain.base.runfiles import RunFiles


class _Version(argparse.Action):
    """`ecotrain --version`: the installed distribution's version, read only when asked (importlib.metadata
    costs ~30 ms of start-up that `--help` need not pay)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        from importlib.metadata import version  # only on this path (see the class docstring)

        print(f"ecotrain {version('ecotrain')}")
        parser.exit()


def _parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """Every command of commands.COMMANDS (one module each, cli/commands/) with its help; its arguments only
    for the command `argv` names (all of them without `argv`). The command modules import nothing heavy:
    `ecotrain --help` and `ecotrain CMD --help` import no torch."""
    p = argparse.ArgumentParser(prog="ecotrain", description="Train PyTorch models in production.")
    p.add_argument("--version", action=_Version)
    sub = p.add_subparsers(dest="command", required=True)
    named = next((a for a in argv if not a.startswith("-")), None) if argv is not None else None
    for command in COMMANDS:
        parser = sub.add_parser(command.NAME, help=command.HELP)
        if argv is None or command.NAME == named:  # argv's first word: ecotrain's own flags take no value
            command.arguments(parser)
    return p


class CommandContext:
    """What a command's `run` gets besides its arguments, `run(args, ctx)`: no command reads the
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
    """Run the command's `run(args, ctx)`. What it needs (torch, the assembly) it imports itself, now and
    not before: `ecotrain --help`, the parser and the signal handler start without it (docs/architecture.md)."""
    command = BY_NAME[args.command]
    if args.command not in TRAINS:  # a training command's loop resumes the collector (startup.py)
        startup.resume()
    return command.run(args, CommandContext(_PREEMPTION))


# Set by CommandContext.trained when this process trained under torchrun with several ranks: its files are closed and
# fsynced, and C++ teardown of the gloo group can abort at exit (distributed.py), so main() ends the
# worker with os._exit. An explicit record of what this process did, not an environment variable.
_HARD_EXIT: list[int] = []
_PREEMPTION = None  # the stop-signal handler main() installs first thing


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
    parser = _parser(argv)
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
    try:  # run() imports what it needs in here: a failure or Ctrl-C while importing meets the boundary too
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
        from ecotrain.checkpoint import list_checkpoints  # here: it imports torch, which cli/program.py must not

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
        here = Path(__file__).resolve().parents[1]  # the ecotrain package, not only cli/
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
    return cache_dir()  # None: no home folder (base/cachedir.py)


if __name__ == "__main__":
    sys.exit(main())
