"""BatchNorm policies for fine-tuning, and the bn report (summary.json `methods.batchnorm`,
`ecotrain bn-report RUN`).

When a pre-trained model is fine-tuned on a small dataset in small batches, BatchNorm's running mean
and variance follow those few noisy batches and drift from what the weights expect: eval-mode
accuracy drops while train-mode accuracy looks fine. `methods: [{name: batchnorm, policy: ...}]`:

- `train`: BatchNorm as PyTorch trains it, the naive baseline (the report is still made).
- `freeze_stats`: the BN layers are put back in eval mode after every `model.train()` (the
  `train_mode` hook), so the starting running statistics are kept and used in training too; gamma
  and beta still train.
- `recompute` ("precise BN"): once training is over (`finalize`, on the best weights), the running
  statistics are replaced by the exact statistics of the training data: one pass with the BN layers
  in train mode (batch statistics normalise the pass, as in training) and every other module in eval
  mode (dropout off), no gradient, no optimizer step. Each BN layer's input is summed in float64, so
  its mean and unbiased variance are those of the whole data whatever the batch size.
- `groupnorm`: every BatchNorm becomes a GroupNorm(`groups`) before training (`transform`), weight
  and bias carried over; no running statistics remain. A channel count `groups` does not divide is
  a ConfigError naming the layer.
- `momentum`: every BN layer's momentum is set to `momentum` (`transform`): the running statistics
  move more slowly (PyTorch's default is 0.1).
- `domain`: running statistics per domain key (methods/bn_domain.py). The run's data is domain
  `domain`; its statistics start from the pre-trained ones (or that domain's, carried over by
  `domains_from`) and are updated only by this run's batches (`domain_stats: running`) or recomputed
  exactly on its training data at the end (`recompute`). The pre-trained statistics stay the
  fallback for every other domain, and every weight, BN's affine included, is shared. The saved
  model holds the run's domain's statistics; export.safetensors holds them all (`eval|predict --domain`).

Why not `torch.optim.swa_utils.update_bn` for `recompute`: it puts the whole model in train mode, so
dropout is on during the pass and the statistics are of activations eval mode never produces; and its
cumulative average of per-batch means and unbiased per-batch variances is not the data's variance
(it leaves out the spread of the batch means) and weighs a short last batch like a full one. On a
dropout-free model with the data in one batch both give the same statistics (tests/unit/test_batchnorm.py).

The report: per BN layer, the shift of the running mean (mean over channels of |mu - mu0| / sigma0)
and the variance ratio (geometric mean over channels of var / var0) from the starting weights (those
training started from: `--init-from` included), and the validation accuracy in eval mode vs in
train mode (BN on batch statistics of the training micro-batch size, as training saw them; dropout
off). A difference above `warn_gap` (default 0.05) is logged as a warning: inference will behave
differently from training.

The policy and the starting statistics ride in checkpoints (`methods.batchnorm`), so a resumed run
reports against the same start; summary.json records the policy that produced the statistics.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from ecotrain.base import safefile
from ecotrain.base.errors import ConfigError
from ecotrain.base.log import log
from ecotrain.methods.base import Method
from ecotrain.methods.bn_domain import Stats, read_domains_file, read_stats, to_tensors, write_stats
from ecotrain.base.runfiles import SUMMARY, RunFiles

DEFAULT_GROUPS = 32
_BN = nn.modules.batchnorm._BatchNorm


def bn_layers(model: nn.Module) -> dict[str, nn.Module]:
    """The model's BatchNorm layers (1d/2d/3d, SyncBatchNorm) by qualified name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, _BN)}


