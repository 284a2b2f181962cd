"""`ecotrain fit RECIPE --seeds S [--baseline BASE [--until-decided]]`: seed groups and paired comparisons.

cli/commands/fit.py hands these over (`fit_seed_groups`), so a plain `fit` never imports this module's (sweep,
decide, compare) before its first step. `trainer(recipe)` is cli/commands/fit.py's: it returns
`one(overrides, run_dir, resume=, overwrite=) -> exit code`, one run of the recipe.
"""

from __future__ import annotations

from pathlib import Path

from ecotrain.accounting.compare import judge
from ecotrain.config import load_config
from ecotrain.seeds.decide import save, until_decided
from ecotrain.base.errors import ConfigError, PreemptedError
from ecotrain.base.rundir import default_run_dir, holds_run
from ecotrain.base.groupfile import group_paths, read_group
from ecotrain.seeds.sweep import fit_seeds, parse_seeds
from ecotrain.base.userpath import user_path


def fit_seed_groups(args, name: str, trainer) -> int:
    """One group of runs (`--seeds`), or a baseline's and a candidate's on the same seeds (`--baseline`)."""
    if getattr(args, "baseline", None) or getattr(args, "until_decided", False):  # a pair of seed groups
        return fit_pair(args, name, trainer)
    return fit_seeds(args.recipe, args.overrides, args.seeds, args.run_dir, name, resume=args.resume,
                     overwrite=args.overwrite, fit_one=trainer(args.recipe))  # one run per seed, then a group file


def fit_pair(args, name: str, trainer) -> int:
    """`fit CANDIDATE --seeds S --baseline BASE [--until-decided]`: both recipes on the same seeds (paired),
    then compare's verdict; with --until-decided, one more seed per side until it decides (decide.py)."""
    if not args.baseline or args.seeds is None:
        raise ConfigError("--until-decided: give --baseline RECIPE and --seeds (e.g. --seeds 0-2)")
    user_path(args.baseline, "--baseline", "give the baseline's recipe YAML")
    base_name = load_config(args.baseline, []).name  # a bad baseline recipe: one line, before anything trains
    prefix = Path(args.run_dir) if args.run_dir else default_run_dir(name)
    base_prefix = prefix.with_name(prefix.name + "-baseline")
    first = {"resume": args.resume, "overwrite": args.overwrite}  # later calls keep the runs already trained
    first_of = {str(p): dict(first) for p in (base_prefix, prefix)} | {"trained": 0}

    def train(seeds: list[int]) -> tuple[list[str], list[str]]:
        if not first["resume"] and not first["overwrite"]:  # refused now, not after the first seeds trained
            for one in group_paths(base_prefix, seeds)[1] + group_paths(prefix, seeds)[1]:
                if holds_run(one):
                    raise ConfigError(f"{one}: already holds a run; continue with `--resume auto`, choose a fresh "
                                      "--run-dir, or pass --overwrite to replace it")
        # in turn, seed by seed (baseline, candidate, baseline, ...): a load that comes and goes falls on both
        # sides alike, so measured figures compare pair by pair; the runs already finished are kept
        for k in range(max(1, first_of["trained"]), len(seeds) + 1):  # a later look adds seeds after these
            text = ",".join(map(str, seeds[:k]))
            for recipe, overrides, pre, nm in ((args.baseline, [], base_prefix, base_name),
                                               (args.recipe, args.overrides, prefix, name)):
                code = fit_seeds(recipe, overrides, text, pre, nm, fit_one=trainer(recipe), say_kept=k == 1,
                                 **first_of[str(pre)])
                if code != 0:
                    raise PreemptedError(f"the {nm} group stopped (exit {code}); run the same command with "
                                         "--resume auto to continue it")
                first_of[str(pre)] = {"resume": "auto", "overwrite": False}
        first.update(resume="auto", overwrite=False)
        first_of["trained"] = len(seeds)
        return read_group(group_paths(base_prefix, seeds)[0]), read_group(group_paths(prefix, seeds)[0])

    def judged(base, cand, look):
        return judge(base, cand, args.max_accuracy_drop, args.min_cost_cut, args.by, args.metric,
                     look if args.until_decided else None)

    seeds = parse_seeds(args.seeds)
    if not args.until_decided:
        report, verdict = judged(*train(seeds), None)
        print(report)
        return 0 if verdict == "PASS" else 1
    decision = until_decided(train, seeds, args.max_seeds, judged, args.max_accuracy_drop, args.metric, args.by)
    print(decision.report)
    print(decision.line())
    save(decision, prefix.with_name(prefix.name + "-decision.json"))
    return 0 if decision.verdict == "PASS" else 1
