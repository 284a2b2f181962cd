"""The Method protocol: how a training method (EMA, distillation, pruning, BN policies, replay,
EWC, LoRA, ...) plugs into a run without growing the trainer.

Every hook is optional; each is called from one visible line:

| hook | called from | when |
|---|---|---|
| `transform(model) -> model` | `assemble.make_model` | after the model is built (and `--init-from` loaded), before the optimizer and the DDP/FSDP wrap; on fresh and resumed runs alike, so a resume restores the changed keys |
| `param_groups(model) -> list[dict] or None` | `assemble.assemble` → `optim.build_optimizer` | freezing and per-group LRs; None: the default groups |
| `prepare_batch(batch, state) -> batch` | `objective.Objective.prepare`, one line in `loop.train_step` | the whole effective batch, before the micro-batches (selective backprop, progressive resizing) |
| `loss_terms(batch, outputs, state) -> {name: tensor}` | `objective.Objective` | every micro-batch; each term a mean over the micro-batch's units, like the task loss; a `task_weight` attribute scales the task loss |
| `data(source, sampler) -> (source, sampler)` | `assemble.make_sampler` | mixing, ordering, selection; the order must stay a function of (seed, epoch) |
| `train_mode(model)` | `loop.set_train_mode` | after every `model.train()` (a BatchNorm freeze survives it) |
| `eval_model(model) -> model` | `loop.evaluate_split` | the module whose weights are evaluated, kept as best and saved (EMA: the average) |
| `finalize(model, data)` | `finish.finish` | once, before the test and the saved weights (precise BN, pruning made permanent) |
| `export(model) -> {name: tensor} or None` | `finish.finish` | tensors for export.safetensors beside the full weights (replay's buffer, EWC's Fisher, QAT's int8 weights) |
| `state_dict()` / `load_state_dict(sd)` | the checkpoint | keyed by the method's stable `key`, never by list position |

A batch is whatever the data gives (batch.py); a method that reads `(x, y)` tensors says so with
`needs = ("xy",)`, and a run whose task or batches differ is refused in one line before it trains
(likewise "init": a run started from no weights; "val": data without a validation split).

A method that needs per-step work (EMA's update) also overrides `Callback` hooks; `Methods.callbacks`
puts it in the callback list, so it is called from the loop's own visible `cbs.on_step_end(state)`.

Every built-in method is built as `Class(entry, run, trained)`: its own config section, the run's whole
Config (None where it needs none) and a `TrainedRuns` (methods/__init__.py `build_methods`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn

from ecotrain.callbacks.base import HOOKS, Callback
from ecotrain.base.errors import CheckpointError, ConfigError

METHOD_HOOKS = ("transform", "param_groups", "prepare_batch", "loss_terms", "data", "train_mode", "eval_model", "finalize", "export")


@dataclass(frozen=True)
class TrainedRuns:
    """How a method reads another trained run (curriculum's reference, distill's teacher), handed in by
    whoever builds a run: the methods package sits below inference and the accounting wing, so it
    imports neither. None: that method refuses (or notes) what it cannot read."""

    load_trained: Optional[Callable] = None  # inference.load_trained(path, device): the run's model
    read_ledger: Optional[Callable] = None  # accounting.read_ledger(run): its ledger.json


class Method(Callback):
    """Override only the hooks you need. `key` names the method's state in checkpoints."""

    key: str = ""
    # ("xy",): works on (x, y) tensor batches of a classification-like task only; "init": a new run must
    # start from weights (init_from); "val": the data must have a validation split (assemble.check_methods_fit)
    needs: tuple = ()
    state_in_methods = True  # its state rides under the checkpoint's "methods", not "callbacks"

    def transform(self, model: nn.Module) -> nn.Module:
        return model

    def param_groups(self, model: nn.Module) -> Optional[list[dict]]:
        return None

    def prepare_batch(self, batch, state):
        return batch

    def loss_terms(self, batch, outputs, state) -> dict[str, torch.Tensor]:
        return {}

    def data(self, source, sampler):
        return source, sampler

    def train_mode(self, model: nn.Module) -> None: ...

    def eval_model(self, model: nn.Module) -> nn.Module:
        return model

    def finalize(self, model: nn.Module, data) -> None: ...

    def export(self, model: nn.Module) -> Optional[dict[str, torch.Tensor]]:
        return None

    def summary(self) -> dict:
        """Figures for summary.json's `methods.<key>` section."""
        return {}


def overrides(obj, hook: str, base=Method) -> bool:
    return getattr(type(obj), hook, None) is not getattr(base, hook, None)


class Methods:
    """The run's methods, in config order. Each hook runs only on the methods that override it, so
    an empty `methods:` list costs nothing (the same dispatch as CallbackList)."""

    def __init__(self, methods: list[Method]):
        self.methods = list(methods)
        keys = [m.key for m in self.methods]
        dup = sorted({k for k in keys if keys.count(k) > 1})
        if dup:
            raise ConfigError(f"methods: '{dup[0]}' is listed twice; give each method once")
        self._users = {h: [m for m in self.methods if overrides(m, h)] for h in METHOD_HOOKS}
        self.has_loss_terms = bool(self._users["loss_terms"])
        self.batch_methods = self._users["prepare_batch"]  # the Objective runs them on the effective batch
        self.transforms = bool(self._users["transform"])

    def __bool__(self) -> bool:
        return bool(self.methods)

    def transform(self, model):
        for m in self._users["transform"]:
            model = m.transform(model)
        return model

    def param_groups(self, model) -> Optional[list[dict]]:
        users = self._users["param_groups"]
        if len(users) > 1:
            raise ConfigError(f"methods: {users[0].key} and {users[1].key} both set parameter groups; keep one")
        return users[0].param_groups(model) if users else None

    def loss_terms(self, batch, outputs, state) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for m in self._users["loss_terms"]:
            out.update(m.loss_terms(batch, outputs, state))
        return out

    def data(self, source, sampler):
        for m in self._users["data"]:
            source, sampler = m.data(source, sampler)
        return source, sampler

    def train_mode(self, model) -> None:
        for m in self._users["train_mode"]:
            m.train_mode(model)

    def eval_model(self, model):
        for m in self._users["eval_model"]:
            model = m.eval_model(model)
        return model

    def finalize(self, model, data) -> None:
        for m in self._users["finalize"]:
            m.finalize(model, data)

    def export(self, model) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for m in self._users["export"]:
            out.update({f"{m.key}/{k}": v for k, v in (m.export(model) or {}).items()})
        return out

    def callbacks(self) -> list[Callback]:
        """The methods that also act on loop events (they override a Callback hook)."""
        return [m for m in self.methods if any(overrides(m, h, Callback) for h in HOOKS)]

    def summary(self) -> dict:
        return {m.key: s for m in self.methods if (s := m.summary())}

    def state_dict(self) -> dict:
        return {m.key: m.state_dict() for m in self.methods}

    def load_state_dict(self, sd: dict, where) -> None:
        for m in self.methods:
            if m.key not in sd:
                raise CheckpointError(f"{where}: the checkpoint holds no state for method '{m.key}' "
                                      f"(saved methods: {sorted(sd) or 'none'}); resume with the methods it was saved with")
            m.load_state_dict(sd[m.key])
