"""The commands' work as Python functions: `fit_recipe` is `ecotrain fit RECIPE ...`, `resume_run` is
`ecotrain resume RUN`. The CLI parses its arguments and calls them; `green`'s confirmation groups
and `fit --seeds` (sweep.fit_seeds) call them too, so no wing builds an argparse object or reads the
CLI's globals. Each prints the result lines a user sees and returns the command's exit code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from ecotrain.accounting import read_ledger, summary_line
from ecotrain.checkpoint.manager import latest_valid, list_checkpoints
from ecotrain.config import Config, load_config
from ecotrain.base.errors import EXIT_DIVERGED, EXIT_PREEMPTED, CheckpointError, ConfigError
from ecotrain.base.log import log
from ecotrain.core.preemption import Preemption
from ecotrain.base.rundir import hold
from ecotrain.base.runfiles import CONFIG, RunFiles
from ecotrain.assembly.trainer import RunResult, fit


def fit_recipe(recipe, overrides: Sequence[str] = (), run_dir=None, *, quiet: bool = False, resume=None,
               allow_config_change: bool = False, init_from=None, keep_optimizer: bool = False,
               overwrite: bool = False, preemption: Optional[Preemption] = None, config: Optional[Config] = None) -> int:
    """`ecotrain fit RECIPE OVERRIDES [--run-dir D] [--resume auto|CKPT] ...`: the exit code. `config`: the
    recipe with its overrides already loaded (the CLI read it to choose the thread count): not read again."""
    cfg = config if config is not None else load_config(recipe, list(overrides))
    # `fit` holds the folder's lock from its first decision (`--resume auto`: which checkpoint) to its last write
    return report(fit(cfg, run_dir=run_dir, quiet=quiet, resume=resume, allow_config_change=allow_config_change,
                      init_from=init_from, keep_optimizer=keep_optimizer, overwrite=overwrite, preemption=preemption))


def resume_run(run_dir, overrides: Sequence[str] = (), *, quiet: bool = False, allow_config_change: bool = False,
               preemption: Optional[Preemption] = None) -> int:
    """`ecotrain resume RUN [OVERRIDES]`: from the run's newest valid checkpoint; the exit code."""
    run_dir = Path(run_dir)
    if not RunFiles(run_dir).config.is_file():
        raise ConfigError(f"{run_dir}: not a run folder (no {CONFIG})")
    with hold(run_dir):  # which checkpoint, and the run from it: one command in the folder at a time
        ckpt = latest_valid(run_dir, log.warning)
        if ckpt is None:
            why = "no valid checkpoint (each was skipped above)" if list_checkpoints(run_dir) else "empty or missing"
            raise CheckpointError(f"{run_dir}/checkpoints: {why}, so there is nothing to resume; start the run "
                                  f"again with `ecotrain fit RECIPE --run-dir {run_dir} --overwrite`")
        cfg = load_config(RunFiles(run_dir).config, list(overrides))
        log.info(f"resuming from {ckpt}")
        return report(fit(cfg, run_dir=run_dir, quiet=quiet, resume=ckpt, allow_config_change=allow_config_change,
                          preemption=preemption))


def exit_code(result: RunResult) -> int:
    stopped = result.summary["stopped_because"]
    return EXIT_PREEMPTED if stopped == "preempted" else EXIT_DIVERGED if stopped == "diverged" else 0


def report(result: RunResult) -> int:
    """The result lines of a training command (rank 0 only under torchrun), and its exit code."""
    s, code = result.summary, exit_code(result)
    if result.state is None:  # a finished run: nothing was trained or written
        print(f"already finished: {s['stopped_because']} after {s['steps']} steps; run folder {result.run_dir} "
              "kept as it is")
        return code
    if not result.state.dist.is_main:
        return code
    if s["stopped_because"] == "preempted":
        after = s.get("notice_to_checkpoint_s")
        print(f"preempted at step {s['steps']}; checkpoint {s['checkpoint']}"
              + (f" ({after:.2f} s after the notice)" if after is not None else ""))
        print(f"continue with: ecotrain resume {result.run_dir}")
        return code
    print(f"stopped: {s['stopped_because']} after {s['steps']} steps ({s['epochs']} epochs) in {s['train_seconds']:.1f}s")
    if "test_accuracy" in s:
        print(f"test_accuracy: {s['test_accuracy']:.4f}")
    print(f"run folder: {result.run_dir}")
    if RunFiles(result.run_dir).ledger.is_file():
        print(summary_line(read_ledger(result.run_dir, table=True)))
    return code
