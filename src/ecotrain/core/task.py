"""What is learned: how a batch goes through the model, the loss and its units, the metrics.

The Task protocol (docs/architecture.md) is the one place that knows what a batch holds:

    forward(model, batch) -> outputs        the model called on the batch's inputs
    loss(outputs, batch, reduction="mean")  a mean over the batch's units ("sum": the sum; "none":
                                            one value per sample, for methods that rank samples)
    units(batch) -> int                     samples, or tokens that count (not padding)
    count_units(batch) -> int | Tensor      optional: the same count, left on the device (no host sync)
    metrics() -> {name: metric}             fresh stateful metrics (metrics.py) for one evaluation,
                                            each updated with (predictions(outputs), targets(batch))
    xy: bool                                optional (False when absent): an `(x, y)` tuple batch is
                                            `model(x)` and target `y`; the loop then calls
                                            `loss(model(x), batch)` without `forward` (its fast path)

`units` is its own call, not part of `loss`: it is read only when a step is cut into micro-batches
(a token count is a host sync). `unit_counts` reads every micro-batch's count in one device->host
copy when the task has `count_units`; a task with `units` alone works unchanged. `normalized_loss`
weights each micro-batch's mean by its share of the effective batch's units, which makes
accumulation exactly one big batch.

Supervised batches: a tuple/list `(x, y)`, `(x1, x2, y)` or `(x, y, meta)` (the last tensor is
the target unless `target` says which; the tensors before it are the model's positional inputs;
anything else rides along), or a dict (the target under `target`, else "labels"/"label"/"y"/
"target"; the other tensor entries are the model's keyword inputs). Inputs nested one level,
`((x1, x2), y)` or `({"a": .., "b": ..}, y)`, reach the model as `model(x1, x2)` and
`model(a=.., b=..)`, as forward's signature expects (`call_model`: a forward of one required
argument gets the tuple whole; a list of strings always goes whole). `ModelLossTask` is the
Hugging Face shape: the model takes the whole dict and returns `outputs.loss`.
"""

from __future__ import annotations

import copy
import functools
import inspect
import math
import weakref
from collections.abc import Mapping
from typing import Any, Callable, Optional, Protocol, Union

import torch
import torch.nn.functional as F

from ecotrain.core import metrics as M
from ecotrain.core.batch import batch_size
from ecotrain.base.errors import ConfigError
from ecotrain.core.chunked_loss import chunked_cross_entropy, is_head_input

TARGET_KEYS = ("labels", "label", "y", "target", "targets")
_HALF = (torch.float16, torch.bfloat16)


class Task(Protocol):
    name: str

    def forward(self, model, batch) -> Any: ...
    def loss(self, outputs, batch, reduction: str = "mean") -> torch.Tensor: ...
    def units(self, batch) -> int: ...
    def metrics(self) -> dict: ...
    def predictions(self, outputs) -> Any: ...
    def targets(self, batch) -> Any: ...


def logits_of(outputs) -> torch.Tensor:
    """The prediction tensor of a model's outputs: itself, or `.logits` (a Hugging Face ModelOutput)."""
    if isinstance(outputs, torch.Tensor):
        return outputs
    if isinstance(outputs, Mapping) and "logits" in outputs:
        return outputs["logits"]
    logits = getattr(outputs, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(outputs, (tuple, list)) and outputs and isinstance(outputs[0], torch.Tensor):
        return outputs[0]
    raise ConfigError(f"task: the model returned {type(outputs).__name__}, not a tensor of predictions "
                      "(nor anything with .logits); return a tensor, or use task.name=model_loss")


def _signature(model) -> tuple[int, Optional[int], frozenset, bool]:
    """(required positional arguments, most positional (None: *args), keyword names, **kwargs) of
    the model's forward; DDP and torch.compile wrappers looked through. Cached per forward function:
    one entry per module class, and one per plain function or instance-patched forward."""
    inner = model
    while hasattr(inner, "module") or hasattr(inner, "_orig_mod"):
        inner = getattr(inner, "_orig_mod", None) or inner.module
    fn = inner.forward if isinstance(inner, torch.nn.Module) else inner
    key = getattr(fn, "__func__", fn)  # a bound method: its class's function, shared by instances
    try:
        hit = _SIGNATURES.get(key)
    except TypeError:  # not weak-referenceable (a functools.partial, a builtin): read it each time
        key, hit = None, None
    if hit is None:
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):  # no signature to read: take inputs as they come
            params = [inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
                      inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)]
        pos = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        hit = (sum(p.default is p.empty for p in pos),
               None if any(p.kind == p.VAR_POSITIONAL for p in params) else len(pos),
               frozenset(p.name for p in params if p.kind != p.VAR_POSITIONAL),
               any(p.kind == p.VAR_KEYWORD for p in params))
        if key is not None:
            _SIGNATURES[key] = hit
    return hit


