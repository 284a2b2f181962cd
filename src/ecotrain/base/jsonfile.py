"""Reading back the JSON files ecotrain wrote: a run's summary.json and ledger.json, a registry's
index.json and version meta.json, the runs a green search reads. One checker for all of them, so a
damaged or hand-edited file is one line naming the file and the field, never a KeyError or a
TypeError deep in a command.

`fields` maps a dotted path to the kinds its value may be: `{"energy": dict, "co2e.kg": (float, None),
"history.*.current": (str, None)}`. `*` is every item of a list or every value of an object; a
trailing `?` lets the path be absent (any key on it). `float` is any number (bool is not), `None` is null.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator, Mapping, Union

from ecotrain.base import safefile
from ecotrain.base.errors import ConfigError

Kinds = Union[type, None, tuple]
RUN_FIX = "restore it, or run the training again"  # what to do about a run's own damaged file
LIMIT = 16 * safefile.MiB  # far above any file ecotrain writes (a summary is KiBs); a bigger one is not ours

_NAMES = {dict: "an object", list: "a list", str: "text", int: "a whole number", float: "a number",
          bool: "true or false", None: "null"}


def read_json(path, what: str, fields: Mapping[str, Kinds] | None = None, fix: str = RUN_FIX,
              error: type = ConfigError) -> dict:
    """The JSON object in `path` (`what` it is: "run summary", "registry index"), each of `fields`
    checked; otherwise one `error` naming the file, the field and `fix` (what to do)."""
    path = Path(path)
    try:  # a FIFO, a device, a folder or a file above LIMIT: one line from safefile, never a wait
        obj = safefile.read_json(path, what, LIMIT, fix=fix, error=error)
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise error(f"{path}: not readable JSON ({getattr(exc, 'strerror', None) or exc}); {fix}") from None
    if not isinstance(obj, dict):
        raise error(f"{path}: not a JSON object, so not an ecotrain {what}; {fix}")
    check_fields(obj, fields or {}, path, what, fix, error)
    return obj


def check_fields(obj: dict, fields: Mapping[str, Kinds], path, what: str, fix: str = RUN_FIX,
                 error: type = ConfigError) -> None:
    """`read_json`'s check of an object already read (a file's part, or one read another way)."""
    for spec, kinds in fields.items():
        optional, parts = spec.endswith("?"), spec.rstrip("?").split(".")
        allowed = kinds if isinstance(kinds, tuple) else (kinds,)
        for name, value in _lookup(obj, parts, "", optional, path, what, fix, error):
            if not any(_is(value, k) for k in allowed):
                said = " or ".join(_NAMES.get(k, getattr(k, "__name__", str(k))) for k in allowed)
                raise error(f"{path}: the {what}'s '{name}' is {json.dumps(value)[:40]}, not {said}; {fix}")


def _lookup(node, parts: list[str], name: str, optional: bool, path, what, fix, error) -> Iterator[tuple]:
    """(dotted name, value) of each value `parts` reaches; a missing key raises, unless `optional`."""
    if not parts:
        yield name, node
        return
    head, rest = parts[0], parts[1:]
    if head == "*":
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            yield from _lookup(value, rest, f"{name}.{key}" if name else str(key), optional, path, what, fix, error)
        return
    here = f"{name}.{head}" if name else head
    if not isinstance(node, dict):
        raise error(f"{path}: the {what}'s '{name}' is {json.dumps(node)[:40]}, not an object; {fix}")
    if head not in node:
        if optional:
            return
        raise error(f"{path}: the {what} has no '{here}' field; {fix}")
    yield from _lookup(node[head], rest, here, optional, path, what, fix, error)


def _is(value, kind) -> bool:
    if kind is None:
        return value is None
    if kind is bool or isinstance(value, bool):
        return kind is bool and isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float))
    return isinstance(value, kind)
