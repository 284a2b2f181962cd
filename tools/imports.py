"""ecotrain's import graph, read from the source (ast), function-level imports included: every floor
of docs/architecture.md, the arrows that point up a floor, the circles, imports of private names
across modules, and a few sizes.

    python tools/imports.py          prints the figures; exit 1 on a circle, a core module importing a
                                     wing, a floor arrow or private import not in KNOWN below, a module
                                     of no floor, or two folders that import each other
                                     (tests/unit/test_layers.py asserts the same)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "ecotrain"

# The floors of docs/architecture.md, bottom up: each folder of src/ecotrain is on one floor, every module
# in it with it (no prefix of a folder's modules sits on another). A module may import its own floor and
# the floors below it, never one above; and no two folders import each other (`folder_pairs`).
FLOORS = {
    0: ("base",),  # base/: errors, logging, files (the one reader, the atomic writer), names, paths, statistics
    1: ("core", "checkpoint", "data", "callbacks", "config", "models"),  # the engine and its packages
    2: ("methods",),  # the Method protocol's plug-ins
    3: ("accounting", "green", "memory", "continual", "speech", "report", "tracking", "seeds", "export"),  # wings
    4: ("assembly",),  # assembly/: each command's work as a function (fit, update, green, speech-feedback, ...)
    5: ("cli", "__main__"),  # cli/: the parser, the command registry, each command's parser and handler
}
FOLDERS = {"base": 0, "core": 1, "assembly": 4}  # a folder that shows a floor holds no other floor's module
NAMES = {0: "base", 1: "core", 2: "methods", 3: "wings", 4: "assembly", 5: "programs"}
CORE = FLOORS[0] + FLOORS[1]  # the check test_layers.py has always made: the core imports no wing (or above)
WINGS = FLOORS[3] + FLOORS[4] + FLOORS[5]  # the wings and the floors above them

# Breaches found when the check was written (issue 53), each in a module another change owns: printed
# and counted, but only a breach not listed here fails. Remove a line when its breach is fixed.
KNOWN: set = set()  # none left: the wings that train were placed on the assembly floor (each is a command's
# work as a function, called by its command alone); green.plan is handed `fit` by green's command


def _prefix(rel: str, g: str) -> bool:
    return rel == g or rel.startswith(g + ".") or rel.startswith(g + "_")


def floor(module: str):
    """The floor of `module` (its longest prefix in FLOORS); None for the package's own `__init__`."""
    rel = module.removeprefix("ecotrain.")
    found = [(len(g), f) for f, gs in FLOORS.items() for g in gs if _prefix(rel, g)]
    return max(found)[1] if found else None


def _in(module: str, group) -> bool:
    """The module's folder decides (its longest prefix in FLOORS)."""
    rel = module.removeprefix("ecotrain.")
    best = max((g for gs in FLOORS.values() for g in gs if _prefix(rel, g)), key=len, default=None)
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


def type_only(src: Path = SRC) -> set[tuple[str, str]]:
    """(importer, imported) arrows made only under `if TYPE_CHECKING:` (state.py's Methods): names for a
    type checker, never imported when the program runs."""
    mods = modules(src)
    out = set()
    for name, p in mods.items():
        tree = ast.parse(p.read_text())
        guarded = [n for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)]
        inside = {id(x) for g in guarded for x in ast.walk(g)}
        pkg = name if p.name == "__init__.py" else name.rsplit(".", 1)[0]
        seen, typed = set(), set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = pkg.split(".")[:len(pkg.split(".")) - node.level + 1] if node.level else []
                mod = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module or ""
                targets = {f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else mod for a in node.names}
            elif isinstance(node, ast.Import):
                targets = {a.name for a in node.names}
            else:
                continue
            (typed if id(node) in inside else seen).update(t for t in targets if t in mods)
        out |= {(name, t) for t in typed - seen}
    return out


def misplaced(src: Path = SRC) -> list[tuple[str, int, int]]:
    """(module, its floor, its folder's floor) for each module inside base/, core/ or assembly/ whose
    floor in FLOORS is another (say `core.x` listed as a wing): a folder shows one floor."""
    out = []
    for name in modules(src):
        top = name.removeprefix("ecotrain.").split(".")[0]
        if top in FOLDERS and name != "ecotrain" and floor(name) != FOLDERS[top]:
            out.append((name, floor(name), FOLDERS[top]))
    return sorted(out)