_SIGNATURES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # a user's function, freed with it


def call_model(model, inputs):
    """The model on one nested input, as its forward expects: a dict as keywords when forward names
    its keys (or takes **kwargs), else whole; a tuple/list of tensors spread as positional
    arguments when forward takes that many (one required argument: whole); anything else whole."""
    if isinstance(inputs, Mapping):
        _, _, names, var_kw = _signature(model)
        return model(**inputs) if var_kw or set(inputs) <= names else model(inputs)
    if not (isinstance(inputs, (tuple, list)) and inputs and all(isinstance(v, torch.Tensor) for v in inputs)):
        return model(inputs)  # a list of strings for a text model, say
    required, most, _, _ = _signature(model)
    if required == 1:
        return model(inputs)
    if required <= len(inputs) and (most is None or len(inputs) <= most):
        return model(*inputs)
    raise ConfigError(f"task: a batch's inputs are a {type(inputs).__name__} of {len(inputs)} tensors, but "
                      f"{type(model).__name__}.forward takes {required} required positional arguments; write "
                      f"each item as (x1, ..., y) or ((x1, ...), y) with one input per forward argument")


class SupervisedTask:
    """Inputs and a target taken from the batch; subclasses say what the loss and metrics are."""

    name = "supervised"

    def __init__(self, target: Union[int, str, None] = None):
        self.target = target
        self.xy = target is None  # an (x, y) pair is model(x) and y, with no inspection (loop's plain step)

    # -- the batch's parts ---------------------------------------------------------------------
    def _target_index(self, batch) -> int:
        if self.target is not None:
            return int(self.target) if not isinstance(self.target, str) else -1
        for i in range(len(batch) - 1, -1, -1):
            if isinstance(batch[i], torch.Tensor):
                return i
        raise ConfigError("task: the batch holds no tensor to use as the target")

    def _target_key(self, batch: Mapping):
        if self.target is not None:
            if self.target not in batch:
                raise ConfigError(f"task.target: '{self.target}' is not a key of the batch (keys: {sorted(batch)[:8]})")
            return self.target
        for k in TARGET_KEYS:
            if k in batch:
                return k
        raise ConfigError(f"task: a dict batch needs its target under one of {list(TARGET_KEYS)} or task.target "
                          f"(keys: {sorted(batch)[:8]}); or task.name=model_loss when the model computes its loss")

    def inputs(self, batch) -> tuple[tuple, dict]:
        """(positional, keyword) inputs of the model."""
        if isinstance(batch, Mapping):
            key = self._target_key(batch)
            return (), {k: v for k, v in batch.items() if k != key and isinstance(v, torch.Tensor)}
        if isinstance(batch, (tuple, list)):
            t = self._target_index(batch) % len(batch)
            if t == 1 and isinstance(batch[0], (Mapping, tuple, list)):  # nested inputs: call_model's rule
                return (batch[0],), None
            return tuple(v for v in batch[:t] if isinstance(v, torch.Tensor)), {}
        raise ConfigError(f"task: a supervised batch is a tuple (x, y) or a dict with a target, "
                          f"got {type(batch).__name__}")

    def targets(self, batch):
        if self.xy and type(batch) is tuple and len(batch) == 2:
            return batch[1]
        if isinstance(batch, Mapping):
            return batch[self._target_key(batch)]
        return batch[self._target_index(batch)]

    def forward(self, model, batch):
        if self.xy and type(batch) is tuple and len(batch) == 2 and type(batch[0]) is torch.Tensor:
            return model(batch[0])  # (x, y): no inspection
        args, kwargs = self.inputs(batch)
        if kwargs is None:  # one nested input
            return call_model(model, args[0])
        return model(*args, **kwargs)

    def predictions(self, outputs):
        return logits_of(outputs)

    def units(self, batch) -> int:
        return len(self.targets(batch))

    def metrics(self) -> dict:
        return {}


