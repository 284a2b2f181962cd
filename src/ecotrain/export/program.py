"""Tracing a trained model with `torch.export.export` and saving it as `.pt2` (`torch.export.save`).

The input spec is the run's own: one batch of its test split gives the example inputs (what the task
passes the model), the first dimension of every input is dynamic (`batch`), and for the language-model
and sequence tasks the second one too: a language model's from 1 token to its context length
(`context_length`: nanoGPT's and CharLM's `max_len`, a `transformers` config's positions), checked
by the exported program; a sequence task's `Dim.AUTO` (torch.export reads its range off the model). What the file needs to be used without ecotrain's config travels inside it as
`ecotrain.json` (the task, the classes, the input spec, a CSV run's column names).

A model whose forward returns a library's output class (a `transformers` ModelOutput such as
CausalLMOutputWithPast, with its cache) is traced through `tensors_only`: its logits (else its tensors,
as a tuple), so the program's outputs are plain tensors and loading it needs torch alone.

A model that cannot be traced (a Python branch on a tensor's value, a size the model fixes) is one
line naming the line of code and what torch.export asks for instead; nothing is written.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import logging
import re
import traceback
import warnings
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn
from torch.export import Dim, ExportedProgram

from ecotrain.base import safefile
from ecotrain.base import safeload
from ecotrain.core.batch import leaves, tree_map
from ecotrain.core.batch import iter_batches
from ecotrain.base.errors import CheckpointError, ConfigError

SEQUENCE_TASKS = ("language_model", "sequence")  # inputs [batch, T]: T is dynamic too
PT2_MAX_BYTES = 64 << 30  # a .pt2 is read whole into memory (its weights too): past this, not one ecotrain wrote
META_FILE = "ecotrain.json"  # the extra file inside a .pt2 (and the metadata key of an .onnx)
_TORCH_DIR = str(Path(torch.__file__).resolve().parent)


def example_inputs(task, source) -> tuple[tuple, dict]:
    """(args, kwargs) the task passes the model, from the first rows of `source` (at least two: an
    example batch of one would make torch.export specialise the batch dimension to 1)."""
    batch = next(iter(iter_batches(source, 4)), None)
    if batch is None:
        raise ConfigError("export: the split to trace with is empty")
    first = next(iter(leaves(batch)), None)
    copies = 2 if first is not None and first.ndim and first.shape[0] == 1 else 1
    # fresh tensors, not views: traced from a view, the program guards on the view's base and then fails
    # on a plain tensor ('NoneType' object has no attribute 'size')
    batch = tree_map(lambda t: torch.cat([t] * copies) if t.ndim else t.clone(), batch)
    if getattr(task, "xy", False) and type(batch) is tuple and len(batch) == 2 and type(batch[0]) is torch.Tensor:
        return (batch[0],), {}
    inputs = getattr(task, "inputs", None)
    args, kwargs = inputs(batch) if inputs is not None else ((), None)
    if kwargs is None or not (args or kwargs):
        raise ConfigError(f"export: the task '{task.name}' passes the model {type(batch).__name__} batches that are "
                          "not tensors by position or by name (nested inputs, or a model that computes its own "
                          "loss); export the model from Python with torch.export.export")
    return tuple(args), dict(kwargs)


def _plain(out) -> bool:
    """Whether an output is made of what torch.export's output spec holds without another library: tensors
    (and numbers, None) in tuples, lists and dicts of exactly those types."""
    if out is None or isinstance(out, (torch.Tensor, bool, int, float)):
        return True
    if type(out) in (tuple, list):
        return all(_plain(v) for v in out)
    if type(out) is dict:
        return all(isinstance(k, str) and _plain(v) for k, v in out.items())
    return False


def _reduced(out, logits: bool):
    """The output of a model `tensors_only` wraps: `out.logits`, else its tensors as a tuple."""
    if logits:
        return out["logits"] if isinstance(out, Mapping) else out.logits
    values = out.values() if isinstance(out, Mapping) else out
    return tuple(v for v in values if isinstance(v, torch.Tensor))


class TensorOutputs(nn.Module):
    """`model` returning tensors in place of its output object (see `tensors_only`). Its forward takes
    the model's own parameters (signature and all), so the input spec by name still applies."""

    def __init__(self, model: nn.Module, logits: bool):
        super().__init__()
        self.model, self.logits = model, logits

        def forward(*args, **kwargs):
            return _reduced(self.model(*args, **kwargs), self.logits)

        forward.__signature__ = inspect.signature(model.forward)  # type: ignore[attr-defined]
        self.forward = forward


