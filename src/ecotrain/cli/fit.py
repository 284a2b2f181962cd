"""`ecotrain fit RECIPE [overrides]`: the command's body (cli/program.py parses the arguments and dispatches here).

The modules imported at the top are light (no torch): the thread count must be set in the
environment before torch is imported (threads.py), so the trainer is imported once it is. Seed
groups and paired comparisons (`--seeds`, `--baseline`: cli/seeds.py) are imported only when asked
for: a plain `fit` does not pay for their modules before its first step (bench/startup.py).
"""

from __future__ import annotations

from ecotrain.core import threads
from ecotrain.config import load_config
from ecotrain.config.carbon import cli_overrides
from ecotrain.base.rundir import config_yaml
from ecotrain.base.userpath import user_path


def cmd_fit(args, ctx) -> int:
    """`ctx`: the CLI's CommandContext (cli/program.py): the stop-signal handler, and the record of a finished
    torchrun worker."""
    if getattr(args, "carbon_forecast", None) or getattr(args, "deadline", None):
        args.overrides = [*args.overrides, *cli_overrides(args.carbon_forecast, args.deadline)]
        args.carbon_forecast = args.deadline = None  # now overrides: each seed of a group gets them once
    if args.init_from:  # before anything is read or written (a FIFO would block the load forever)
        user_path(args.init_from, "--init-from", "give a checkpoint or run folder, a .safetensors file or a "
                  "state_dict file", folder=True)
    cfg = load_config(args.recipe, args.overrides)
    if args.print_config:
        print(config_yaml(cfg.to_dict()), end="")
        return 0
    if cfg.ledger.enabled and cfg.ledger.energy == "codecarbon":
        from ecotrain.accounting.energy import warm_up  # light: no torch; the probe overlaps torch's import

        warm_up(cfg.ledger.tracking_mode)
    # before torch is imported (torch reads OMP_NUM_THREADS once, when its thread pool starts)
    threads.preset_env(threads.choose(cfg.threads, cfg.data.workers))
    from ecotrain.assembly.entry import fit_recipe  # here, not at the top: after preset_env (entry imports torch)

    def trainer(recipe, config=None):
        def one(overrides, run_dir, resume=args.resume, overwrite=args.overwrite) -> int:
            return ctx.trained(fit_recipe(recipe, overrides, run_dir, quiet=args.quiet, resume=resume,
                                          allow_config_change=args.allow_config_change, init_from=args.init_from,
                                          keep_optimizer=args.keep_optimizer, overwrite=overwrite,
                                          preemption=ctx.preemption, config=config))
        return one

    if getattr(args, "baseline", None) or getattr(args, "until_decided", False) \
            or getattr(args, "seeds", None) is not None:
        from ecotrain.cli.seeds import fit_seed_groups  # here: seed groups only (see the docstring)

        return fit_seed_groups(args, cfg.name, trainer)
    return trainer(args.recipe, cfg)(args.overrides, args.run_dir)  # the config parsed above, not parsed again
