"""Elastic weight consolidation (Kirkpatrick et al., 2017), online (Schwarz et al., 2018).

    methods:
      - name: ewc
        beta: 100        # penalty beta * sum_i F_i (theta_i - theta_old_i)^2, logged as loss_ewc
        gamma: 1.0       # online EWC: F = gamma * F_previous + F_this_version
        samples: 1000    # training examples the Fisher is estimated on
        fisher: empirical  # grads of log p(label | x); expected: E over the model's own class probabilities
        from: runs/v1    # the previous version's Fisher and weights (its export.safetensors)

At the end of a run (`finalize`: the final weights, eval mode) the diagonal Fisher information
of every trainable parameter is estimated from per-example gradients (torch.func: vmap of grad)
on a seeded subset of the training data, added to the previous version's decayed Fisher, and
exported with the weights (theta) into export.safetensors under `ewc/fisher/<param>` and
`ewc/theta/<param>`. The next version's `from` reads them; its penalty anchors it at theta.

When it helps: task- and domain-incremental updates, where old and new tasks share the output
units. Risks: in class-incremental updates (new classes in one head) it barely helps (van de Ven
et al.: ~0.20 on Split MNIST, as naive fine-tuning); beta too large freezes the model. Cost: a
per-example gradient pass over `samples` examples per version, two model-sized tensors per version.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ecotrain.base.errors import CheckpointError, ConfigError
from ecotrain.methods.base import Method
from ecotrain.methods.replay import check_pinned, exported_file, file_digest, read_exported

CHUNK = 64  # examples per vmap call: bounds the memory of per-example gradients


def load_anchor(path, where: str = "methods.ewc.from") -> tuple[dict, dict]:
    """({param: Fisher}, {param: theta}) of a previous version."""
    p = exported_file(path, where)
    t = read_exported(p, "ewc", where)
    fisher = {k[len("fisher/"):]: v.float() for k, v in t.items() if k.startswith("fisher/")}
    theta = {k[len("theta/"):]: v.float() for k, v in t.items() if k.startswith("theta/")}
    if not fisher or set(fisher) != set(theta):
        raise CheckpointError(f"{where}: {p}: the Fisher and theta tensors do not name the same parameters; "
                              "the file is damaged")
    return fisher, theta


def penalty(model: torch.nn.Module, fisher: dict, theta: dict) -> torch.Tensor:
    """sum_i F_i (theta_i - theta_old_i)^2 over the anchored parameters."""
    params = dict(model.named_parameters())
    terms = [(fisher[n] * (params[n] - theta[n]).square()).sum() for n in fisher]
    return torch.stack(terms).sum()


def diagonal_fisher(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, kind: str = "empirical") -> dict:
    """Mean over the examples of the squared per-example gradient of log p, per trainable parameter,
    in eval mode (no dropout; BatchNorm's running statistics)."""
    from torch.func import functional_call, grad, vmap

    was = model.training
    model.eval()
    dev = next(model.parameters()).device
    params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    buffers = {n: b.detach() for n, b in model.named_buffers()}

    def nll(p, xi, yi):
        out = functional_call(model, (p, buffers), (xi.unsqueeze(0),))
        return F.cross_entropy(out.float(), yi.unsqueeze(0))

    per_example = vmap(grad(nll), in_dims=(None, 0, 0))
    total = {n: torch.zeros_like(p) for n, p in params.items()}
    try:
        for i in range(0, len(y), CHUNK):
            xb, yb = x[i:i + CHUNK].to(dev), y[i:i + CHUNK].to(dev)
            if kind == "empirical":
                for n, g in per_example(params, xb, yb).items():
                    total[n] += g.square().sum(0)
                continue
            with torch.no_grad():
                probs = model(xb).float().softmax(-1)
            for c in range(probs.shape[-1]):  # E_c~p [grad^2], exactly, class by class
                grads = per_example(params, xb, torch.full_like(yb, c))
                for n, g in grads.items():
                    total[n] += (probs[:, c].reshape(-1, *[1] * (g.dim() - 1)) * g.square()).sum(0)
    finally:
        model.train(was)
    return {n: t / max(1, len(y)) for n, t in total.items()}


class EWC(Method):
    needs = ("xy",)  # (x, y) tensor batches of a classification-like task (assemble.check_methods_fit)
    def __init__(self, cfg, run, trained=None):
        if run.distributed.strategy == "fsdp":
            raise ConfigError("methods.ewc: not supported with distributed.strategy=fsdp (sharded parameters); "
                              "use ddp or one process")
        self.key, self.cfg, self.seed = "ewc", cfg, run.seed
        self.from_path = exported_file(cfg.from_, "methods.ewc.from") if cfg.from_ else None
        self.fisher, self.theta = load_anchor(self.from_path) if self.from_path else ({}, {})
        self.digest = file_digest(self.from_path) if self.from_path else None
        self.new_fisher: Optional[dict] = None
        self.model = None
        self.report: dict = {}

    def transform(self, model):
        self.model = model  # the bare module: its parameters are the ones the optimizer updates
        params = dict(model.named_parameters())
        for n, f in self.fisher.items():
            if n not in params or params[n].shape != f.shape:
                what = "no such parameter" if n not in params else f"shape {tuple(params[n].shape)} here"
                raise CheckpointError(f"methods.ewc.from: {self.from_path}: parameter '{n}' of shape {tuple(f.shape)} "
                                      f"({what}); the previous version must be the same model")
        dev = next(model.parameters()).device
        self.fisher = {n: f.to(dev) for n, f in self.fisher.items()}
        self.theta = {n: t.to(dev) for n, t in self.theta.items()}
        return model

    def loss_terms(self, batch, outputs, state):
        # independent of the batch: the Objective's per-micro-batch shares add up to one penalty per step
        if not self.fisher:
            return {}
        return {"ewc": self.cfg.beta * penalty(self.model, self.fisher, self.theta)}

    def finalize(self, model, data):
        src = data.train
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + 15_485_863)
        idx = torch.randperm(len(src), generator=g)[:self.cfg.samples].sort().values
        x, y = src.take(idx)
        fisher = diagonal_fisher(model, x, y.long(), self.cfg.fisher)
        for n, f in self.fisher.items():  # online EWC: the previous versions' information, decayed
            if n in fisher:
                fisher[n] = fisher[n] + self.cfg.gamma * f.to(fisher[n].device)
        self.new_fisher = fisher
        total = sum(float(f.sum()) for f in fisher.values())
        self.report = {"fisher_samples": len(idx), "fisher_sum": total, "anchored": bool(self.theta)}

    def export(self, model):
        if self.new_fisher is None:
            return None
        params = dict(model.named_parameters())
        out = {f"fisher/{n}": f for n, f in self.new_fisher.items()}
        out.update({f"theta/{n}": params[n].detach() for n in self.new_fisher})
        return out

    def summary(self) -> dict:
        return self.report

    def state_dict(self) -> dict:
        return {"from_digest": self.digest}  # the anchor is `from`'s file, read-only while training

    def load_state_dict(self, sd: dict) -> None:
        check_pinned(sd, "from_digest", self.digest, "methods.ewc.from", self.from_path, "the Fisher")
