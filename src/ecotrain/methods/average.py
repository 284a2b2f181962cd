"""Weight averaging of the trained and the previous model (Vander Eeckt & Van hamme, weight
averaging of the old and the adapted ASR models): after training, the weights become

    alpha * trained + (1 - alpha) * previous

    methods:
      - name: average
        with: previous   # the weights the run was initialised from (init_from), or a run folder / .safetensors
        alpha: 0.5       # 1: the trained model, 0: the previous one; auto: the best of `grid` on the val split
        grid: [0, 0.25, 0.5, 0.75, 1.0]

It runs in `finalize` (finish.py: after the best weights are loaded, before the test and
model.safetensors), so the test figures and the saved model are the averaged one. `alpha: auto`
evaluates each candidate on the validation split only (docs/evaluation.md) by the run's
`early_stopping.monitor` (a val_* figure; else val_loss), the first best in grid order wins; the
choice and every candidate's figure land in summary.json's `methods.average`. `average_weights` is
the one averaging function: the registry's update flow and the speech bench call it directly.

When it helps: an update that must not forget what the deployed model knew, at no training cost.
Risks: averaging two models that are not related by fine-tuning (different inits) breaks both;
BatchNorm running statistics are averaged too (list `batchnorm` with policy recompute after
`average` for exact ones). Cost: a copy of the previous weights in memory and in each checkpoint
(`with: previous`); `alpha: auto` adds one validation pass per grid point.
"""

from __future__ import annotations

import logging
from typing import Mapping, Optional

import torch
from torch import nn

from ecotrain.core.loop import evaluate_split
from ecotrain.checkpoint.format import load_state_dict_file
from ecotrain.base.errors import CheckpointError, ConfigError
from ecotrain.methods.base import Method
from ecotrain.methods.replay import check_pinned, file_digest, run_file
from ecotrain.base.tensorfile import cpu_copy
from ecotrain.base.runfiles import MODEL

log = logging.getLogger(__name__)


def average_weights(new_state: Mapping[str, torch.Tensor], old_state: Mapping[str, torch.Tensor], alpha: float,
                    where: str = "average_weights") -> dict[str, torch.Tensor]:
    """alpha * new + (1 - alpha) * old for every floating-point tensor (float64 stays float64; other
    float dtypes are computed in float32 and cast back); integer and bool tensors (BatchNorm's
    num_batches_tracked) are the new model's. alpha 1 and 0 give `new_state` and `old_state` bit for
    bit. The keys and shapes must match: else one ConfigError line, prefixed by `where`."""
    if not 0.0 <= alpha <= 1.0:
        raise ConfigError(f"{where}: alpha {alpha} is outside [0, 1] (1: the trained weights, 0: the previous ones)")
    check_same_layout(new_state, old_state, where)
    out = {}
    for k, new in new_state.items():
        old = old_state[k]
        if not new.is_floating_point() or alpha == 1.0:
            out[k] = new.detach().clone()
        elif alpha == 0.0:  # exactly the previous weights (0 * new + old would turn -0.0 into 0.0)
            out[k] = old.detach().to(device=new.device, dtype=new.dtype, copy=True)
        else:
            f = torch.float64 if new.dtype == torch.float64 else torch.float32
            mixed = alpha * new.detach().to(f) + (1.0 - alpha) * old.detach().to(device=new.device, dtype=f)
            out[k] = mixed.to(new.dtype)
    return out


def check_same_layout(new_state: Mapping[str, torch.Tensor], old_state: Mapping[str, torch.Tensor], where: str) -> None:
    """The same keys with the same shapes, else one ConfigError line."""
    missing, extra = sorted(set(new_state) - set(old_state)), sorted(set(old_state) - set(new_state))
    if missing or extra:
        what = f"has no '{missing[0]}'" if missing else f"has '{extra[0]}', which the model has not"
        raise ConfigError(f"{where}: the previous weights {what} ({len(missing) + len(extra)} keys differ); "
                          "average a model with the same architecture")
    for k, new in new_state.items():
        if tuple(new.shape) != tuple(old_state[k].shape):
            raise ConfigError(f"{where}: '{k}' has shape {tuple(new.shape)} here but {tuple(old_state[k].shape)} "
                              "in the previous weights; average a model with the same architecture")


