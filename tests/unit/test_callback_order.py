"""Callbacks declare their order (`after`, `before`), resolved once by CallbackList; wings add their
callbacks through one registration point (ecotrain/assembly/wings.py), and assemble imports no wing's code."""

import ast
from pathlib import Path

import pytest

from ecotrain import fit
from ecotrain.assembly import wings
from ecotrain.callbacks.base import Callback, CallbackList, ordered
from ecotrain.base.errors import ConfigError

SRC = Path(__file__).resolve().parents[2] / "src" / "ecotrain"


def _named(name, after=(), before=()):
    return type(name, (Callback,), {"after": after, "before": before})()


def _names(cbs):
    return [type(cb).__name__ for cb in cbs]


def test_declarations_pull_a_callback_forward_and_leave_the_rest_in_the_order_given():
    a, logger, user, ledger, saver, timing, tracker = (
        _named("A"), _named("Logger"), _named("User"), _named("Ledger", before=("Logger",)),
        _named("Saver", after=("*",)), _named("Timing", after=("Saver",)), _named("Tracker"))
    got = _names(ordered([a, logger, user, saver, ledger, timing, tracker]))
    assert got == ["A", "Ledger", "Logger", "User", "Tracker", "Saver", "Timing"]


def test_a_circle_of_declarations_is_one_line_naming_it():
    with pytest.raises(ConfigError, match=r"^callbacks: their declared order is a circle \(.*X.*Y.*\)"):
        CallbackList([_named("X", after=("Y",)), _named("Y", after=("X",))])


def test_a_run_orders_core_and_wing_callbacks_by_their_declarations(tiny_cfg, tmp_path):
    from ecotrain.assembly.assemble import RunOptions, UserParts, assemble
    from ecotrain.core.distributed import Dist
    from ecotrain.core.preemption import Preemption

    cfg = tiny_cfg(**{"loop.max_steps": 2, "ledger.enabled": True, "ledger.energy": "off"})
    user = _named("UsersOwn")
    run = assemble(cfg, Dist(), "cpu", UserParts(callbacks=[user]), RunOptions(run_dir=tmp_path / "r", quiet=True),
                   Preemption(), wings.WINGS)
    order = _names(run.cbs.callbacks)
    assert order[:2] == ["DivergenceGuard", "BestTracker"]
    assert order.index("ContentionWatch") < order.index("Ledger") < order.index("MetricsLogger")
    assert order.index("UsersOwn") < order.index("Checkpointer") == len(order) - 1
    assert not (tmp_path / "r").exists()  # assembling writes nothing


def test_a_registered_wing_adds_its_callbacks_to_every_run(tiny_cfg, tmp_path):
    seen = []

    class Probe(Callback):
        def on_step_end(self, state):
            seen.append(state.step)

    def user_wing(ctx):  # a program's own wing, registered like the built-in ones
        assert ctx.is_main and type(ctx.checkpointer).__name__ == "Checkpointer"
        return [Probe()]

    wings.register(user_wing)
    try:
        r = fit(tiny_cfg(**{"loop.max_steps": 3, "ledger.enabled": True, "ledger.energy": "off"}),
                run_dir=tmp_path / "run", quiet=True)
    finally:
        wings.WINGS.remove(user_wing)
    assert seen == [1, 2, 3]
    assert (r.run_dir / "ledger.json").is_file()  # the ledger wing wrote its own file (on_finished)


def test_assemble_and_the_core_import_no_accounting_carbon_or_contention_code():
    tree = ast.parse((SRC / "assembly" / "assemble.py").read_text())
    names = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)] + \
            [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in names if m and (m.startswith("ecotrain.accounting") or m.startswith("ecotrain.tracking"))]
