"""WebDataset's brace patterns (`train-{000000..000199}.tar`, `{a,b}`, nested), parsed first and
counted before anything is expanded: a range of a billion names is refused in microseconds
instead of being built in memory (`count` is a product of range lengths and a sum of alternatives).
"""

from __future__ import annotations

import itertools
import re
from typing import Iterator, Union

from ecotrain.base.errors import DataError

Node = Union[str, tuple]  # text, ("range", lo, hi, width) or ("alt", [seq, seq, ...])
_RANGE = re.compile(r"(\d{1,18})\.\.(\d{1,18})")  # 18 digits: past any file count, within int parsing's limits
DEEPEST = 16  # braces nested deeper than this are a mistake (and would exhaust the parser's recursion)


def split_top(pattern: str) -> list[str]:
    """The comma-separated list outside braces, empty parts dropped; braces must balance."""
    parts, depth, deepest, cur = [], 0, 0, ""
    for c in pattern:
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += (c == "{") - (c == "}")
        deepest = max(deepest, depth)
        if depth < 0:
            break
        cur += c
    if depth != 0:
        raise DataError(f"data.name=shards:{pattern}: the braces do not pair up; write a range as "
                        "{000..199} or a choice as {a,b}")
    if deepest > DEEPEST:
        raise DataError(f"data.name=shards:{pattern}: braces nested {deepest} deep, at most {DEEPEST}; "
                        "write the pattern flatter or as a comma-separated list")
    return [p for p in [*parts, cur] if p]


def parse(part: str, pattern: str) -> list[Node]:
    """One part (balanced braces) as a sequence of nodes."""
    seq, pos = [], 0
    while pos < len(part):
        open_ = part.find("{", pos)
        if open_ < 0:
            seq.append(part[pos:])
            break
        if open_ > pos:
            seq.append(part[pos:open_])
        close, alts = _group(part, open_)
        body = part[open_ + 1:close]
        if len(alts) == 1 and ".." in body:
            m = _RANGE.fullmatch(body)
            if m is None:
                raise DataError(f"data.name=shards:{pattern}: a brace range is numbers of up to 18 digits, "
                                "e.g. {000..199}")
            seq.append(("range", int(m.group(1)), int(m.group(2)), len(m.group(1))))
        else:
            seq.append(("alt", [parse(a, pattern) for a in alts]))
        pos = close + 1
    return seq


def _group(part: str, open_: int) -> tuple[int, list[str]]:
    """The closing brace of the group opening at `open_`, and its alternatives (commas at its depth)."""
    depth, start, alts = 0, open_ + 1, []
    for i in range(open_, len(part)):
        c = part[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i, [*alts, part[start:i]]
        elif c == "," and depth == 1:
            alts.append(part[start:i])
            start = i + 1
    raise AssertionError("split_top checked the braces")


def count(seq: list[Node]) -> int:
    n = 1
    for node in seq:
        if isinstance(node, str):
            continue
        if node[0] == "range":
            n *= abs(node[2] - node[1]) + 1
        else:
            n *= sum(count(s) for s in node[1])
    return n


def expand(seq: list[Node]) -> Iterator[str]:
    """The names in order (a range counts down when its end is below its start, as in webdataset).
    Call it after `count` said how many: each node's names are listed, never more than that."""
    return ("".join(p) for p in itertools.product(*(_names(node) for node in seq)))


def _names(node: Node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if node[0] == "range":
        _, lo, hi, width = node
        step = 1 if hi >= lo else -1
        return [str(i).zfill(width) for i in range(lo, hi + step, step)]
    return [x for s in node[1] for x in expand(s)]
