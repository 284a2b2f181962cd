"""A registered version's model, rebuilt: its architecture (structural methods applied), its weights
or its base's plus an adapter, and its lineage (used by `update`, `serve` and the registry commands)."""

from __future__ import annotations

from dataclasses import dataclass

from ecotrain.checkpoint.snapshot import load_model_weights
from ecotrain.config import build_config
from ecotrain.continual.registry import Registry
from ecotrain.base.errors import EcotrainError, PreemptedError
from ecotrain.methods import build_methods
from ecotrain.methods.adapters import load_adapter, merge
from ecotrain.models import build_model

LOAD_ONLY_SKIP = ("replay", "ewc", "lwf", "adapters")  # training-time methods: not rebuilt to load a model


@dataclass
class Outcome:
    """What `update` and `versions add` made: the version, whether it serves, why."""

    version: str
    promoted: bool
    reason: str
    meta: dict
    held: bool = False  # passed its gate and kept a candidate for the canary (`update --hold`)


def build_bare(meta: dict):
    """The version's model architecture (its structural methods applied, not the training-time ones)."""
    tree = dict(meta["config"])
    tree["methods"] = [m for m in tree.get("methods", []) if m.get("name") not in LOAD_ONLY_SKIP]
    cfg = build_config(tree, "version config")
    model = build_model(cfg.model, tuple(meta["input_shape"]), meta["num_classes"])
    methods = build_methods(cfg)
    return methods.transform(model) if methods.transforms else model


def load_version_model(reg: Registry, name: str, merged: bool = True):
    """A version's model in eval mode: full weights, or its base's model plus its adapter."""
    meta = reg.read_meta(name)
    if meta.get("weights") == "adapter":
        model = load_adapter(load_version_model(reg, meta["parent"]), reg.path(name) / "adapter")
        return (merge(model) if merged else model).eval()
    model = build_bare(meta)
    load_model_weights(model, reg.weights(name), f"{reg.path(name)}")
    return model.eval()


def lineage(reg: Registry, name: str) -> list[dict]:
    """The metas of `name` and its ancestors, newest first."""
    out, seen = [], set()
    while name and name not in seen:
        seen.add(name)
        meta = reg.read_meta(name)
        out.append(meta)
        name = meta.get("parent")
    return out


def settler(reg: Registry, base: str, ok: bool, reason: str, verdict: dict, moved=None, hold: bool = False):
    """The registry's last step of an update, run under its lock (`Registry.commit`): a version that
    passed its gate becomes `current` only if nothing moved since it was gated; else it stays a
    candidate, with why. `moved(idx, name)`: another reason a passing version must wait (a cohort's
    versions changed), or None. `hold` (`update --hold`): a passing version stays a candidate for the
    canary (canary.py) to promote. `verdict` is updated in place: what the command reports."""

    def settle(idx: dict, name: str) -> None:
        why = moved(idx, name) if ok and moved is not None else None
        if ok and why is None and hold:
            why = (f"candidate: passed the gate, held for the canary (--hold): `ecotrain canary {name} REQUESTS.npz`, "
                   f"or `ecotrain promote {name}` ({reason})")
            verdict.update(held=True)
        if ok and why is None and idx["current"] == base:
            reg.make_current(idx, name, reason)
        elif ok:
            why = why or (f"candidate: passed the gate against {base}, but `current` moved to {idx['current']} "
                          f"meanwhile; promote it with `ecotrain promote {name}` if wanted ({reason})")
            verdict.update(ok=False, reason=why)
            reg.set_status(idx, name, "candidate", why)
        else:
            reg.set_status(idx, name, "rejected", reason)

    return settle


def check_trained(summary: dict) -> None:
    """An update's training ended as it should, or one line saying that nothing was registered."""
    stopped = summary.get("stopped_because")
    if stopped == "preempted":
        raise PreemptedError("update: stopped by a signal during training; nothing was registered, run the update again")
    if stopped == "diverged":
        raise EcotrainError("update: training diverged (non-finite loss); nothing was registered; try a lower optim.lr")
