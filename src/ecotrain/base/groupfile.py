"""The group file of a seed group: `ecotrain fit RECIPE --seeds 0,1,2` writes `PREFIX-group.json` naming
its runs (seeds/sweep.py); `ecotrain compare`, `report`, `green` and `card` take it for a side. A run
file format like base/runfiles.py's: written atomically, read through the one reader. No torch here."""

from __future__ import annotations

import json
from pathlib import Path

from ecotrain.base import safefile
from ecotrain.base.errors import ConfigError
from ecotrain.base.rundir import write_json

GROUP_SCHEMA = 1
GROUP_SUFFIX = "-group.json"


def group_paths(prefix: Path, seeds: list[int]) -> tuple[Path, list[Path]]:
    """(the group file, the run folders) for the runs named `prefix`."""
    prefix = Path(prefix)
    return prefix.with_name(prefix.name + GROUP_SUFFIX), [prefix.with_name(f"{prefix.name}-s{s}") for s in seeds]


def write_group(path: Path, name: str, recipe: str, overrides: list[str], seeds: list[int], runs: list[Path],
                finished: list[Path]) -> None:
    # run folders are stored relative to the group file: siblings, so the set can be moved as one
    rel = [r.name if r.parent.resolve() == path.parent.resolve() else str(r.resolve()) for r in runs]
    write_json(path, {"schema": GROUP_SCHEMA, "kind": "ecotrain.seed_group", "name": name, "recipe": recipe,
                      "overrides": overrides, "seeds": seeds, "runs": rel,
                      "finished": [x for r, x in zip(runs, rel) if r in finished]})


def is_group_file(item: str) -> bool:
    return item.endswith(".json") and Path(item).is_file()


def read_group(path: str | Path) -> list[str]:
    """The run folders a group file names (paths as given, resolved against the file's folder)."""
    path = Path(path)
    try:
        data = json.loads(safefile.read_bytes(path, "group file", 64 * safefile.MiB))  # a FIFO, a device: one line
    except (ValueError, OSError, RecursionError) as exc:
        raise ConfigError(f"{path}: not a readable group file ({getattr(exc, 'strerror', None) or exc})") from None
    if not isinstance(data, dict) or data.get("kind") != "ecotrain.seed_group":
        raise ConfigError(f"{path}: not an ecotrain group file (written by `ecotrain fit RECIPE --seeds 0,1,2`)")
    runs = data.get("runs")
    if not isinstance(runs, list) or not runs or not all(isinstance(r, str) and r for r in runs):
        raise ConfigError(f"{path}: the group file lists no run folders under 'runs'")
    return [str(path.parent / r) for r in runs]