def _full(out: torch.Tensor) -> torch.Tensor:
    """fp16/bf16 outputs (autocast) in fp32 for the loss; fp32 and fp64 as they are."""
    return out.float() if out.dtype in _HALF or not out.is_floating_point() else out


def _reduce(per_sample: torch.Tensor, reduction: str) -> torch.Tensor:
    return per_sample.mean() if reduction == "mean" else per_sample.sum() if reduction == "sum" else per_sample


class ClassificationTask(SupervisedTask):
    """Multi-class: logits [b, C], integer targets [b]; cross-entropy, accuracy."""

    name = "classification"

    def __init__(self, label_smoothing: float = 0.0, target=None, num_classes: Optional[int] = None):
        super().__init__(target)
        self.label_smoothing, self.num_classes = label_smoothing, num_classes

    def loss(self, out, batch, reduction: str = "mean") -> torch.Tensor:
        y = batch[1] if self.xy and type(batch) is tuple and len(batch) == 2 else self.targets(batch)
        out = out if type(out) is torch.Tensor else logits_of(out)
        if out.dtype in _HALF:
            out = out.float()  # fp32 softmax under autocast
        return F.cross_entropy(out, y, reduction=reduction, label_smoothing=self.label_smoothing)

    def units(self, batch) -> int:
        return self.targets(batch).shape[0]

    def metrics(self) -> dict:
        out = {"accuracy": M.Accuracy(ignore=False)}
        if self.num_classes:
            out["f1"] = M.F1Score(self.num_classes)
        return out


class MultiLabelTask(SupervisedTask):
    """Several labels per sample: logits [b, L], 0/1 targets [b, L]; binary cross-entropy per label."""

    name = "multilabel"

    def __init__(self, threshold: float = 0.5, target=None):
        super().__init__(target)
        self.threshold = threshold

    def loss(self, out, batch, reduction: str = "mean") -> torch.Tensor:
        out = _full(logits_of(out))
        y = self.targets(batch).to(out.dtype)
        per_sample = F.binary_cross_entropy_with_logits(out, y, reduction="none").flatten(1).mean(1)
        return _reduce(per_sample, reduction)

    def metrics(self) -> dict:
        return {"accuracy": M.Accuracy(multilabel=True, threshold=self.threshold)}


class RegressionTask(SupervisedTask):
    """Real-valued targets [b] or [b, k]: MSE, L1 or Huber loss; MSE, MAE and R2 over the split."""

    name = "regression"
    LOSSES = {"mse": F.mse_loss, "l1": F.l1_loss, "huber": F.huber_loss}

    def __init__(self, loss: str = "mse", target=None):
        super().__init__(target)
        if loss not in self.LOSSES:
            raise ConfigError(f"task.loss: '{loss}' is not one of {sorted(self.LOSSES)}")
        self.kind, self.fn = loss, self.LOSSES[loss]

    def loss(self, out, batch, reduction: str = "mean") -> torch.Tensor:
        y = self.targets(batch)
        out = _full(logits_of(out))
        if out.shape != y.shape:
            if out.numel() != y.numel():
                raise ConfigError(f"task=regression: the model's output {tuple(out.shape)} does not match the "
                                  f"target {tuple(y.shape)}; give the model one output per target value")
            out = out.reshape(y.shape)
        per_sample = self.fn(out, y.to(out.dtype), reduction="none").reshape(len(y), -1).mean(1)
        return _reduce(per_sample, reduction)

    def metrics(self) -> dict:
        return {"mse": M.MeanSquaredError(), "mae": M.MeanAbsoluteError(), "r2": M.R2Score()}


class SequenceTask(SupervisedTask):
    """A label per position (tagging): `out [b, T, C]`, `y [b, T]`, padded targets = -100 (skipped).

    The units are the non-padding target tokens, so the loss is a mean per token and
    `normalized_loss` stays exact under accumulation however the padding falls."""

    name = "sequence"
    IGNORE = M.IGNORE

    def units(self, batch) -> int:
        return int(self.count_units(batch))

    def count_units(self, batch) -> torch.Tensor:
        return (self.targets(batch) != self.IGNORE).sum()

    def loss(self, out, batch, reduction: str = "mean") -> torch.Tensor:
        y = batch[1] if self.xy and type(batch) is tuple and len(batch) == 2 else self.targets(batch)
        if is_head_input(out):  # memory.chunked_loss: the head's input, the logits computed chunk by chunk
            return chunked_cross_entropy(out, y, reduction)
        out = logits_of(out)
        out = out.float() if out.dtype in _HALF else out  # fp32 softmax under autocast
        return F.cross_entropy(out.flatten(0, 1), y.reshape(-1), ignore_index=self.IGNORE, reduction=reduction)

    def metrics(self) -> dict:
        return {"accuracy": M.Accuracy()}


