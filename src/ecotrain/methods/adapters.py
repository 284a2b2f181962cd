"""Adapter-only updates: LoRA adapters (PEFT) on a frozen backbone.

    methods:
      - name: adapters
        target_modules: [conv2, conv3, linear]   # Linear / Conv1d modules (PEFT matches name suffixes)
        r: 8
        alpha: 16
        train_modules: []      # modules trained in full beside the adapters (PEFT's modules_to_save)
        merge: false           # true: fold the adapters into the weights; model.safetensors is a plain model
        from: runs/v1/adapter  # start from an adapter saved before (PEFT format)

`transform` injects the adapters into the model in place (`peft.inject_adapter_in_model`: no
wrapper, the model stays the user's module; targeted layers' weights move to `<name>.base_layer`),
which leaves only the adapters (and `train_modules`) trainable. At the end of the run the adapter
is written in PEFT's own format, RUN/adapter/adapter_model.safetensors + adapter_config.json, which
`peft.PeftModel.from_pretrained(base_model, "RUN/adapter")` loads; `save_adapter` / `load_adapter`
do the same for any folder (the registry's versions).

PEFT imports transformers (seconds): it is imported here only, when the method is used.

When it helps: many small updates (one adapter per version or per cohort, kilobytes each, the base
shared), and a backbone that must not move. Risks: an adapter changes the same outputs the old
classes use, so on its own it forgets like fine-tuning does in class-incremental updates; low rank
may underfit a real shift. Cost: r * (in + out) parameters per targeted layer; training is cheaper
(no backbone gradients for the optimizer), the forward slightly dearer until merged.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from torch import nn

from ecotrain.base import safefile
from ecotrain.base.errors import CheckpointError, ConfigError
from ecotrain.methods.base import Method

MISSING = "methods.adapters needs PEFT: pip install 'ecotrain[adapters]'"
WEIGHTS, CONFIG = "adapter_model.safetensors", "adapter_config.json"
PREFIX = "base_model.model."  # PeftModel's key prefix: files load with PeftModel.from_pretrained


def _peft():
    # PEFT imports torchao when installed, whose import logs the optional kernels it cannot load and a
    # torch deprecation per Enum: not the user's to act on (as methods/qat.py)
    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        import peft
    except ImportError:
        raise ConfigError(MISSING) from None
    return peft


def lora_config(cfg):
    peft = _peft()
    return peft.LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                           target_modules=list(cfg.target_modules), modules_to_save=list(cfg.train_modules) or None)


def inject(model: nn.Module, config) -> nn.Module:
    """LoRA layers injected in place; every other parameter frozen."""
    peft = _peft()
    try:
        return peft.inject_adapter_in_model(config, model)
    except ValueError as exc:  # e.g. a target module the model does not have
        names = [n for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv1d))]
        raise ConfigError(f"methods.adapters.target_modules: {' '.join(str(exc).split())[:200]} "
                          f"(Linear/Conv1d modules: {names[:10]})") from None


def is_adapted(model: nn.Module) -> bool:
    return isinstance(getattr(model, "peft_config", None), dict) and "default" in model.peft_config


def save_adapter(model: nn.Module, folder: str | Path) -> Path:
    """The model's adapter in PEFT's format, written atomically: a temporary folder beside `folder`,
    renamed over it."""
    from safetensors.torch import save_file

    peft = _peft()
    if not is_adapted(model):
        raise ConfigError("save_adapter: the model holds no PEFT adapter (methods.adapters was not on)")
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    sd = peft.get_peft_model_state_dict(model)
    tensors = {PREFIX + k: v.detach().cpu().contiguous() for k, v in sd.items()}
    config = model.peft_config["default"].to_dict()
    config = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    try:
        save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt"})
        (tmp / CONFIG).write_text(json.dumps(config, indent=2, default=str))
        for f in (WEIGHTS, CONFIG):
            with safefile.open_regular(tmp / f, "adapter file", error=CheckpointError) as fh:
                os.fsync(fh.fileno())
        old = None
        if folder.exists():  # a folder cannot be renamed over a non-empty one: move it aside first
            old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
            os.replace(folder, old)
        os.replace(tmp, folder)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def load_adapter(model: nn.Module, folder: str | Path) -> nn.Module:
    """`model` with the adapter in `folder` (PEFT format): injected first if the model has none."""
    from safetensors.torch import load_file

    peft = _peft()
    folder = Path(folder)
    where = f"adapter {folder}"
    if not (folder / WEIGHTS).is_file() or not (folder / CONFIG).is_file():
        raise CheckpointError(f"{where}: needs {WEIGHTS} and {CONFIG} (PEFT's format)")
    if not is_adapted(model):
        try:
            config = peft.LoraConfig.from_pretrained(str(folder))
        except Exception as exc:
            raise CheckpointError(f"{where}: {CONFIG} is not a LoRA config ({type(exc).__name__}: {exc})") from None
        model = inject(model, config)
    sd = {k[len(PREFIX):] if k.startswith(PREFIX) else k: v for k, v in load_file(
        str(safefile.regular(folder / WEIGHTS, "adapter weights file", error=CheckpointError))).items()}
    result = peft.set_peft_model_state_dict(model, sd)
    missing = [k for k in result.missing_keys if "lora_" in k]
    if result.unexpected_keys or missing:
        raise CheckpointError(f"{where}: the adapter does not fit this model (unexpected {result.unexpected_keys[:4]}, "
                              f"missing {missing[:4]})")
    return model


def merge(model: nn.Module) -> nn.Module:
    """Fold the adapters into the weights, in place: the model's keys are plain again."""
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils.other import ModulesToSaveWrapper

    for name, module in list(model.named_modules()):
        if isinstance(module, BaseTunerLayer):
            module.merge()
            replacement = module.get_base_layer()
        elif isinstance(module, ModulesToSaveWrapper):
            replacement = module.modules_to_save["default"]
        else:
            continue
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, replacement)
    if hasattr(model, "peft_config"):
        del model.peft_config
    return model


class Adapters(Method):
    def __init__(self, cfg, run, trained=None):
        _peft()  # the one line, before anything trains
        if run.distributed.strategy == "fsdp":
            raise ConfigError("methods.adapters: not supported with distributed.strategy=fsdp; use ddp or one process")
        self.key, self.cfg = "adapters", cfg
        if cfg.from_ and not Path(cfg.from_).is_dir():
            raise ConfigError(f"methods.adapters.from: {cfg.from_} is not a folder; give an adapter folder "
                              f"({WEIGHTS} + {CONFIG}), e.g. RUN/adapter")
        self.run_dir, self.is_main = None, True
        self.report: dict = {}

    def transform(self, model):
        if self.cfg.from_:
            model = load_adapter(model, self.cfg.from_)
            for n, p in model.named_parameters():  # load_adapter's config may name other modules to train
                p.requires_grad_("lora_" in n or "modules_to_save" in n)
        else:
            model = inject(model, lora_config(self.cfg))
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        self.report = {"trainable_parameters": trainable,
                       "frozen_parameters": sum(p.numel() for p in model.parameters()) - trainable}
        return model

    def param_groups(self, model):
        return [{"params": [p for p in model.parameters() if p.requires_grad]}]

    def on_fit_start(self, state):
        self.run_dir, self.is_main = state.run_dir, state.dist.is_main

    def finalize(self, model, data):
        if self.run_dir is not None and self.is_main:
            save_adapter(model, Path(self.run_dir) / "adapter")
            self.report["adapter"] = "adapter/"
        if self.cfg.merge:
            merge(model)
            self.report["merged"] = True

    def summary(self) -> dict:
        return self.report
