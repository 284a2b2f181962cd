"""Magnitude pruning on a gradual schedule: unstructured (single weights) or structured (whole
channels of a Conv1d, neurons of a Linear, physically removed).

    methods:
      - name: prune
        kind: structured        # or unstructured
        amount: 0.5             # final fraction of channels (structured) or weights (unstructured)
        start_step: 0
        end_step: 200           # None: half the planned steps
        every: 10               # steps between stages
        schedule: cubic         # s(t) = amount * (1 - (1 - (t - start) / (end - start))^3); or linear
        scope: global           # unstructured: one threshold for all layers, or `layer`
        norm: 1                 # structured: channels ranked by the L1 (or L2) norm of their weights

The masks are computed by `torch.nn.utils.prune` (`L1Unstructured`, `LnStructured`); a pruned weight
stays zero (its gradient is masked after backward, the weight after each optimizer step).

Unstructured: zeros in dense tensors. The dense kernels still multiply them, so the ledger's
measured FLOPs do not fall, and the summary says so (`dense_flops_cut: false`). The masks ride in the
method's checkpoint state; the model keeps its own parameter names (no `weight_orig` /
`weight_mask` reparametrisation, so nothing needs `prune.remove`): resume, the best weights,
`ecotrain eval` and `--init-from` load it like any model, with its zeros.

Structured (the built-in `mlp` and `cnn` models): each stage rebuilds the pruned layers smaller
(the producer's output channels and the next layer's inputs, the optimizer's moments sliced with
them) and calls `state.flops_changed()`: the ledger measures the smaller step again, so the saving
is real and counted. The model's `state_dict` keeps the original shapes (pruned channels as zeros)
plus a `prune_out` / `prune_in` mask per layer, and loading one shrinks the layers to its masks:
a checkpoint, the best weights and model.safetensors all load into a freshly built model (resume,
`ecotrain eval`). export.safetensors holds the physically small tensors.

The best weights are those at the final sparsity: the best-so-far is reset when it is reached.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

import torch
import torch.nn.utils.prune as tprune
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from ecotrain.base.errors import ConfigError
from ecotrain.base.log import log
from ecotrain.methods.base import Method
from ecotrain.models.vision1d import MLP, ConvBase


def target_sparsity(step: int, start: int, end: int, amount: float, schedule: str = "cubic") -> float:
    """The sparsity the schedule asks for after `step` optimizer steps."""
    if step <= start:
        return 0.0
    if step >= end:
        return amount
    f = (step - start) / (end - start)
    return amount * (f if schedule == "linear" else 1.0 - (1.0 - f) ** 3)


def is_stage(step: int, start: int, end: int, every: int) -> bool:
    return start < step <= end and ((step - start) % every == 0 or step == end)


def forward_flops(model: nn.Module, x: torch.Tensor) -> int:
    """Measured forward FLOPs of `model` on `x` (eval mode, no RNG drawn)."""
    was = model.training
    model.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(x)
    finally:
        model.train(was)
    return int(counter.get_total_flops())


# -- structured: layers that shrink -----------------------------------------------------------
def channel_pairs(model: nn.Module) -> list[tuple[str, nn.Module, nn.Module, int]]:
    """(name, producer, consumer, inputs per channel) for the built-in models: the producer's output
    channels are prunable, and the consumer's matching inputs go with them."""
    if isinstance(model, ConvBase):
        c3, lin = model.conv3, model.linear
        return [("conv1", model.conv1, model.conv2, 1), ("conv2", model.conv2, c3, 1),
                ("conv3", c3, lin, lin.in_features // c3.out_channels)]
    if isinstance(model, MLP):
        lin = [(f"net.{i}", m) for i, m in enumerate(model.net) if isinstance(m, nn.Linear)]
        return [(n, m, nxt, 1) for (n, m), (_, nxt) in zip(lin, lin[1:])]
    raise ConfigError(f"methods.prune kind=structured: supports the built-in mlp and cnn models, not "
                      f"{type(model).__name__} (a channel cut must follow skip connections and norms there); "
                      "use kind: unstructured")


def _resize(module: nn.Module, weight: torch.Tensor, bias) -> None:
    """Give `module` new parameters of these shapes (a Conv1d or Linear, fields kept consistent); a
    frozen layer stays frozen."""
    module.weight = nn.Parameter(weight, requires_grad=module.weight.requires_grad)
    if bias is not None:
        module.bias = nn.Parameter(bias, requires_grad=module.bias.requires_grad)
    if isinstance(module, nn.Linear):
        module.out_features, module.in_features = weight.shape
    else:
        module.out_channels, module.in_channels = weight.shape[0], weight.shape[1] * module.groups


def _pad_hook(module, sd, prefix, _meta) -> None:
    """state_dict: the original shapes, pruned channels as zeros (a fresh model loads it)."""
    out, inp = getattr(module, "prune_out", None), getattr(module, "prune_in", None)
    w = sd[prefix + "weight"]
    if out is not None and out.numel() != w.shape[0]:
        full = w.new_zeros((out.numel(), *w.shape[1:]))
        full[out] = w
        w = full
        if module.bias is not None:
            b = sd[prefix + "bias"]
            fb = b.new_zeros(out.numel())
            fb[out] = b
            sd[prefix + "bias"] = fb
    if inp is not None and inp.numel() != w.shape[1]:
        full = w.new_zeros((w.shape[0], inp.numel(), *w.shape[2:]))
        full[:, inp] = w
        w = full
    sd[prefix + "weight"] = w


def _fit_hook(module, sd, prefix, *_rest) -> None:
    """load_state_dict: shrink (or grow) the layer to the incoming masks, then load the kept entries."""
    w = sd.get(prefix + "weight")
    if w is None:
        return
    b = sd.get(prefix + "bias")
    out, inp = sd.get(prefix + "prune_out"), sd.get(prefix + "prune_in")
    if out is not None and w.shape[0] == out.numel() != int(out.sum()):
        keep = out.to(w.device)
        w, b = w[keep], (b[keep] if b is not None else None)
    if inp is not None and w.shape[1] == inp.numel() != int(inp.sum()):
        w = w[:, inp.to(w.device)]
    sd[prefix + "weight"] = w
    if b is not None:
        sd[prefix + "bias"] = b
    if tuple(module.weight.shape) != tuple(w.shape):
        like = module.weight
        _resize(module, torch.empty(w.shape, dtype=like.dtype, device=like.device),
                None if b is None else torch.empty(b.shape, dtype=like.dtype, device=like.device))


def _kept(mask: torch.Tensor, sel: torch.Tensor) -> torch.Tensor:
    """The full-size mask after keeping `sel` (indices into the currently kept positions)."""
    pos = mask.nonzero().squeeze(1)
    new = torch.zeros_like(mask)
    new[pos[sel]] = True
    return new


def _record(swaps: dict, old, new, fn) -> None:
    """id(the optimizer's parameter) -> (its replacement, slicer); a layer cut twice in one stage
    (a middle conv: its inputs, then its outputs) composes the two cuts."""
    for k, (n, f) in swaps.items():
        if n is old:
            swaps[k] = (new, lambda t, f=f, g=fn: g(f(t)))
            return
    swaps[id(old)] = (new, fn)


# -- the method -------------------------------------------------------------------------------
class Prune(Method):
    needs = ("xy",)  # (x, y) tensor batches of a classification-like task (assemble.check_methods_fit)
    def __init__(self, cfg, run, trained=None):
        self.key, self.cfg = "prune", cfg
        self.structured = cfg.kind == "structured"
        others = {m.name for m in run.methods} & {"ema", "qat"}
        if others:
            raise ConfigError(f"methods.prune: not combined with {sorted(others)[0]} here (it keeps its own copy or "
                              "swaps the layers that pruning changes); use one of them")
        if self.structured and run.distributed.strategy != "none":
            raise ConfigError("methods.prune kind=structured: one process only (the layers change shape while "
                              "training); use kind: unstructured under torchrun")
        self.start, self.end = cfg.start_step, cfg.end_step
        self.sparsity = 0.0  # the last stage's target
        self.masks: dict[str, torch.Tensor] = {}  # unstructured: module name -> weight mask
        self.model: nn.Module | None = None
        self.x0: torch.Tensor | None = None
        self.facts: dict = {}
        self._owner: dict[int, tuple[nn.Module, str]] = {}  # id(param) -> (layer, name): the optimizer's swaps

    # -- which layers ------------------------------------------------------------------------
    def _wanted(self, name: str) -> bool:
        return not self.cfg.modules or any(fnmatchcase(name, g) or fnmatchcase(name, g + ".*")
                                           for g in self.cfg.modules)

    def transform(self, model):
        self.model = model
        self.facts["parameters_before"] = sum(p.numel() for p in model.parameters())
        if self.structured:
            self.pairs = [p for p in channel_pairs(model) if self._wanted(p[0])]
            for _, prod, cons, _ in self.pairs:
                prod.register_buffer("prune_out", torch.ones(prod.weight.shape[0], dtype=torch.bool,
                                                             device=prod.weight.device))
                cons.register_buffer("prune_in", torch.ones(cons.weight.shape[1], dtype=torch.bool,
                                                            device=cons.weight.device))
            layers = {id(m): m for _, prod, cons, _ in self.pairs for m in (prod, cons)}.values()
            for m in layers:
                m.register_state_dict_post_hook(_pad_hook)
                m.register_load_state_dict_pre_hook(_fit_hook)
                self._own(m)
        else:
            self.layers = {n: m for n, m in model.named_modules()
                           if isinstance(m, (nn.Conv1d, nn.Linear)) and self._wanted(n)}
        if not (self.pairs if self.structured else self.layers):
            raise ConfigError(f"methods.prune.modules: {self.cfg.modules} match no prunable layer "
                              f"(names look like {', '.join(n for n, _ in model.named_modules() if n)[:200]})")
        return model

    def _own(self, m: nn.Module) -> None:
        for attr in ("weight", "bias"):
            if getattr(m, attr, None) is not None:
                self._owner[id(getattr(m, attr))] = (m, attr)

    def data(self, source, sampler):
        self.x0, _ = source.take(torch.tensor([0]))  # one sample: FLOPs per sample, before and after
        self.x0 = self.x0.to(next(self.model.parameters()).device)
        self.facts["forward_flops_per_sample_before"] = forward_flops(self.model, self.x0)
        return source, sampler

    # -- per step ----------------------------------------------------------------------------
    def on_fit_start(self, state):
        if self.end is None:
            self.end = max(self.start + 1, state.total_steps // 2)
        if self.structured:
            self._sync_optimizer(state.optimizer, {})  # a resume rebuilt the layers at load: point the optimizer at them

    def on_after_backward(self, state):
        for name, mask in self.masks.items():
            g = self.layers[name].weight.grad
            if g is not None:
                g.mul_(mask)

    @torch.no_grad()
    def on_step_end(self, state):
        if is_stage(state.step, self.start, self.end, self.cfg.every):
            self._stage(target_sparsity(state.step, self.start, self.end, self.cfg.amount, self.cfg.schedule), state)
        for name, mask in self.masks.items():  # Adam's moments would move a pruned weight again
            self.layers[name].weight.mul_(mask)

    @torch.no_grad()
    def _stage(self, s: float, state) -> None:
        if s <= self.sparsity:
            return
        self.sparsity = s
        if self.structured:
            self._shrink(s, state)
        else:
            self._mask(s)
        if s >= self.cfg.amount and state is not None:
            # the best weights must be at the final sparsity: a denser best would undo the pruning
            state.best_metric = state.best_step = state.best_weights = None
            state.evals_since_best = 0
            self.facts["final_sparsity_step"] = state.step
            log.info(f"prune: final sparsity {s:.2f} reached at step {state.step}; best weights tracked from here")

    def _mask(self, s: float) -> None:
        weights = {n: m.weight.detach() for n, m in self.layers.items()}
        if self.cfg.scope == "global":
            flat = torch.cat([w.abs().flatten() for w in weights.values()])  # zeros (pruned) rank first
            mask = tprune.L1Unstructured(round(s * flat.numel())).compute_mask(flat, torch.ones_like(flat))
            out, i = {}, 0
            for n, w in weights.items():
                out[n] = mask[i:i + w.numel()].view_as(w).bool()
                i += w.numel()
        else:
            out = {n: tprune.L1Unstructured(round(s * w.numel())).compute_mask(w.abs(), torch.ones_like(w)).bool()
                   for n, w in weights.items()}
        self.masks = out
        for n, m in out.items():
            self.layers[n].weight.mul_(m)

    def _shrink(self, s: float, state) -> None:
        swaps: dict = {}
        for _, prod, cons, group in self.pairs:
            n_full, cur = prod.prune_out.numel(), prod.weight.shape[0]
            drop = cur - max(1, n_full - round(s * n_full))
            if drop <= 0:
                continue
            w = prod.weight.detach()
            mask = tprune.LnStructured(drop, n=self.cfg.norm, dim=0).compute_mask(w, torch.ones_like(w))
            sel = mask.reshape(cur, -1).any(1).nonzero().squeeze(1)
            cols = sel if group == 1 else (sel[:, None] * group + torch.arange(group, device=sel.device)).flatten()
            self._replace(prod, sel, 0, swaps)
            prod.prune_out = _kept(prod.prune_out, sel)
            self._replace(cons, cols, 1, swaps)
            cons.prune_in = _kept(cons.prune_in, cols)
        if swaps and state is not None:
            self._sync_optimizer(state.optimizer, swaps)
            state.flops_changed()  # the ledger measures the smaller step again

    def _replace(self, m: nn.Module, idx: torch.Tensor, dim: int, swaps: dict) -> None:
        old_w, old_b = m.weight, m.bias
        w = old_w.detach().index_select(dim, idx).clone()
        b = old_b.detach().index_select(0, idx).clone() if (old_b is not None and dim == 0) else None
        _resize(m, w, b)
        _record(swaps, old_w, m.weight, lambda t, d=dim, i=idx: t.index_select(d, i))
        if b is not None:
            _record(swaps, old_b, m.bias, lambda t, i=idx: t.index_select(0, i))

    def _sync_optimizer(self, opt, swaps: dict) -> None:
        """Point the optimizer at the layers' current parameters. `swaps`: id(old) -> (new, slicer of
        its moments), from a stage; otherwise a load rebuilt the layers and the moments (loaded from
        the same checkpoint) already have the new shapes."""
        for group in opt.param_groups:
            for i, p in enumerate(group["params"]):
                if id(p) in swaps:
                    new, fn = swaps[id(p)]
                elif id(p) in self._owner and getattr(*self._owner[id(p)]) is not p:
                    new, fn = getattr(*self._owner[id(p)]), None
                else:
                    continue
                group["params"][i] = new
                st = opt.state.pop(p, None)
                if st:
                    opt.state[new] = {k: (fn(v) if fn is not None and torch.is_tensor(v) and v.shape == p.shape else v)
                                      for k, v in st.items()}
        self._owner = {}
        for _, prod, cons, _ in self.pairs:
            self._own(prod)
            self._own(cons)

    # -- the end -----------------------------------------------------------------------------
    @torch.no_grad()
    def finalize(self, model, data) -> None:
        if self.sparsity < self.cfg.amount:
            log.warning(f"prune: training stopped at sparsity {self.sparsity:.2f}; pruned to {self.cfg.amount} now, "
                        "without training after it")
            self._stage(self.cfg.amount, None)
        for name, mask in self.masks.items():
            self.layers[name].weight.mul_(mask)
        self.facts["parameters_after"] = sum(p.numel() for p in model.parameters())
        if self.x0 is not None:
            self.facts["forward_flops_per_sample_after"] = forward_flops(model, self.x0)
        self.facts.update(self._sparsity_report())

    def _sparsity_report(self) -> dict:
        if self.structured:
            layers = {n: round(1 - int(p.prune_out.sum()) / p.prune_out.numel(), 4) for n, p, _, _ in self.pairs}
            full = sum(p.prune_out.numel() for _, p, _, _ in self.pairs)
            kept = sum(int(p.prune_out.sum()) for _, p, _, _ in self.pairs)
            return {"sparsity": round(1 - kept / full, 4), "sparsity_of": "channels of the pruned layers",
                    "layers": layers, "dense_flops_cut": True}
        zeros = {n: int((m.weight == 0).sum()) for n, m in self.layers.items()}
        total = {n: m.weight.numel() for n, m in self.layers.items()}
        return {"sparsity": round(sum(zeros.values()) / sum(total.values()), 4),
                "sparsity_of": "weights of the pruned layers",
                "layers": {n: round(zeros[n] / total[n], 4) for n in zeros},
                "nonzero_parameters_after": sum(int((p != 0).sum()) for p in self.model.parameters()),
                "dense_flops_cut": False,
                "note": "unstructured zeros are still multiplied by the dense kernels: the measured FLOPs do not "
                        "fall; the gain is a smaller compressed model, or speed only with sparse kernels"}

    def export(self, model):
        if not self.structured:
            return None
        return {n: t.detach() for n, t in [*model.named_parameters(), *model.named_buffers()]}  # the real shapes

    def summary(self) -> dict:
        return {"kind": self.cfg.kind, "amount": self.cfg.amount, "schedule": self.cfg.schedule,
                "start_step": self.start, "end_step": self.end, **self.facts}

    def state_dict(self) -> dict:
        return {"sparsity": self.sparsity, "end": self.end, "masks": dict(self.masks), "facts": dict(self.facts)}

    def load_state_dict(self, sd: dict) -> None:
        self.sparsity, self.end, self.facts = sd["sparsity"], sd["end"], dict(sd["facts"])
        dev = {n: m.weight.device for n, m in getattr(self, "layers", {}).items()}
        self.masks = {n: m.to(dev.get(n, m.device)).bool() for n, m in sd["masks"].items()}