def _nats(out, y):
    out = out.float()
    nats = F.cross_entropy(out.flatten(0, 1), y.reshape(-1), ignore_index=M.IGNORE, reduction="sum")
    return nats / math.log(2), (y != M.IGNORE).sum()


class LanguageModelTask(SequenceTask):
    """Next-token prediction: a SequenceTask whose metrics add, from one cross-entropy per batch,
    bits per token (`bits_per_char`: byte-level data's name), perplexity (exp of the mean token loss,
    = exp(val_loss)) and, when the data says its bytes per token, bits per byte (bits per token x
    tokens per byte: comparable across tokenizers)."""

    name = "language_model"

    def __init__(self, target=None, bytes_per_token: Optional[float] = None):
        super().__init__(target)
        if bytes_per_token is not None and not bytes_per_token > 0:
            raise ConfigError(f"task: bytes_per_token must be above 0 (got {bytes_per_token!r})")
        self.bytes_per_token = bytes_per_token

    def metrics(self) -> dict:
        bits = M.TokenLoss(_nats)  # (bits, tokens) per batch, shared by the figures below
        out = {"accuracy": M.Accuracy(), "bits_per_char": M.MeanTokenLoss(bits, float),
               "perplexity": M.MeanTokenLoss(bits, M.perplexity_of_bits)}
        if self.bytes_per_token:
            per_byte = 1.0 / self.bytes_per_token
            out["bits_per_byte"] = M.MeanTokenLoss(bits, lambda b: b * per_byte)
        return out


class ModelLossTask:
    """The model computes its own loss (Hugging Face: `model(**batch).loss`, with `labels` in the
    batch). Units are samples (`tokens=True`: the labels that are not -100), so accumulation is
    exact when the model's loss is a mean over them, as Hugging Face's are."""

    name = "model_loss"

    def __init__(self, tokens: bool = False, label_key: str = "labels"):
        self.tokens, self.label_key = tokens, label_key

    def forward(self, model, batch):
        if isinstance(batch, Mapping):
            return model(**batch)
        if isinstance(batch, (tuple, list)):
            return model(*batch)
        return model(batch)

    def loss(self, outputs, batch, reduction: str = "mean") -> torch.Tensor:
        if isinstance(outputs, Mapping) and "loss" in outputs:
            loss = outputs["loss"]
        elif isinstance(getattr(outputs, "loss", None), torch.Tensor):
            loss = outputs.loss
        elif isinstance(outputs, torch.Tensor) and outputs.ndim == 0:
            loss = outputs
        else:
            raise ConfigError(f"task=model_loss: the model returned {type(outputs).__name__} without a loss; "
                              "pass the labels in the batch (Hugging Face: 'labels'), or pick another task.name")
        if reduction == "mean":
            return loss
        if reduction == "sum":
            return loss * unit_count(self, batch)  # a token count stays on the device (loop.evaluate)
        raise ConfigError("task=model_loss: per-sample losses are not available (the model reduces its own loss); "
                          "this method needs a task whose loss ecotrain computes")

    def targets(self, batch):
        return batch.get(self.label_key) if isinstance(batch, Mapping) else None

    def predictions(self, outputs):
        return logits_of(outputs)

    def units(self, batch) -> int:
        return int(self.count_units(batch))

    def count_units(self, batch) -> Union[int, torch.Tensor]:
        y = self.targets(batch)
        if self.tokens and y is not None:
            return (y != M.IGNORE).sum()
        return batch_size(batch)

    def metrics(self) -> dict:
        return {"accuracy": M.Accuracy()}


class UserTask(SupervisedTask):
    """A user's mean-reduced loss `loss_fn(outputs, target)` and metrics: stateful objects, or
    functions `fn(outputs, target) -> batch mean`."""

    name = "user"

    def __init__(self, loss_fn: Callable, metrics: Optional[Mapping] = None, target=None):
        super().__init__(target)
        self.loss_fn, self.user_metrics = loss_fn, dict(metrics or {})

    def loss(self, out, batch, reduction: str = "mean"):
        y = self.targets(batch)
        mean = self.loss_fn(out, y)
        return mean if reduction == "mean" else mean * len(y)

    def predictions(self, outputs):
        return outputs

    def metrics(self) -> dict:
        return user_metrics(self.user_metrics)