def tensors_only(model: nn.Module, args: tuple, kwargs: dict) -> nn.Module:
    """`model` itself when its outputs on the example inputs are plain tensors; a `TensorOutputs` around it
    when they are an output object (a `transformers` ModelOutput: its `logits`, else the tensors it
    holds, in order; a cache and other objects are left out). A program that returned the object would
    need its library to load, and a cache object cannot be traced at all. Anything else is one line."""
    model.eval()
    with torch.no_grad():
        out = model(*args, **(kwargs or {}))
    if _plain(out):
        return model
    if isinstance(out, Mapping) or hasattr(out, "logits"):
        has_logits = isinstance(out.get("logits") if isinstance(out, Mapping) else getattr(out, "logits", None),
                                torch.Tensor)
        if has_logits or _reduced(out, False):
            return TensorOutputs(model, has_logits)
    if isinstance(out, tuple) and all(isinstance(v, torch.Tensor) for v in out):  # a named tuple of tensors
        return TensorOutputs(model, False)
    raise ConfigError(f"export: {type(model).__name__}.forward returns {type(out).__name__}, which holds no logits "
                      "and is not tensors; return a tensor (or a tuple of tensors) from forward, or export the model "
                      "from Python with torch.export.export; nothing was written")


def context_length(model: nn.Module) -> int | None:
    """The most tokens a language model takes at once: its `max_len` (nanoGPT, CharLM), or its
    `transformers` config's positions; None when the model does not say."""
    size = getattr(model, "max_len", None)
    config = getattr(model, "config", None)
    for name in ("n_positions", "max_position_embeddings"):
        if size is None and config is not None:
            size = getattr(config, name, None)
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def dynamic_shapes(model: nn.Module, args: tuple, kwargs: dict, sequence: bool, max_len: int | None = None):
    """Every input's first dimension is the one `batch`; a sequence task's second is `seq`, 1 to
    `max_len` when given (a language model's context), else left to torch.export."""
    batch = Dim("batch")
    seq = Dim("seq", min=1, max=max_len) if max_len else Dim.AUTO  # min 1: a one-token prompt

    def spec(t):
        if not isinstance(t, torch.Tensor) or t.ndim == 0:
            return None
        return {0: batch, **({1: seq} if sequence and t.ndim > 1 else {})}

    if not kwargs:
        return tuple(spec(a) for a in args)
    names = [p for p in inspect.signature(model.forward).parameters]
    return {**{n: spec(a) for n, a in zip(names, args)}, **{k: spec(v) for k, v in kwargs.items()}}


@contextlib.contextmanager
def quiet_torch():
    """torch's tracers log pages (skipped torchvision ops, symbol warnings) at WARNING and print a failed
    trace's partial graph to stderr; what matters reaches the user as the one line of an error, so the
    loggers are held at ERROR and stderr is set aside meanwhile."""
    loggers = [logging.getLogger(n) for n in list(logging.root.manager.loggerDict) if n.split(".")[0] == "torch"]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def trace(model: nn.Module, args: tuple, kwargs: dict, sequence: bool, max_len: int | None = None) -> ExportedProgram:
    """`torch.export.export` of `model` (in eval mode, on the CPU) with the run's input spec."""
    model.eval()
    try:
        with quiet_torch():
            return torch.export.export(model, args, kwargs or None,
                                       dynamic_shapes=dynamic_shapes(model, args, kwargs, sequence, max_len))
    except Exception as exc:  # torch.export's errors span pages: one line naming the spot instead
        raise cannot_export(exc, model) from None


