"""Which cohort's model serves a request that does not say: a small learned router.

The router is a multinomial logistic regression (scikit-learn fits it) on an example's pooled
features: by default the base model's penultimate activations (the input of its last Linear layer,
averaged over any time or space axes), which every cohort's adapter shares because the base stays
frozen. It learns the cohort from the training examples of every cohort deployed so far. At
inference an example goes to its predicted cohort when the router's probability is at least
`min_confidence`, else to the base model (`None`); a cohort the deployment has no model for goes
to the base model too.

Its state is tensors and a list of names (`state()` / `from_state()`): stored in safetensors and
JSON like everything else, never pickled; prediction is a few tensor ops, no scikit-learn at serving.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch
from torch import nn

from ecotrain.base.errors import ConfigError

MIN_CONFIDENCE = 0.6


@torch.inference_mode()
def pooled_features(model: nn.Module, x, batch_size: int = 256) -> torch.Tensor:
    """[N, D] float32: the input of `model`'s last nn.Linear for each example of `x` (a tensor, or a
    list of per-example tensors of any length), averaged over every axis between the batch and the
    feature axis. The model runs in eval mode; its mode is restored after."""
    head = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not head:
        raise ConfigError("router: the model has no nn.Linear layer whose input could serve as features; "
                          "pass features to the router yourself")
    got: list[torch.Tensor] = []

    def grab(_mod, args):
        a = args[0].detach().float()
        got.append(a.mean(dim=tuple(range(1, a.dim() - 1))) if a.dim() > 2 else a.reshape(len(a), -1))

    was = model.training
    model.eval()
    hook = head[-1].register_forward_pre_hook(grab)
    try:
        dev = next(model.parameters()).device
        for i in range(0, len(x), batch_size):
            model(x[i:i + batch_size].to(dev))
    finally:
        hook.remove()
        model.train(was)
    return torch.cat(got).cpu() if got else torch.zeros(0, 0)


class CohortRouter:
    """fit(features, cohorts) -> route(features) -> the cohort per example, or None (the base model)."""

    def __init__(self, min_confidence: float = MIN_CONFIDENCE, seed: int = 0):
        if not 0 <= min_confidence <= 1:
            raise ConfigError(f"router min_confidence {min_confidence}: must be between 0 and 1")
        self.min_confidence, self.seed = min_confidence, seed
        self.classes: list[str] = []
        self.params: Optional[dict[str, torch.Tensor]] = None  # mean, scale, coef [K|1, D], intercept

    def fit(self, features, cohorts: Sequence[str]) -> "CohortRouter":
        """Refit on every example given (one cohort alone: nothing to tell apart, every route is None)."""
        from sklearn.linear_model import LogisticRegression

        x = np.asarray(features, dtype=np.float64)
        y = np.asarray([str(c) for c in cohorts])
        if len(x) != len(y):
            raise ConfigError(f"router: {len(x)} feature rows but {len(y)} cohort labels")
        self.classes = sorted(set(y.tolist()))
        if len(self.classes) < 2:
            self.params = None
            return self
        mean, scale = x.mean(0), x.std(0)
        scale[scale == 0] = 1.0  # a constant feature tells nothing apart
        clf = LogisticRegression(max_iter=2000, random_state=self.seed).fit((x - mean) / scale, y)
        assert list(clf.classes_) == self.classes  # sklearn sorts them too: the rows of coef follow
        as_t = (lambda a: torch.tensor(np.asarray(a), dtype=torch.float64))
        self.params = {"mean": as_t(mean), "scale": as_t(scale), "coef": as_t(clf.coef_),
                       "intercept": as_t(clf.intercept_)}
        return self

    def proba(self, features) -> torch.Tensor:
        """[N, K] probability of each cohort (columns in `self.classes` order)."""
        if self.params is None:
            raise ConfigError("router: not fitted on two cohorts or more")
        p = self.params
        x = (torch.as_tensor(np.asarray(features), dtype=torch.float64) - p["mean"]) / p["scale"]
        z = x @ p["coef"].T + p["intercept"]
        if p["coef"].shape[0] == 1:  # two cohorts: scikit-learn's one logit for the second class
            s = torch.sigmoid(z[:, 0])
            return torch.stack([1 - s, s], 1)
        return torch.softmax(z, 1)

    def route(self, features) -> list[Optional[str]]:
        """The cohort per example, or None where the router is unsure (or was never fitted)."""
        n = len(features)
        if self.params is None or n == 0:
            return [None] * n
        conf, best = self.proba(features).max(1)
        return [self.classes[int(b)] if float(c) >= self.min_confidence else None for c, b in zip(conf, best)]

    # -- stored as tensors + names, never pickled --------------------------------------------------
    def state(self) -> tuple[dict[str, torch.Tensor], dict]:
        meta = {"classes": self.classes, "min_confidence": self.min_confidence, "seed": self.seed}
        return dict(self.params or {}), meta

    @classmethod
    def from_state(cls, tensors: dict, meta: dict) -> "CohortRouter":
        r = cls(float(meta.get("min_confidence", MIN_CONFIDENCE)), int(meta.get("seed", 0)))
        r.classes = [str(c) for c in meta.get("classes", [])]
        r.params = {k: tensors[k].double() for k in ("mean", "scale", "coef", "intercept")} if tensors else None
        return r


def accuracy(routes: Sequence[Optional[str]], truth: Sequence[str], base: Optional[str] = None) -> float:
    """Share of examples served by their own cohort's model; a None route is the base model, right
    for the examples of the `base` cohort."""
    if not len(truth):
        return float("nan")
    return sum((base if r is None else r) == t for r, t in zip(routes, truth)) / len(truth)
