"""Per-domain BatchNorm statistics (`methods: [{name: batchnorm, policy: domain, domain: KEY}]`):
one set of running means and variances per domain key, every weight (BN's affine included) shared.

What this module owns: reading and writing a model's BN statistics as plain named tensors, the
layout they take in export.safetensors (`batchnorm/pretrained/<layer>/mean|var` and
`batchnorm/domain/<key>/<layer>/mean|var`), and choosing a domain's statistics before a forward
pass (`use_domain`), which is how `ecotrain eval|predict --domain` and an .npz `domain` column
reach the BN layers: the buffers are swapped explicitly, the user's model is never wrapped.

The statistics of the run's own domain live in the model's BN buffers while it trains (so the
checkpoint's model weights hold them and a resume is exact); the pre-trained statistics (the
fallback for every domain not listed) and the domains carried over from an earlier run ride in the
method's checkpoint state. The saved model.safetensors holds the run's own domain's statistics: a
consumer that knows nothing of domains gets the fine-tuned model as trained.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch import nn

from ecotrain.base import safefile
from ecotrain.checkpoint import read_checkpoint
from ecotrain.checkpoint.format import unflatten
from ecotrain.base.errors import CheckpointError, ConfigError, DataError
from ecotrain.methods.replay import exported_file, read_exported  # the shared export reader

_BN = nn.modules.batchnorm._BatchNorm
PRETRAINED = "pre-trained"  # what the statistics of an unknown domain are called in records

Stats = dict[str, dict[str, torch.Tensor]]  # BN layer name -> {"mean", "var"}


def read_stats(model: nn.Module) -> Stats:
    """A copy of every BN layer's running mean and variance."""
    return {name: {"mean": m.running_mean.detach().clone(), "var": m.running_var.detach().clone()}
            for name, m in model.named_modules() if isinstance(m, _BN) and m.running_mean is not None}


@torch.no_grad()
def write_stats(model: nn.Module, stats: Stats, where: str = "batchnorm") -> None:
    """Copy `stats` into the model's BN buffers; every layer with running statistics must be in it."""
    for name, m in model.named_modules():
        if not isinstance(m, _BN) or m.running_mean is None:
            continue
        s = stats.get(name)
        if s is None or s["mean"].shape != m.running_mean.shape:
            raise CheckpointError(f"{where}: no statistics for BatchNorm layer '{name}' of shape "
                                  f"{tuple(m.running_mean.shape)}; they are of another model")
        m.running_mean.copy_(s["mean"])
        m.running_var.copy_(s["var"])


def to_tensors(pretrained: Stats, domains: dict[str, Stats]) -> dict[str, torch.Tensor]:
    """The flat names export.safetensors stores (under the method's `batchnorm/` prefix)."""
    out = {f"pretrained/{layer}/{k}": v.detach().cpu().contiguous()
           for layer, s in pretrained.items() for k, v in s.items()}
    for key, stats in domains.items():
        out.update({f"domain/{key}/{layer}/{k}": v.detach().cpu().contiguous()
                    for layer, s in stats.items() for k, v in s.items()})
    return out


def from_tensors(tensors: dict[str, torch.Tensor], where: str) -> tuple[Stats, dict[str, Stats]]:
    """(pre-trained statistics, {domain: statistics}) from `to_tensors`' names."""
    pretrained: Stats = {}
    domains: dict[str, Stats] = {}
    for name, t in tensors.items():
        parts = name.split("/")
        if parts[0] == "pretrained" and len(parts) == 3:
            pretrained.setdefault(parts[1], {})[parts[2]] = t
        elif parts[0] == "domain" and len(parts) == 4:
            domains.setdefault(parts[1], {}).setdefault(parts[2], {})[parts[3]] = t
    if not pretrained:
        raise CheckpointError(f"{where}: holds no per-domain BatchNorm statistics; was it trained with "
                              "methods: [{name: batchnorm, policy: domain}]?")
    return pretrained, domains


def read_domains_file(path: str | Path, where: str) -> tuple[Stats, dict[str, Stats]]:
    """A run folder's (or its export.safetensors') pre-trained and per-domain statistics."""
    p = exported_file(path, where)
    return from_tensors(read_exported(p, "batchnorm", where), f"{where}: {p}")


