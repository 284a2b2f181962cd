"""ecotrain's import graph, read from the source (ast), function-level imports included: the floors
of docs/architecture.md, the arrows that point back down-to-up, the circles, and a few sizes.

    python tools/imports.py          prints the figures; exit 1 when a core module imports a wing or
                                     a circle exists (tests/unit/test_layers.py asserts the same)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "ecotrain"

# The floors, bottom up (docs/architecture.md). A module belongs to the group of its longest prefix.
CORE = ("errors", "log", "version", "units", "filelock", "batch", "task", "loop", "state", "objective", "precision",
        "checkpoint", "data", "metrics", "callbacks", "config", "rundir", "memory.levers", "memory.selective",
        "memory.offload", "memory.chunked_loss", "memory.optim_offload", "distributed", "optim", "safeload", "tensorfile",
        "seeding", "device", "models", "threads", "environment", "stallwatch", "preemption", "resume", "stats",
        "progress_work", "stepplan", "userpath", "jsonfile", "startup")
WINGS = ("accounting", "green", "memory", "continual", "speech", "report", "tracking", "lrfind", "sweep",
         "inference", "cli", "export")


def _prefix(rel: str, g: str) -> bool:
    return rel == g or rel.startswith(g + ".") or rel.startswith(g + "_")


def _in(module: str, group) -> bool:
    """The longest prefix decides: `memory.levers` is core, the rest of `memory` a wing."""
    rel = module.removeprefix("ecotrain.")
    best = max((g for g in CORE + WINGS if _prefix(rel, g)), key=len, default=None)
    return best is not None and best in group


def modules(src: Path = SRC) -> dict[str, Path]:
    out = {}
    for p in sorted(src.rglob("*.py")):
        name = ".".join(("ecotrain",) + p.relative_to(src).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def graph(src: Path = SRC) -> tuple[dict[str, set], dict[str, list]]:
    """(module -> ecotrain modules it imports anywhere, module -> those imported inside functions)."""
    mods = modules(src)
    edges, inner = {}, {}
    for name, p in mods.items():
        pkg = name if p.name == "__init__.py" else name.rsplit(".", 1)[0]
        found, lazy = set(), []
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = pkg.split(".")[:len(pkg.split(".")) - node.level + 1] if node.level else []
                mod = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module or ""
                targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else mod for a in node.names]
            else:
                continue
            targets = [t for t in targets if t in mods and t != name]
            found.update(targets)
            if node.col_offset:
                lazy += targets
        edges[name], inner[name] = found, lazy
    return edges, inner


def circles(edges: dict[str, set]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in edges:
        if v not in index:
            visit(v)
    return out


def core_to_wing(edges: dict[str, set]) -> list[tuple[str, str]]:
    return sorted((m, t) for m, ts in edges.items() if _in(m, CORE) for t in ts if _in(t, WINGS))


def main() -> int:
    edges, inner = graph()
    circ, back = circles(edges), core_to_wing(edges)
    sizes = {m: len(p.read_text().splitlines()) for m, p in modules().items()}
    biggest = max(sizes, key=sizes.get)
    own_lazy = sum(len(v) for v in inner.values())
    print(f"modules {len(edges)}; circles {len(circ)}; core -> wing arrows {len(back)}; "
          f"function-level imports of ecotrain modules {own_lazy}; largest module {biggest} ({sizes[biggest]} lines)")
    for c in circ:
        print("  circle:", " -> ".join(c))
    for m, t in back:
        print(f"  core imports a wing: {m} -> {t}")
    print(f"RESULT circles={len(circ)} core_to_wing={len(back)} function_level_imports={own_lazy} "
          f"largest_module_lines={sizes[biggest]}")
    return 1 if circ or back else 0


if __name__ == "__main__":
    sys.exit(main())