def cannot_export(exc: BaseException, model: nn.Module) -> ConfigError:
    """The one line for a model torch.export cannot trace: where, what, and what to do instead."""
    text = str(exc)
    name = f"{type(model).__name__}.forward"
    at = _user_line(exc)
    if "data-dependent" in text or type(exc).__name__ == "GuardOnDataDependentSymNode":
        expr = re.search(r"data-dependent expression (.+?)(?: \(unhinted|\.\s|$)", text)
        what = ("data-dependent control flow, a Python branch or size read from a tensor's values"
                + (f" ({expr.group(1).strip()})" if expr else ""))
        advice = ("torch.export guidance: write the branch as torch.cond(pred, true_fn, false_fn), or bound the "
                  "value with torch._check(...); torch.export.draft_export(model, args) lists every such spot")
    elif "Constraints violated" in text:
        dims = re.search(r"Constraints violated \(([^)]*)\)", text)
        fix = re.search(r"Suggested fixes:\s*(.+?)(?:\n\s*\n|$)", text, re.S)  # up to the blank line
        what = f"the model fixes the size of the dynamic dimension {dims.group(1) if dims else ''}".rstrip()
        advice = ("torch.export guidance: let the size follow the input (x.shape[0], view(-1, ...))"
                  + (f"; it suggests `{' '.join(fix.group(1).split())[:160]}`" if fix else ""))
    else:
        what = " ".join(f"{type(exc).__name__}: {text}".split())[:240]
        advice = "torch.export guidance: torch.export.draft_export(model, args) reports every problem at once"
    return ConfigError(f"export: {name} cannot be exported: {what}{at}; {advice}; nothing was written")


def _user_line(exc: BaseException) -> str:
    """' at file.py:12 (`code`)': the innermost frame of the traceback outside torch (the model's own line)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith(_TORCH_DIR) and not f.filename.startswith("<")
              and Path(f.filename).parent != Path(__file__).parent]
    if not frames:
        return ""
    f = frames[-1]
    code = f" (`{f.line.strip()}`)" if f.line else ""
    return f" at {Path(f.filename).name}:{f.lineno}{code}"


def input_spec(ep: ExportedProgram) -> list[dict]:
    """Each user input: name, dtype, and its dimensions (a size, or {"min", "max"} when dynamic)."""
    names = set(ep.graph_signature.user_inputs)
    out = []
    for node in ep.graph.nodes:
        if node.op != "placeholder" or node.name not in names:
            continue
        val = node.meta.get("val")
        dims = []
        for size in getattr(val, "shape", ()):
            if isinstance(size, torch.SymInt):
                r = ep.range_constraints.get(size.node.expr)
                lo, hi = (r.lower, r.upper) if r is not None else (0, None)
                dims.append({"min": int(lo), "max": int(hi) if getattr(hi, "is_Integer", False) else None})  # int_oo
            else:
                dims.append(int(size))
        out.append({"name": node.name, "dtype": str(getattr(val, "dtype", "")).removeprefix("torch."),
                    "shape": dims})
    return out


def pt2_bytes(ep: ExportedProgram, meta: dict, extra: dict[str, str] | None = None) -> bytes:
    """The .pt2 archive, with `meta` inside it as ecotrain.json (and `extra`: a language model's
    tokenizer.json)."""
    buf = io.BytesIO()
    torch.export.save(ep, buf, extra_files={**(extra or {}), META_FILE: json.dumps(meta, sort_keys=True)})
    return buf.getvalue()


def load_pt2(source: bytes | str | Path, extra: dict | None = None) -> tuple[ExportedProgram, dict]:
    """(program, ecotrain.json) of a .pt2 archive, through the safe reader (safeload.py: nothing in the
    file is unpickled or evaluated). `extra`, when given, is filled with the archive's other extra files."""
    if not isinstance(source, bytes):  # through safefile: a FIFO or device there is one line, not a wait
        what = str(source)
        source = safefile.read_bytes(source, ".pt2 archive", PT2_MAX_BYTES, error=CheckpointError,
                                     fix="give the .pt2 file that `ecotrain export` wrote")
        ep, files = safeload.load_pt2(source, what)
    else:
        ep, files = safeload.load_pt2(source)
    try:
        meta = json.loads(files.get(META_FILE) or "{}")
    except ValueError:
        meta = {}
    if extra is not None:
        extra.update({k: v for k, v in files.items() if k != META_FILE})
    return ep, meta if isinstance(meta, dict) else {}