def user_metrics(given: Mapping) -> dict:
    """A user's metrics for one evaluation: a stateful object copied afresh (never shared between two
    evaluations), a plain function wrapped in `metrics.BatchMean`."""
    return {k: M.as_metric(copy.deepcopy(m) if not callable(m) or hasattr(m, "update") else m)
            for k, m in given.items()}


def _owner(cls: type, name: str) -> Optional[type]:
    return next((c for c in cls.__mro__ if name in vars(c)), None)


@functools.cache
def _counts_on_device(cls: type) -> bool:
    """`cls.count_units` is at least as derived as its `units`: a subclass that redefines `units`
    alone is counted by its own `units`, never by an inherited `count_units` that disagrees."""
    counter, units = _owner(cls, "count_units"), _owner(cls, "units")
    return counter is not None and units is not None and issubclass(counter, units)


def unit_count(task, batch) -> Union[int, torch.Tensor]:
    """A batch's units: `task.count_units` (a tensor left on the device) where the task has one, else
    `task.units`."""
    return task.count_units(batch) if _counts_on_device(type(task)) else task.units(batch)


def unit_counts(task, pieces) -> list[int]:
    """Each micro-batch's units as Python numbers, with one device->host copy for all of them."""
    counts = [unit_count(task, p) for p in pieces]
    on_device = [c.reshape(()) for c in counts if isinstance(c, torch.Tensor)]
    if not on_device:
        return counts
    read = iter(torch.stack(on_device).tolist())  # the step's one host sync for its unit counts
    return [next(read) if isinstance(c, torch.Tensor) else c for c in counts]


def normalized_loss(task, out, batch, total_units: int | None, units: int | None = None) -> torch.Tensor:
    """The one place where a micro-batch's loss is scaled for accumulation
    (`total_units` None: the micro-batch is the whole batch; `units`: this micro-batch's count, read
    with the others by `unit_counts`, else `task.units(batch)`)."""
    loss = task.loss(out, batch)
    if total_units is None:
        return loss
    n = task.units(batch) if units is None else units
    if n == 0:  # a piece of padding only: its mean is 0/0; it adds nothing (and keeps the graph)
        return loss.nan_to_num(0.0) * 0.0
    return loss if n == total_units else loss * (n / total_units)


TASKS = {"classification": ClassificationTask, "multilabel": MultiLabelTask, "regression": RegressionTask,
         "sequence": SequenceTask, "language_model": LanguageModelTask, "model_loss": ModelLossTask}


def build_task(cfg, sample=None, lm: bool = False, num_classes: Optional[int] = None,
               bytes_per_token: Optional[float] = None):
    """The task `cfg.task` names; `auto` reads it off one batch (`sample`): a dict batch is a model
    that returns its loss, a float target is regression, a [b, T] integer target is sequence
    labelling, else classification. `lm`, `bytes_per_token`: what the data says of itself."""
    t = cfg.task
    name = t.name
    if name == "auto":
        name = "language_model" if lm else _infer(sample, t.target)
    if name == "classification":
        return ClassificationTask(cfg.loop.label_smoothing, t.target, num_classes)
    if name == "multilabel":
        return MultiLabelTask(t.threshold, t.target)
    if name == "regression":
        return RegressionTask(t.loss, t.target)
    if name == "model_loss":
        return ModelLossTask()
    if name == "language_model":
        return LanguageModelTask(t.target, bytes_per_token)
    return TASKS[name](target=t.target)


def _infer(sample, target) -> str:
    if sample is None:
        return "classification"
    if isinstance(sample, Mapping) and target is None and not any(k in sample for k in TARGET_KEYS[1:]):
        return "model_loss"  # the Hugging Face shape: {"input_ids", ..., "labels"} into model(**batch)
    try:
        y = SupervisedTask(target).targets(sample)
    except (ConfigError, IndexError, KeyError, TypeError):
        return "model_loss"
    if not isinstance(y, torch.Tensor):
        return "classification"
    if y.is_floating_point():
        return "regression"
    return "sequence" if y.ndim == 2 else "classification"
