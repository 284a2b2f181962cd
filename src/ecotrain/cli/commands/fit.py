"""`ecotrain fit RECIPE [overrides]`: train a recipe; `--seeds` a seed group, `--baseline` a paired comparison
(cli/seeds.py).

Nothing heavy at the top (the registry imports this module for `ecotrain --help`): the thread count must be
set in the environment before torch is imported (threads.py), so run() imports the trainer once it is. Seed
groups and paired comparisons are imported only when asked for: a plain `fit` does not pay for their modules
before its first step (bench/startup.py)."""

from __future__ import annotations

from ecotrain.cli.shared import COST_FIGURES

NAME = "fit"
HELP = "train a recipe"
TRAINS = True


def arguments(f) -> None:
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
    f.add_argument("--by", default="flops", choices=COST_FIGURES,
                   help="with --baseline: the cost figure (default flops: counted, the same on any machine)")
    f.add_argument("--metric", default="test_accuracy", help="with --baseline: summary.json key (default test_accuracy)")
    f.add_argument("--print-config", action="store_true", help="print the merged, validated config as YAML "
                   "and exit without training")
    f.add_argument("--carbon-forecast", metavar="FILE", help="grid-intensity forecast (Carbon Aware SDK or "
                   "ElectricityMaps JSON, or CSV time,gCO2e/kWh): pause at a checkpoint while the grid is dirty "
                   "(carbon.forecast; docs/green.md)")
    f.add_argument("--deadline", help="with --carbon-forecast: finish by this ISO time or duration (12h); the run "
                   "trains in the cleanest hours before it (carbon.deadline)")


def run(args, ctx) -> int:
    """`ctx`: the CLI's CommandContext (cli/program.py): the stop-signal handler, and the record of a finished
    torchrun worker."""
    from ecotrain.base.rundir import config_yaml
    from ecotrain.base.userpath import user_path
    from ecotrain.config import load_config
    from ecotrain.config.carbon import cli_overrides
    from ecotrain.core import threads

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
    from ecotrain.assembly.entry import fit_recipe  # here, after preset_env (entry imports torch)

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
