"""The package's layering (docs/architecture.md): no core module imports a wing, and no import circle,
function-level imports included (tools/imports.py reads the graph from the source)."""

from pathlib import Path

from tools.imports import (KNOWN, SRC, circles, core_to_wing, floor_violations, folder_pairs, graph, misplaced,
                           private_imports, type_only)


def test_the_core_imports_no_wing_and_nothing_imports_in_a_circle():
    edges, _ = graph()
    assert core_to_wing(edges) == []
    assert circles(edges) == []


def test_every_documented_floor_holds_but_the_listed_breaches():
    """Every floor of docs/architecture.md, and no `from ecotrain.x import _name` across modules, but the
    breaches listed (each with its owner's fix) in tools/imports.py's KNOWN."""
    edges, _ = graph()
    assert [x for x in floor_violations(edges, type_only()) + private_imports() if x not in KNOWN] == []


def test_the_floor_check_catches_an_arrow_up_and_a_private_name(tmp_path):
    import shutil

    copy = tmp_path / "ecotrain"
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("__pycache__"))
    ema = copy / "methods" / "ema.py"  # methods (floor 2) may not import a wing (floor 3)
    ema.write_text(ema.read_text() + "\n\ndef _peek():\n    from ecotrain.accounting.ledger import Ledger\n"
                   "    from ecotrain.base.rundir import _HELD\n    return Ledger, _HELD\n")
    edges, _ = graph(Path(copy))
    assert ("ecotrain.methods.ema", "ecotrain.accounting.ledger") in floor_violations(edges, type_only(Path(copy)))
    assert ("ecotrain.methods.ema", "ecotrain.base.rundir._HELD") in private_imports(Path(copy))
    assert ("ecotrain.core.state", "ecotrain.methods.base") not in floor_violations(edges, type_only(Path(copy)))


def test_the_check_fails_on_a_core_module_that_imports_a_wing(tmp_path):
    """The same check on a copy of the source with one such import added by hand, inside a function
    (where a reader would not see it): it is found, and so is the circle it closes."""
    import shutil

    copy = tmp_path / "ecotrain"
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("__pycache__"))
    loop = copy / "core" / "loop.py"
    loop.write_text(loop.read_text() + "\n\ndef _cost():\n    from ecotrain.assembly.lrfind import range_test\n"
                    "    return range_test\n")
    edges, inner = graph(Path(copy))
    assert ("ecotrain.core.loop", "ecotrain.assembly.lrfind") in core_to_wing(edges)
    assert "ecotrain.assembly.lrfind" in inner["ecotrain.core.loop"]
    assert any("ecotrain.core.loop" in c for c in circles(edges))


def test_the_folders_that_show_a_floor_hold_that_floor_alone():
    assert misplaced() == []


def test_the_check_catches_a_module_in_the_wrong_folder(tmp_path, monkeypatch):
    """A wing module put into core/ on a copy of the source, and listed as a wing in FLOORS so that its
    arrow up passes: the floor check is silent, the folder check names it."""
    import shutil

    from tools import imports

    copy = tmp_path / "ecotrain"
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "core" / "peek.py").write_text("from ecotrain.accounting.ledger import Ledger\n\nPEEK = Ledger\n")
    monkeypatch.setitem(imports.FLOORS, 3, imports.FLOORS[3] + ("core.peek",))
    edges, _ = graph(Path(copy))
    assert [x for x in floor_violations(edges, type_only(Path(copy))) if x[0] == "ecotrain.core.peek"] == []
    assert misplaced(Path(copy)) == [("ecotrain.core.peek", 3, 1)]
    (copy / "core" / "peek.py").rename(copy / "accounting" / "peek.py")  # in a wing's folder it is placed
    monkeypatch.setitem(imports.FLOORS, 3, imports.FLOORS[3][:-1])
    assert misplaced(Path(copy)) == []


def test_the_documented_floor_picture_is_the_checked_one():
    """docs/architecture.md's floor picture names the same modules, floor by floor, as FLOORS."""
    import re

    from tools.imports import FLOORS

    text = (SRC.parents[1] / "docs" / "architecture.md").read_text()
    block = text.split("## Floors: who may import whom", 1)[1].split("```")[1]
    floors, current = {}, None
    for line in block.splitlines():
        head = re.match(r"\s+(\d)\s+\w+\s+(.*)", line)
        if head:
            current, line = int(head.group(1)), head.group(2)
        if current is not None:
            for item in re.split(r"[,;]", re.sub(r"\([^)]*\)", "", line)):
                name = item.strip().rstrip("/*").replace("/", ".")
                if name and name not in ("bench", "examples"):
                    floors.setdefault(current, set()).add(name)
    assert floors == {f: set(names) for f, names in FLOORS.items()}


def test_no_two_folders_import_each_other():
    edges, _ = graph()
    assert folder_pairs(edges, type_only()) == {}


def test_the_check_catches_two_folders_that_lean_on_each_other(tmp_path):
    """core/ importing data/ inside a function (data/ imports core/): the pair is named with its arrows;
    under `if TYPE_CHECKING:` the same import is a type only and not counted."""
    import shutil

    copy = tmp_path / "ecotrain"
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("__pycache__"))
    loop = copy / "core" / "loop.py"
    loop.write_text(loop.read_text() + "\n\ndef _peek():\n    from ecotrain.data.loader import Feed\n    return Feed\n")
    edges, _ = graph(Path(copy))
    pairs = folder_pairs(edges, type_only(Path(copy)))
    assert list(pairs) == [("core", "data")]
    assert ("ecotrain.core.loop", "ecotrain.data.loader") in pairs[("core", "data")]
