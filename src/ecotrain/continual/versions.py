"""A registered version's model, rebuilt: its architecture (structural methods applied), its weights
or its base's plus an adapter, and its lineage (used by `update`, `serve` and the registry commands)."""

from __future__ import annotations

from dataclasses import dataclass

from ecotrain.checkpoint.snapshot import load_model_weights
from ecotrain.config import build_config
from ecotrain.continual.registry import Registry
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
