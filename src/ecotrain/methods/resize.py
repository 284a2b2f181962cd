"""Progressive resizing: shorter inputs early in training, the full length at the end.

    methods:
      - name: progressive_resize
        scales: [0.5, 0.75]   # input length as a fraction of the full length, stage by stage
        until: [0.25, 0.5]    # each stage ends at this fraction of the planned steps; then full length
        mode: auto            # downsample (signals: linear interpolation; images (N, C, H, W): bilinear
                              # on both sides) | crop (token sequences: the
                              # first tokens, targets alike); auto: crop integer inputs, downsample others

The stage is a function of the step alone, so a resume at any step trains on the same lengths.
It runs as the Objective's `prepare_batch` (objective.py) on the effective batch, in the training
process (data workers never see it). At each stage change it calls `state.flops_changed()`, so
the ledger re-measures the shorter or longer step instead of extrapolating the old one.
Evaluation and the test always see full-length inputs.

When it helps: models whose cost grows with the input length and that pool over it (ResNet1d,
a transformer LM): early epochs learn coarse features as well from half the samples. Risks: the
model must take any length (a flat linear head, e.g. model cnn, cannot: refused before the run starts); a
resolution gap between train and eval if the last stage is short. Cost: an interpolation per batch.
"""

from __future__ import annotations

import bisect

import torch
import torch.nn.functional as F

from ecotrain.base.errors import ConfigError
from ecotrain.base.log import log
from ecotrain.methods.base import Method


def resize(x: torch.Tensor, y: torch.Tensor, scale: float, mode: str):
    """(x, y) at `scale` of the last dimension's length."""
    n = x.shape[-1]
    size = max(1, round(n * scale))
    if mode == "crop":
        return x[..., :size], (y[..., :size] if y.ndim == x.ndim and y.shape[-1] == n else y)
    shape = x.shape
    if x.ndim == 4:  # images (N, C, H, W): both sides, bilinear (mixed fidelity: lower resolution early)
        hw = (max(1, round(shape[2] * scale)), size)
        return F.interpolate(x.float(), size=hw, mode="bilinear", align_corners=False, antialias=True).to(x.dtype), y
    flat = x.reshape(-1, 1, n) if x.ndim < 3 else x.reshape(shape[0], -1, n)
    out = F.interpolate(flat.float(), size=size, mode="linear", align_corners=False).to(x.dtype)
    return out.reshape(*shape[:-1], size), y


class ProgressiveResize(Method):
    needs = ("xy",)  # (x, y) tensor batches of a classification-like task (assemble.check_methods_fit)
    def __init__(self, cfg, run=None, trained=None):
        self.key, self.scales, self.until, self.mode = "progressive_resize", list(cfg.scales), list(cfg.until), cfg.mode
        self.ends: list[int] = []
        self.model = None

    def transform(self, model):
        self.model = model  # the bare module, for the length check below
        return model

    def data(self, source, sampler):
        x, y = source.take(torch.tensor([0]))
        if self.mode == "auto":
            self.mode = "downsample" if x.is_floating_point() else "crop"
        if self.model is not None:  # checked while assembling: a refused run leaves no run folder
            self._check(self.model, x, y)
        return source, sampler

    def scale_at(self, step: int) -> float:
        i = bisect.bisect_right(self.ends, step)
        return self.scales[i] if i < len(self.scales) else 1.0

    def on_fit_start(self, state):
        self.ends = [int(u * state.total_steps) for u in self.until]
        log.info(f"progressive_resize: input length x{self.scales} until steps {self.ends}, then full")

    def _check(self, model, x, y) -> None:
        """One forward at the smallest size, so a model with a fixed-size head fails now, in one line."""
        x, y = resize(x, y, min(self.scales), self.mode)
        was = model.training
        model.eval()
        try:
            with torch.no_grad():
                model(x.to(next(model.parameters()).device))
        except RuntimeError as exc:
            first = str(exc).splitlines()[0][:160]
            raise ConfigError(f"methods.progressive_resize: the model cannot take inputs of length {x.shape[-1]} "
                              f"({first}); it needs a model that pools over the length (resnet, charlm), not a "
                              "flat linear head (cnn, mlp)") from None
        finally:
            model.train(was)

    def prepare_batch(self, batch, state):
        scale = self.scale_at(state.step)
        return batch if scale == 1.0 else resize(*batch, scale, self.mode)

    def on_step_end(self, state):
        if self.scale_at(state.step) != self.scale_at(state.step - 1):  # the next step's length differs
            state.flops_changed()

    def summary(self) -> dict:
        return {"scales": self.scales, "until_steps": self.ends, "mode": self.mode}