class DomainStats:
    """The statistics a trained model can serve: the pre-trained fallback and one set per domain."""

    def __init__(self, pretrained: Stats, domains: dict[str, Stats]):
        self.pretrained, self.domains = pretrained, domains

    def pick(self, key: Optional[str]) -> tuple[str, Stats]:
        """(what is used, its statistics): the domain's own, or the pre-trained ones for an unknown key."""
        if key in self.domains:
            return key, self.domains[key]
        return PRETRAINED, self.pretrained


def use_domain(model: nn.Module, stats: DomainStats, key: Optional[str]) -> str:
    """Put domain `key`'s statistics in the model's BN buffers; returns whose they are."""
    used, s = stats.pick(key)
    write_stats(model, s)
    return used


def trained_domains(weights_dir: Path, method_state: Optional[dict], model: nn.Module) -> DomainStats:
    """The statistics a trained model serves. A run folder: its export.safetensors. A checkpoint:
    the method state (pre-trained and carried domains) plus the run's own domain in the model's buffers."""
    if method_state is None:
        pre, doms = read_domains_file(weights_dir, "--domain")
        return DomainStats(pre, doms)
    own = method_state.get("domain")
    domains = {k: dict(v) for k, v in (method_state.get("carried") or {}).items()}
    if own:
        domains[own] = read_stats(model)
    return DomainStats(dict(method_state["start"]), domains)


def domain_column(path: Path, split: str, rows: int) -> Optional[np.ndarray]:
    """An .npz's per-row domain keys (`domain`, or `domain_test` for its test arrays) as strings, or None."""
    key = "domain_test" if split == "test" else "domain"
    try:
        with safefile.open_regular(path, "data file", error=DataError) as fh, np.load(fh, allow_pickle=False) as z:
            if key not in z.files:
                return None
            col = z[key]
    except ValueError:
        raise DataError(f"{path}: '{key}' holds Python objects; save domain keys as integers or fixed-width "
                        "strings (np.array(['a', 'b']))") from None
    if col.shape != (rows,) or col.dtype.kind not in "iuUS":
        raise DataError(f"{path}: '{key}' must be one integer or string domain key per row ({rows} rows), got "
                        f"{col.dtype} of shape {col.shape}")
    return col.astype(str)


def check_domain_request(domain: Optional[str], policy: Optional[str], target) -> None:
    """One line when `--domain` is asked of a model trained without per-domain statistics."""
    if domain is not None and policy != "domain":
        raise ConfigError(f"--domain {domain}: {target} was not trained with per-domain BatchNorm statistics "
                          "(methods: [{name: batchnorm, policy: domain}]); drop --domain")


def _policy(cfg) -> Optional[str]:
    return next((m.policy for m in cfg.methods if getattr(m, "name", None) == "batchnorm"), None)


def serving(trained, domain: Optional[str], files: list[str], split: str, rows: int):
    """(statistics, per-row keys) for `ecotrain eval|predict` of `trained` (inference.Trained): (None,
    None) for a model without per-domain statistics; the keys are None with `--domain` (one domain for
    the request) and for data without a `domain` column (the model as saved: the run's own domain)."""
    policy = _policy(trained.config)
    check_domain_request(domain, policy, trained.source)
    if policy != "domain":
        return None, None
    path = Path(trained.source)
    if not trained.prefix:  # a run folder: every domain in its export.safetensors
        stats = trained_domains(path, None, trained.model)
    else:  # a checkpoint: the method's state, and the run's own domain in the model's buffers
        tensors, meta = read_checkpoint(path)
        state = (unflatten(meta, tensors).get("methods") or {}).get("batchnorm")
        if not isinstance(state, dict) or "start" not in state:
            raise CheckpointError(f"{path}: the checkpoint holds no batchnorm method state")
        stats = trained_domains(path, state, trained.model)
    npz = [f for f in files if "=" not in f and f.lower().endswith(".npz")]
    column = domain_column(Path(npz[0]), split, rows) if npz and domain is None else None
    return stats, column