class Average(Method):
    def __init__(self, cfg, run, trained=None):
        if run.distributed.strategy == "fsdp":
            raise ConfigError("methods.average: not supported with distributed.strategy=fsdp (sharded "
                              "parameters); use ddp or one process")
        self.key, self.cfg = "average", cfg
        self.path = None if cfg.with_ == "previous" else run_file(cfg.with_, "methods.average.with", MODEL)
        self.digest = file_digest(self.path) if self.path else None
        self.previous: Optional[dict[str, torch.Tensor]] = (
            load_state_dict_file(self.path) if self.path else None)  # `with: previous`: taken at fit start
        self.needs = (() if self.path else ("init",)) + (("val",) if cfg.alpha == "auto" else ())
        self.state = None
        self.report: dict = {}

    def on_fit_start(self, state):
        self.state = state  # alpha auto evaluates each candidate with the run's task on the val split
        bare = state.dist.unwrap(state.model)
        if self.previous is None:  # a new run: the model still holds the weights it was initialised from
            self.previous = cpu_copy(bare.state_dict())
        else:  # a weights file, or the snapshot a resume restored: refuse a mismatch before training
            check_same_layout(bare.state_dict(), self.previous, self._where())

    def _where(self) -> str:
        return f"methods.average.with: {self.path}" if self.path else "methods.average"

    @torch.no_grad()
    def finalize(self, model, data):
        trained = {k: v.detach().clone() for k, v in model.state_dict().items()}
        alpha, scores, monitor = self.cfg.alpha, {}, None
        if alpha == "auto":
            monitor, mode = self._monitor()
            for a in self.cfg.grid:
                model.load_state_dict(average_weights(trained, self.previous, a, self._where()))
                record = evaluate_split(self.state, data.val, "val", final=True)
                if monitor not in record:
                    monitor, mode = "val_loss", "min"
                scores[a] = record[monitor]
            pick = min if mode == "min" else max
            alpha = pick(self.cfg.grid, key=lambda a: scores[a])  # the first best in grid order
            log.info(f"average: alpha {alpha} chosen by {monitor} on the val split ("
                     + ", ".join(f"{a}: {scores[a]:.6g}" for a in self.cfg.grid) + ")")
        model.load_state_dict(average_weights(trained, self.previous, alpha, self._where()))
        self.report = {"with": str(self.path) if self.path else "previous", "alpha": alpha}
        if scores:
            self.report.update({"chosen_by": monitor, "candidates": {str(a): s for a, s in scores.items()}})

    def _monitor(self) -> tuple[str, str]:
        es = self.state.config.early_stopping
        return (es.monitor, es.mode) if es.monitor.startswith("val_") else ("val_loss", "min")

    def summary(self) -> dict:
        return self.report

    def state_dict(self) -> dict:
        if self.path:  # the file is read-only: its digest pins it
            return {"with_digest": self.digest}
        return {"previous": self.previous}  # the starting weights: a resumed model no longer holds them

    def load_state_dict(self, sd: dict) -> None:
        if self.path:
            check_pinned(sd, "with_digest", self.digest, "methods.average.with", self.path, "the weights")
        elif "previous" not in sd:
            raise CheckpointError("methods.average: the checkpoint holds no starting weights (it was saved with "
                                  "another `with:`); resume with the methods it was saved with")
        else:
            self.previous = dict(sd["previous"])


def averaged_model(new: nn.Module, old: nn.Module, alpha: float, where: str = "average") -> nn.Module:
    """A copy of `new` (in eval mode) holding alpha * new + (1 - alpha) * old: one candidate of an
    alpha chosen outside a run (the registry's update and the speech rounds pick it on their gate split)."""
    import copy

    out = copy.deepcopy(new)
    out.load_state_dict(average_weights(new.state_dict(), old.state_dict(), alpha, where))
    return out.eval()
