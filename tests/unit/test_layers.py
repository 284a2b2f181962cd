"""The package's layering (docs/architecture.md): no core module imports a wing, and no import circle,
function-level imports included (tools/imports.py reads the graph from the source)."""

from pathlib import Path

from tools.imports import SRC, circles, core_to_wing, graph


def test_the_core_imports_no_wing_and_nothing_imports_in_a_circle():
    edges, _ = graph()
    assert core_to_wing(edges) == []
    assert circles(edges) == []


def test_the_check_fails_on_a_core_module_that_imports_a_wing(tmp_path):
    """The same check on a copy of the source with one such import added by hand, inside a function
    (where a reader would not see it): it is found, and so is the circle it closes."""
    import shutil

    copy = tmp_path / "ecotrain"
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("__pycache__"))
    loop = copy / "loop.py"
    loop.write_text(loop.read_text() + "\n\ndef _cost():\n    from ecotrain.lrfind import range_test\n"
                    "    return range_test\n")
    edges, inner = graph(Path(copy))
    assert ("ecotrain.loop", "ecotrain.lrfind") in core_to_wing(edges)
    assert "ecotrain.lrfind" in inner["ecotrain.loop"]
    assert any("ecotrain.loop" in c for c in circles(edges))
