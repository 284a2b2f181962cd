"""Quantization-aware training with torchao (`pip install 'ecotrain[qat]'`): the model trains with
fake-quantized Linear layers, so it learns weights that survive int8/int4 quantization.

    methods:
      - name: qat
        weight_dtype: int8        # or int4; activations: int8, dynamic, per token
        group_size: null          # weight scales per group of this many inputs; null: one per output row
        modules: []               # module-name globs; empty: every nn.Linear

The flow is torchao's: `quantize_(model, QATConfig(base, step="prepare"))` at `transform` (on resumed
runs too: the fake-quantized layers keep the parameter names, so a checkpoint loads as is), training,
then `step="convert"` at `finalize`, with base `Int8DynamicActivationIntxWeightConfig`.

Coverage: torchao's QAT swaps `nn.Linear` only. A Conv1d is skipped and listed in the summary
(`skipped_layers`), and `quantized_parameter_fraction` says how much of the model is covered; a glob
in `modules` that names a Conv1d is refused.

What is saved. The converted weights are torchao tensor subclasses, not plain tensors, so
model.safetensors keeps the QAT-trained float weights (loadable by `ecotrain eval`, which prepares the
model again; the test in summary.json is the fake-quantized model's). The converted model goes to
export.safetensors as plain tensors (`qat/<layer>.weight.qdata` int8, `.scale`, `.zero_point`), and
the summary reports its own test accuracy and size in bytes. In this packing format int4 values are
stored one per int8 byte, so int4 is no smaller on disk than int8 here. On CPU the converted model is
smaller, not faster: the dynamic int8 activation quantization costs more than the fp32 matmul saves.
"""

from __future__ import annotations

import copy
import logging
from fnmatch import fnmatchcase

import torch
from torch import nn

from ecotrain.core import loop
from ecotrain.base.errors import ConfigError
from ecotrain.methods.base import Method


def torchao_api():
    """(quantize_, QATConfig, base config class, PerAxis, PerGroup), or one line saying how to install."""
    for name in ("torchao", "torch.utils._pytree"):  # torchao's import logs optional kernels it cannot load
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
        from torchao.quantization.granularity import PerAxis, PerGroup
        from torchao.quantization.qat import QATConfig
    except ImportError as exc:
        raise ConfigError(f"methods.qat: needs torchao ({exc}); install it with: pip install 'ecotrain[qat]'") from None
    return quantize_, QATConfig, Int8DynamicActivationIntxWeightConfig, PerAxis, PerGroup


def stored_bytes(sd: dict) -> int:
    """Bytes of a state dict as stored: a tensor subclass counts its inner tensors (int8 data, scales)."""
    total = 0
    for t in sd.values():
        if hasattr(t, "__tensor_flatten__") and type(t) is not torch.Tensor and not isinstance(t, nn.Parameter):
            names, _ = t.__tensor_flatten__()
            total += sum(getattr(t, n).numel() * getattr(t, n).element_size() for n in names)
        else:
            total += t.numel() * t.element_size()
    return total


def plain_tensors(sd: dict) -> dict:
    """A converted state dict as plain tensors: `<key>.<inner>` for each inner tensor of a subclass."""
    out = {}
    for k, t in sd.items():
        if hasattr(t, "__tensor_flatten__") and type(t) is not torch.Tensor and not isinstance(t, nn.Parameter):
            names, _ = t.__tensor_flatten__()
            out.update({f"{k}.{n}": getattr(t, n).detach() for n in names})
        else:
            out[k] = t.detach()
    return out


class QAT(Method):
    def __init__(self, cfg, run, trained=None):
        self.key, self.cfg = "qat", cfg
        if run.distributed.strategy == "fsdp":
            raise ConfigError("methods.qat: not supported with distributed.strategy=fsdp; use ddp or one process")
        self.api = torchao_api()
        self.targets: list[str] = []
        self.facts: dict = {}
        self.converted: nn.Module | None = None
        self.state = None

    def base_config(self):
        _, _, Base, PerAxis, PerGroup = self.api
        gran = PerGroup(self.cfg.group_size) if self.cfg.group_size else PerAxis(0)
        return Base(weight_dtype=getattr(torch, self.cfg.weight_dtype), weight_granularity=gran)

    def _choose(self, model: nn.Module) -> None:
        mods = dict(model.named_modules())
        weighted = {n: m for n, m in mods.items() if n and isinstance(getattr(m, "weight", None), torch.Tensor)}
        if self.cfg.modules:
            chosen = [n for n in weighted if any(fnmatchcase(n, g) for g in self.cfg.modules)]
            bad = [n for n in chosen if not isinstance(weighted[n], nn.Linear)]
            if bad:
                raise ConfigError(f"methods.qat.modules: '{bad[0]}' is a {type(weighted[bad[0]]).__name__}; torchao's "
                                  "QAT covers nn.Linear only, so it cannot be quantized here")
            if not chosen:
                raise ConfigError(f"methods.qat.modules: {self.cfg.modules} match no layer "
                                  f"(names look like {', '.join(list(weighted)[:8])})")
        else:
            chosen = [n for n, m in weighted.items() if isinstance(m, nn.Linear)]
            if not chosen:
                raise ConfigError("methods.qat: the model has no nn.Linear layer, and torchao's QAT covers only those")
        g = self.cfg.group_size
        for n in chosen:
            if g and weighted[n].in_features % g:
                raise ConfigError(f"methods.qat.group_size: {g} does not divide the {weighted[n].in_features} inputs "
                                  f"of '{n}'; choose a divisor, or group_size: null (one scale per output row)")
        self.targets = chosen
        total = sum(p.numel() for p in model.parameters())
        covered = sum(weighted[n].weight.numel() for n in chosen)
        self.facts.update({
            "weight_dtype": self.cfg.weight_dtype, "group_size": self.cfg.group_size, "quantized_layers": chosen,
            "skipped_layers": {n: type(m).__name__ for n, m in weighted.items() if n not in chosen},
            "quantized_parameter_fraction": round(covered / total, 4)})

    def transform(self, model):
        quantize_, QATConfig = self.api[:2]
        self._choose(model)
        wanted = set(self.targets)
        quantize_(model, QATConfig(self.base_config(), step="prepare"), filter_fn=lambda m, fqn: fqn in wanted)
        return model

    def on_fit_start(self, state):
        self.state = state  # finalize evaluates the converted model with the run's task

    @torch.no_grad()
    def finalize(self, model, data) -> None:
        quantize_, QATConfig = self.api[:2]
        conv = copy.deepcopy(model).cpu().eval()
        float_bytes = stored_bytes(conv.state_dict())
        quantize_(conv, QATConfig(self.base_config(), step="convert"))
        self.converted = conv
        q_bytes = stored_bytes(conv.state_dict())
        self.facts.update({"float_bytes": float_bytes, "converted_bytes": q_bytes,
                           "size_ratio": round(q_bytes / float_bytes, 4),
                           "note": "on CPU the converted model is smaller, not faster"})
        split = "test" if data.test is not None else "val" if data.val is not None else None
        if split and self.state is not None:
            m = loop.evaluate(conv, getattr(data, split), self.state.task, 256, torch.device("cpu"), None,
                              f"converted_{split}")
            self.facts.update({k: round(v, 6) for k, v in m.items()})

    def export(self, model):
        return plain_tensors(self.converted.state_dict()) if self.converted is not None else None

    def summary(self) -> dict:
        return dict(self.facts)