def floor_violations(edges: dict[str, set], typed: set = frozenset()) -> list[tuple[str, str]]:
    """Every arrow from a module up to a higher floor (core -> wing among them); `typed`: arrows a type
    checker alone follows (`type_only`), left out."""
    out = []
    for m, ts in edges.items():
        fm = floor(m)
        out += [(m, t) for t in ts if fm is not None and floor(t) is not None and floor(t) > fm and (m, t) not in typed]
    return sorted(out)


def folder_of(module: str) -> str:
    """The folder a module sits in under src/ecotrain ("" for the package's own __init__ and __main__)."""
    parts = module.removeprefix("ecotrain").lstrip(".").split(".")
    return parts[0] if len(parts) > 1 else ""


def folder_pairs(edges: dict[str, set], typed: set = frozenset()) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """{(folder a, folder b): the arrows both ways} for each two folders that import each other (module
    level or inside functions; `typed` arrows, a type checker's alone, left out): the folders are the
    floors only when no two of them lean on each other."""
    one_way: dict[tuple[str, str], list] = {}
    for m, ts in edges.items():
        for t in ts:
            a, b = folder_of(m), folder_of(t)
            if a and b and a != b and (m, t) not in typed:
                one_way.setdefault((a, b), []).append((m, t))
    return {(a, b): sorted(one_way[(a, b)] + one_way[(b, a)]) for (a, b) in one_way
            if a < b and (b, a) in one_way}


def private_imports(src: Path = SRC) -> list[tuple[str, str]]:
    """(importer, `module._name`) for each `from ecotrain.module import _name` in another module: a
    name its module keeps to itself, reached from outside."""
    mods = modules(src)
    out = []
    for name, p in mods.items():
        pkg = name if p.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(p.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod not in mods or mod == name:
                continue
            out += [(name, f"{mod}.{a.name}") for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    return sorted(out)


def main() -> int:
    edges, inner = graph()
    circ, back, up, private = circles(edges), core_to_wing(edges), floor_violations(edges, type_only()), private_imports()
    sizes = {m: len(p.read_text().splitlines()) for m, p in modules().items()}
    biggest = max(sizes, key=sizes.get)
    own_lazy = sum(len(v) for v in inner.values())
    unplaced = sorted(m for m in edges if floor(m) is None and m != "ecotrain")
    wrong = misplaced()
    print(f"modules {len(edges)}; circles {len(circ)}; core -> wing arrows {len(back)}; arrows up a floor {len(up)}; "
          f"private names imported across modules {len(private)}; function-level imports of ecotrain modules "
          f"{own_lazy}; largest module {biggest} ({sizes[biggest]} lines)")
    for c in circ:
        print("  circle:", " -> ".join(c))
    for m, t in up:
        print(f"  {NAMES[floor(m)]} imports {NAMES[floor(t)]}: {m} -> {t}{'  (known)' if (m, t) in KNOWN else ''}")
    for m, t in private:
        print(f"  private name: {m} imports {t}{'  (known)' if (m, t) in KNOWN else ''}")
    for m in unplaced:
        print(f"  no floor: {m} (add it to FLOORS and to docs/architecture.md)")
    for m, f, folder in wrong:
        print(f"  misplaced: {m} is {NAMES[f] if f is not None else 'unplaced'} in a folder of the {NAMES[folder]} "
              f"floor (move it to its floor's folder)")
    pairs = folder_pairs(edges, type_only())
    for (a, b), arrows in sorted(pairs.items()):
        print(f"  folders importing each other: {a}/ <-> {b}/: " + ", ".join(f"{m} -> {t}" for m, t in arrows[:4])
              + (f" (+{len(arrows) - 4})" if len(arrows) > 4 else ""))
    new = [x for x in up + private if x not in KNOWN]
    print(f"RESULT circles={len(circ)} floor_violations={len(up)} private_imports={len(private)} "
          f"core_to_wing={len(back)} two_way_folders={len(pairs)} new_breaches={len(new)} unplaced={len(unplaced)} misplaced={len(wrong)} "
          f"function_level_imports={own_lazy} largest_module_lines={sizes[biggest]}")
    return 1 if circ or back or new or unplaced or wrong or pairs else 0


if __name__ == "__main__":
    sys.exit(main())