def to_groupnorm(model: nn.Module, groups: int) -> nn.Module:
    """Swap every BatchNorm of `model` for a GroupNorm(groups, channels) with the same eps and affine
    weight and bias (in place; returns the model, or the new module when `model` is itself a BN)."""
    layers = bn_layers(model)
    for name, bn in layers.items():
        if bn.num_features % groups:
            divisors = [g for g in range(min(groups, bn.num_features), 0, -1) if all(
                m.num_features % g == 0 for m in layers.values())]
            raise ConfigError(f"methods.batchnorm: groups={groups} does not divide the {bn.num_features} channels of "
                              f"BatchNorm layer '{name or '(the model)'}'; choose a group count that divides every "
                              f"BatchNorm's channels (largest here: {divisors[0]})")
    for name, bn in layers.items():
        gn = nn.GroupNorm(groups, bn.num_features, eps=bn.eps, affine=bn.affine)
        if bn.affine:
            gn = gn.to(device=bn.weight.device, dtype=bn.weight.dtype)
            with torch.no_grad():
                gn.weight.copy_(bn.weight)
                gn.bias.copy_(bn.bias)
        gn.train(bn.training)
        if not name:
            return gn
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, gn)
    return model


@torch.no_grad()
def recompute_stats(model: nn.Module, source, batch_size: int, device) -> int:
    """Replace every BN layer's running mean and variance with the exact statistics of its input over
    `source` (a Source: `take(idx) -> (x, y)`); returns the number of samples. See the module docstring."""
    layers = [m for m in bn_layers(model).values() if m.running_mean is not None]
    sums: dict[int, list] = {}

    def hook(module, args):
        x = args[0].detach().double()
        dims = [d for d in range(x.dim()) if d != 1]  # every dim but the channels
        s, sq, n = x.sum(dims), (x * x).sum(dims), x.numel() // x.shape[1]
        acc = sums.get(id(module))
        sums[id(module)] = [s, sq, n] if acc is None else [acc[0] + s, acc[1] + sq, acc[2] + n]

    modes = {m: m.training for m in model.modules()}
    kept = {m: (m.momentum, m.num_batches_tracked.clone() if m.num_batches_tracked is not None else None)
            for m in layers}
    handles = [m.register_forward_pre_hook(hook) for m in layers]
    try:
        model.eval()
        for m in layers:
            m.train()
        n = len(source)
        for start in range(0, n, batch_size):
            x, _ = source.take(torch.arange(start, min(start + batch_size, n)))
            model(x.to(device))
    finally:
        for h in handles:
            h.remove()
        for m, was in modes.items():
            m.train(was)
    for m in layers:
        s, sq, count = sums[id(m)]
        mean = s / count
        var = (sq - count * mean * mean) / max(count - 1, 1)  # unbiased, as BN keeps it
        m.running_mean.copy_(mean.to(m.running_mean.dtype))
        m.running_var.copy_(var.clamp_min(0).to(m.running_var.dtype))
        momentum, tracked = kept[m]
        m.momentum = momentum
        if tracked is not None:
            m.num_batches_tracked.copy_(tracked)
    return n


@torch.no_grad()
def accuracy(model: nn.Module, source, batch_size: int, device, order: Optional[torch.Tensor] = None) -> Optional[float]:
    """Top-1 accuracy of `model` as it is (its modes untouched); None when the outputs are not class
    scores for integer labels (a user task)."""
    n = len(source)
    order = torch.arange(n) if order is None else order
    right = 0
    for start in range(0, n, batch_size):
        x, y = source.take(order[start:start + batch_size])
        out = model(x.to(device))
        y = y.to(device)
        if torch.is_floating_point(y) or out.dim() != y.dim() + 1 or out.shape[:-1] != y.shape:
            return None
        right += int((out.argmax(-1) == y).sum())
    return right / n


