"""Seeds: `ecotrain fit RECIPE --seeds 0,1,2` trains one run per seed in sibling folders and writes
one group file naming them; `ecotrain compare` and `ecotrain report` take that file for a side.

With `--run-dir D` the runs are `D-s0`, `D-s1`, ... and the group file is `D-group.json`; without,
D is `runs/<name>-<timestamp>`. The group file is written before the first run and after each one,
so an interrupted group still names its runs (`--resume auto` continues each of them).
No torch here: compare imports this module to read group files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from ecotrain.base import safefile
from ecotrain.base.errors import ConfigError
from ecotrain.base.groupfile import group_paths, write_group
from ecotrain.base.log import log
from ecotrain.base.rundir import default_run_dir, file_in_the_way, holds_run
from ecotrain.base.runfiles import CONFIG, RunFiles

MAX_SEEDS = 1000  # runs in one `--seeds` group
SEED_LIMIT = 2**32  # the config's `seed` (config/__init__.py): what numpy and every sampler accept


def parse_seeds(text: str) -> list[int]:
    """`"0,1,2"` or `"0-4"` (inclusive) -> distinct non-negative seeds, in order."""
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        try:
            if "-" in part.lstrip("-"):
                lo, hi = (int(v) for v in part.split("-"))
                if hi < lo:
                    raise ValueError
                if hi - lo + 1 + len(seeds) > MAX_SEEDS:  # checked before the range is made
                    raise ConfigError(f"--seeds {text!r}: {hi - lo + 1 + len(seeds):,} seeds; at most {MAX_SEEDS} "
                                      "runs in one group")
                seeds += range(lo, hi + 1)
            else:
                seeds.append(int(part))
        except ValueError:
            raise ConfigError(f"--seeds {text!r}: expected seeds like 0,1,2 or 0-4 (non-negative integers)") from None
    if len(seeds) > MAX_SEEDS:
        raise ConfigError(f"--seeds {text!r}: {len(seeds):,} seeds; at most {MAX_SEEDS} runs in one group")
    if not seeds or any(s < 0 for s in seeds):
        raise ConfigError(f"--seeds {text!r}: expected seeds like 0,1,2 or 0-4 (non-negative integers)")
    if any(s >= SEED_LIMIT for s in seeds):  # checked before any run: a run's config refuses it later, mid-group
        raise ConfigError(f"--seeds {text!r}: {max(seeds):,} is not a seed; seeds are below 2**32 "
                          f"({SEED_LIMIT:,}), as the config's `seed`")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds {text!r}: a seed is repeated; each seed trains once")
    return seeds


def _finished_before(group: Path, runs: list[Path]) -> list[Path]:
    """The runs an earlier try of this group finished (its group file says so and summary.json is there)."""
    try:
        data = json.loads(safefile.read_bytes(group, "group file", 64 * safefile.MiB))
        done = set(data.get("finished") or ()) if isinstance(data, dict) else set()
    except (ValueError, OSError, RecursionError, ConfigError):
        return []
    return [r for r in runs if (r.name in done or str(r.resolve()) in done) and RunFiles(r).summary.is_file()]


def _same_config(run_dir: Path, recipe: str, overrides: list[str]) -> None:
    """A finished run kept by `--resume auto` must be the run asked for now, not an older recipe's."""
    import yaml

    from ecotrain.config import diff_configs, load_config  # pydantic: compare reads group files via this module

    want = load_config(recipe, overrides).to_dict()
    try:
        have = yaml.safe_load(safefile.read_text(RunFiles(run_dir).config, "run config", 16 * safefile.MiB))
    except (OSError, yaml.YAMLError, ConfigError, RecursionError):
        have = None
    changed = diff_configs(have, want) if isinstance(have, dict) else [f"{CONFIG} unreadable"]
    if changed:
        raise ConfigError(f"{run_dir}: finished with another config ({'; '.join(changed[:3])}); "
                          "pass --overwrite to retrain the group")


def fit_seeds(recipe, overrides: list, seeds_text: str, run_dir, name: str, *, resume=None, overwrite: bool = False,
              fit_one: Callable, say_kept: bool = True) -> int:
    """`ecotrain fit RECIPE --seeds ...`: `fit_one(overrides, run_dir)` (entry.fit_recipe with the
    command's options) once per seed, each with its own run folder and `seed=N`, keeping the group
    file current. Stops at the first run that does not end normally (preempted, diverged) and returns
    its exit code; `resume="auto"` then continues the group."""
    seeds = parse_seeds(seeds_text)
    overrides = list(overrides)
    if any(o.split("=", 1)[0].strip() == "seed" for o in overrides):
        raise ConfigError("--seeds sets each run's seed; drop the seed=... override")
    if resume not in (None, "auto"):
        raise ConfigError("--seeds: --resume takes only `auto` here (each seed's folder continues from its own "
                          "newest checkpoint)")
    if resume == "auto" and not run_dir:
        raise ConfigError("--resume auto: needs --run-dir (the prefix the group's folders share)")
    prefix = Path(run_dir) if run_dir else default_run_dir(name)
    group, runs = group_paths(prefix, seeds)
    if group.exists() and not group.is_file():
        raise ConfigError(f"{group}: exists and is not a file; choose another --run-dir")
    blocked = file_in_the_way(group)
    if blocked is not None:
        raise ConfigError(f"--run-dir {prefix}: {blocked} is a file, not a folder; choose another --run-dir")
    if not resume and not overwrite:  # refused now, not after the first seeds have trained
        for one in runs:
            if holds_run(one):
                raise ConfigError(f"{one}: already holds a run; continue the group with `--resume auto`, "
                                  "choose a fresh --run-dir, or pass --overwrite to replace it")
    group.parent.mkdir(parents=True, exist_ok=True)
    finished = _finished_before(group, runs) if resume else []
    for seed, one in zip(seeds, runs):
        if one in finished:
            _same_config(one, recipe, [*overrides, f"seed={seed}"])
    write_group(group, name, recipe, overrides, seeds, runs, finished)
    for seed, one in zip(seeds, runs):
        if one in finished:
            if say_kept:  # fit --baseline calls again per seed it adds: the kept runs are not news there
                log.info(f"seed {seed}: {one} finished before; kept")
            continue
        log.info(f"seed {seed}: {one}")
        code = fit_one([*overrides, f"seed={seed}"], str(one))
        if code != 0:
            print(f"group stopped at seed {seed}; {group} names every run (continue with --resume auto)")
            return code
        finished.append(one)
        write_group(group, name, recipe, overrides, seeds, runs, finished)
    print(f"group: {group} ({len(runs)} runs; compare with `ecotrain compare BASELINE-group.json {group}`)")
    return 0