class BatchNormPolicy(Method):
    needs = ("xy",)  # (x, y) tensor batches of a classification-like task (assemble.check_methods_fit)
    def __init__(self, cfg, run=None, trained=None):
        if run is not None and run.distributed.strategy == "fsdp":
            raise ConfigError("methods.batchnorm: not supported with distributed.strategy=fsdp (sharded modules); "
                              "use ddp or one process")
        self.key, self.policy = "batchnorm", cfg.policy
        self.momentum = cfg.momentum
        self.groups = (cfg.groups or DEFAULT_GROUPS) if cfg.policy == "groupnorm" else None
        self.recompute_batch_size, self.warn_gap = cfg.recompute_batch_size, cfg.warn_gap
        self.layers: dict[str, nn.Module] = {}
        self.start: dict[str, dict[str, torch.Tensor]] = {}  # layer -> starting running mean / var
        self.micro_batch = 32  # set at fit start: the per-rank micro-batch training sees
        self.report: dict = {}
        # policy domain: this run's key, how its statistics are made, the domains carried over from a run
        self.domain, self.domain_stats = cfg.domain, cfg.domain_stats
        self.carried: dict[str, Stats] = {}
        self.carried_start: Optional[Stats] = None  # domains_from's pre-trained statistics
        if cfg.domains_from:
            self.carried_start, self.carried = read_domains_file(cfg.domains_from, "methods.batchnorm.domains_from")

    # -- hooks ----------------------------------------------------------------------------------
    def transform(self, model):
        layers = bn_layers(model)
        if not layers:
            raise ConfigError("methods.batchnorm: the model has no BatchNorm layers; drop the method "
                              "(or use a model with BatchNorm, e.g. model.name=resnet)")
        self.start = {name: {"mean": m.running_mean.detach().clone(), "var": m.running_var.detach().clone()}
                      for name, m in layers.items() if m.running_mean is not None}
        if self.policy == "groupnorm":
            model = to_groupnorm(model, self.groups)
            layers = {}
        elif self.policy == "momentum":
            for m in layers.values():
                m.momentum = self.momentum
        elif self.policy == "domain":  # the fallback: domains_from's pre-trained statistics, else the model's
            self.start = self.carried_start or self.start
            write_stats(model, self.carried.get(self.domain, self.start), "methods.batchnorm.domains_from")
        self.layers = layers
        return model

    def on_fit_start(self, state):
        per_rank = -(-state.config.data.batch_size // state.dist.world_size)
        self.micro_batch = -(-per_rank // state.plan.micro_batches)

    def train_mode(self, model):
        if self.policy == "freeze_stats":
            for m in self.layers.values():
                m.eval()

    def finalize(self, model, data):
        device = next(model.parameters()).device
        layers = bn_layers(model)  # the bare model `finish` loaded the final weights into
        report: dict = {"policy": self.policy}
        if self.policy == "momentum":
            report["momentum"] = self.momentum
        if self.policy == "groupnorm":
            report["groups"] = self.groups
            report["groupnorm_layers"] = len(self.start)
        if self.policy == "recompute" or (self.policy == "domain" and self.domain_stats == "recompute"):
            report["recomputed_on_samples"] = recompute_stats(model, data.train, self.recompute_batch_size, device)
        report["layers"] = self._shifts(layers)
        if self.policy == "domain":
            domains = {**self.carried, self.domain: read_stats(model)}
            eps = {name: m.eps for name, m in layers.items()}
            report.update(domain=self.domain, domain_stats=self.domain_stats, domains={
                k: _stat_shifts(v, self.start, eps) for k, v in sorted(domains.items())})
        if data.val is not None:
            report.update(self._mode_accuracies(model, data.val, device))
        self.report = report
        gap = report.get("mode_gap")
        if gap is not None and report.get("warned"):  # the report's own decision: the log and summary.json agree
            log.warning(f"methods.batchnorm: validation accuracy {report['val_accuracy_eval_mode']:.4f} in eval mode "
                        f"vs {report['val_accuracy_train_mode']:.4f} in train mode (gap {gap:+.4f}, more than warn_gap "
                        f"{self.warn_gap}): inference will behave differently from training; {_why(gap, self.micro_batch)}"
                        "; see `ecotrain bn-report RUN` and docs/finetuning.md")

    def export(self, model):
        """Policy domain: the pre-trained and every domain's statistics (bn_domain.to_tensors)."""
        if self.policy != "domain":
            return None
        return to_tensors(self.start, {**self.carried, self.domain: read_stats(model)})

    def summary(self) -> dict:
        return self.report or {"policy": self.policy}

    def state_dict(self) -> dict:
        sd = {"policy": self.policy, "momentum": self.momentum, "groups": self.groups, "start": self.start}
        if self.policy == "domain":  # the run's own domain's statistics are the model's buffers
            sd.update(domain=self.domain, carried=self.carried)
        return sd

    def load_state_dict(self, sd: dict) -> None:
        if sd.get("policy") != self.policy:
            log.warning(f"methods.batchnorm: the checkpoint's statistics were produced under policy "
                        f"{sd.get('policy')}, this run uses {self.policy}")
        self.start = {k: dict(v) for k, v in sd["start"].items()}
        if self.policy == "domain" and sd.get("policy") == "domain":
            if sd.get("domain") != self.domain:
                raise ConfigError(f"methods.batchnorm.domain: the checkpoint trained domain '{sd.get('domain')}', "
                                  f"this run's config says '{self.domain}'; resume with the same domain")
            self.carried = {k: {n: dict(t) for n, t in v.items()} for k, v in (sd.get("carried") or {}).items()}

    # -- the report -----------------------------------------------------------------------------
    def _shifts(self, layers: dict[str, nn.Module]) -> dict:
        live = {name: {"mean": m.running_mean, "var": m.running_var} for name, m in layers.items()
                if m.running_mean is not None}
        return _stat_shifts(live, self.start, {name: m.eps for name, m in layers.items()})

    def _mode_accuracies(self, model, val, device) -> dict:
        """Eval-mode vs train-mode validation accuracy; the train-mode pass runs the BN layers as training
        ran them (batch statistics of the training micro-batch size, or frozen), dropout off, and leaves
        the running statistics as they were."""
        modes = {m: m.training for m in model.modules()}
        bns = [m for m in bn_layers(model).values()]
        kept = [{k: v.clone() for k, v in m.named_buffers(recurse=False)} for m in bns]
        try:
            model.eval()
            eval_acc = accuracy(model, val, 256, device)
            if self.policy != "freeze_stats":
                for m in bns:
                    m.train()
            order = torch.randperm(len(val), generator=torch.Generator().manual_seed(0))  # mixed batches, like training
            train_acc = accuracy(model, val, self.micro_batch, device, order)
        finally:
            with torch.no_grad():
                for m, bufs in zip(bns, kept):
                    for k, v in bufs.items():
                        getattr(m, k).copy_(v)
            for m, was in modes.items():
                m.train(was)
        if eval_acc is None or train_acc is None:
            return {}
        return {"val_accuracy_eval_mode": round(eval_acc, 4), "val_accuracy_train_mode": round(train_acc, 4),
                "mode_gap": round(train_acc - eval_acc, 4), "train_mode_batch_size": self.micro_batch,
                "warn_gap": self.warn_gap, "warned": abs(train_acc - eval_acc) > self.warn_gap}


def _stat_shifts(stats: Stats, start: Stats, eps: dict[str, float]) -> dict:
    """Per layer: the mean's shift from `start` in starting standard deviations, and the variance ratio."""
    out = {}
    for name, s in stats.items():
        s0 = start.get(name)
        if s0 is None:
            continue
        mean, var = s["mean"].detach().double().cpu(), s["var"].detach().double().cpu()
        mean0, var0 = s0["mean"].double().cpu(), s0["var"].double().cpu()
        shift = (mean - mean0).abs() / (var0 + eps[name]).sqrt()
        ratio = ((var + eps[name]) / (var0 + eps[name])).log()
        out[name] = {"channels": int(mean.numel()), "mean_shift": round(float(shift.mean()), 4),
                     "max_mean_shift": round(float(shift.max()), 4), "var_ratio": round(math.exp(float(ratio.mean())), 4)}
    return out


def _why(gap: float, batch: int) -> str:
    if gap > 0:  # train mode better: the running statistics are not what the weights expect
        return "the running statistics have drifted from the batch statistics the weights were trained on (policy: " \
               "recompute, or freeze_stats)"
    return (f"batch statistics of {batch} samples are noisier than the running ones, so the weights were trained on "
            "noisy normalisation (policy: freeze_stats, or groupnorm)")


# -- ecotrain bn-report RUN ---------------------------------------------------------------------
def read_report(run_dir) -> dict:
    """The run summary's `methods.batchnorm` section of a finished run, or one clear ConfigError."""
    run = Path(run_dir)
    path = RunFiles(run).summary
    if not run.is_dir():
        raise ConfigError(f"{run}: not a run folder ({'not found' if not run.exists() else 'a file'})")
    if not path.is_file():
        raise ConfigError(f"{run}: not a finished run folder (no {SUMMARY})")
    try:
        summary = json.loads(safefile.read_bytes(path, "run summary", 64 * safefile.MiB))  # a FIFO, a device: one line
    except (OSError, ValueError, RecursionError) as exc:
        raise ConfigError(f"{path}: not readable JSON ({type(exc).__name__})") from None
    section = summary.get("methods", {}).get("batchnorm") if isinstance(summary, dict) else None
    if not isinstance(section, dict):
        raise ConfigError(f"{run}: the run was trained without the batchnorm method, so there is no bn report; "
                          "add `methods: [{name: batchnorm, policy: train}]` to its recipe")
    return section


def _layer_table(layers: dict) -> list[str]:
    w = max(len("layer"), *(len(k) for k in layers))
    lines = [f"{'layer':<{w}}  channels  mean_shift  max_mean_shift  var_ratio"]
    for name, x in layers.items():
        lines.append(f"{name:<{w}}  {x['channels']:>8}  {x['mean_shift']:>10.4f}  {x['max_mean_shift']:>14.4f}  "
                     f"{x['var_ratio']:>9.4f}")
    return lines


def verdict(r: dict) -> str:
    """The report's one-line conclusion from the eval- vs train-mode validation accuracy."""
    if "val_accuracy_eval_mode" not in r:
        return "verdict: not measured (no validation split, or not a classification task)"
    gap, allowed = r["mode_gap"], r["warn_gap"]
    if r.get("warned") and gap > 0:
        return (f"verdict: eval-mode accuracy is {gap:.4f} below train-mode on the validation split: drift; try "
                "recompute or domain statistics (docs/finetuning.md)")
    if r.get("warned"):
        return (f"verdict: train-mode accuracy (batch {r['train_mode_batch_size']}) is {-gap:.4f} below eval-mode on "
                "the validation split: batch statistics that small are noisy, not drift; try freeze_stats or groupnorm "
                "(docs/finetuning.md)")
    return (f"verdict: no drift: eval-mode and train-mode accuracy on the validation split are within warn_gap "
            f"{allowed} (gap {gap:+.4f})")


def format_report(r: dict) -> str:
    extra = {"momentum": "momentum", "groups": "groups", "domain": "domain", "domain_stats": "statistics",
             "recomputed_on_samples": "recomputed on"}
    head = f"BatchNorm policy: {r.get('policy')}" + "".join(
        f", {label} {r[k]}" for k, label in extra.items() if k in r)
    lines = [head]
    if r.get("groupnorm_layers"):
        lines.append(f"{r['groupnorm_layers']} BatchNorm layers were swapped for GroupNorm: no running statistics")
    layers = r.get("layers") or {}
    if layers and not r.get("domains"):  # under policy domain, the run's own domain's table below is this one
        lines += _layer_table(layers)
        lines.append("(shift from the starting weights: mean_shift in starting standard deviations; var_ratio 1 = unchanged)")
    for key, table in (r.get("domains") or {}).items():
        lines.append(f"domain {key}{' (this run)' if key == r.get('domain') else ' (carried over)'}:")
        lines += _layer_table(table) if table else ["(no layers)"]
    if r.get("domains"):
        lines.append("(domains: shift from the pre-trained statistics, which any other domain key is served with)")
    if "val_accuracy_eval_mode" in r:
        lines.append(f"validation accuracy: eval mode {r['val_accuracy_eval_mode']:.4f}, train mode "
                     f"{r['val_accuracy_train_mode']:.4f} (batch {r['train_mode_batch_size']}), gap {r['mode_gap']:+.4f}")
    lines.append(verdict(r))
    return "\n".join(lines)
