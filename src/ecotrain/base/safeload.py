"""The one reader of files that torch could unpickle or turn into code: `.pt2` archives, PyTorch
state_dict files (`.pt`), `.onnx` models. Every such read in ecotrain goes through here.

A `.pt2` is a zip that `torch.export.load` trusts: an entry marked `use_pickle` (or the older zip
layout) is unpickled without restriction, a custom or opaque constant to `pickle.loads`, the
sample inputs fall back to an unrestricted `torch.load` when the safe one fails, a shape expression is
evaluated by `sympy.sympify` (Python's `eval`), and a node's target is looked up by name under `torch`
(`torch.os.system` resolves). So the archive is checked before torch reads any of it: the current layout
only, every payload a raw tensor, the sample inputs loadable with `weights_only=True`, every expression
made of sympy's classes and symbols only, every target an operator. Then torch loads it with
`TORCH_FORCE_WEIGHTS_ONLY_LOAD` set, so an unpickling we did not foresee is refused by torch itself.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import operator
import os
import re
import zipfile
from pathlib import Path
from typing import Any, Iterator

import torch

from ecotrain.base import safefile
from ecotrain.base.errors import CheckpointError

EXTRA_DIR = "extra/"
_SYMBOL = re.compile(r"[A-Za-z]{1,4}\d+")  # torch's shape symbols: s0, s27, u3
_TOKEN = re.compile(r"\s*(?:([A-Za-z_][A-Za-z0-9_]*)|('[A-Za-z0-9_.+-]*')|(\d+(?:\.\d+)?(?:e[+-]?\d+)?)|([-+*/(),=<>!%]))")
_EXTRA_NAMES = {"True", "False", "None", "evaluate", "precision", "oo", "zoo", "nan", "pi", "E", "I"}
_OPERATOR_OK = {n for n in dir(operator) if not n.startswith("_")} - {"attrgetter", "itemgetter", "methodcaller",
                                                                       "call", "setitem", "delitem"}
_MATH_OK = {n for n in dir(math) if not n.startswith("_")}


class UnsafeFile(CheckpointError):
    """A file that would run code (or unpickle) if it were loaded."""


@contextlib.contextmanager
def weights_only() -> Iterator[None]:
    """torch.load behaves as weights_only=True for the duration, whatever its caller passed (torch reads
    these variables at each call; its opposite would make torch refuse both); restored after."""
    names = ("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
    old = {n: os.environ.pop(n, None) for n in names}
    os.environ[names[0]] = "1"
    try:
        yield
    finally:
        for n, v in old.items():
            os.environ.pop(n, None)
            if v is not None:
                os.environ[n] = v


def torch_load(source, what: str) -> Any:
    """`torch.load` of a state_dict file with weights_only semantics only: tensors and plain
    containers; a pickle of anything else is refused by torch's restricted unpickler."""
    try:
        with weights_only():
            return torch.load(source, map_location="cpu", weights_only=True)
    except Exception as exc:  # weights_only refuses arbitrary objects with an UnpicklingError
        raise CheckpointError(f"{what}: not a plain state_dict loadable with weights_only=True "
                              f"({type(exc).__name__})") from None


# ---- .pt2 ----

def load_pt2(source: bytes | str | Path, what: str | None = None):
    """(ExportedProgram, {extra file name: text}) of a .pt2 archive, checked first (`check_pt2`)."""
    if isinstance(source, bytes):
        data = source
    else:  # a FIFO or device in its place: one line, never a wait (a model's size: no cap but the file's own)
        with safefile.open_regular(source, ".pt2 archive", error=CheckpointError, fix="give the .pt2 file") as f:
            data = f.read()
    what = what or (str(source) if not isinstance(source, bytes) else "the .pt2 archive")
    # torch fills the dict it is given, but replaces an empty one: name every extra file up front
    extra = {name: "" for name in check_pt2(data, what)}
    try:
        with weights_only():
            ep = torch.export.load(io.BytesIO(data), extra_files=extra)
    except Exception as exc:  # a damaged archive: torch's own words, on one line
        raise CheckpointError(f"{what}: not a readable torch.export archive "
                              f"({' '.join(str(exc).split())[:200] or type(exc).__name__})") from None
    return ep, extra


def check_pt2(data: bytes, what: str) -> list[str]:
    """Refuse, before torch reads anything of it, an archive that would unpickle or evaluate code; the
    names of its extra files."""
    try:
        z = zipfile.ZipFile(io.BytesIO(data))
        entries = {_strip_top(i.filename): i for i in z.infolist()}
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise CheckpointError(f"{what}: not a readable torch.export archive (not a zip: {exc})") from None
    names = set(entries)

    def read(name: str) -> bytes:
        try:
            return z.read(entries[name])
        except Exception as exc:  # CRC errors, truncation, a bomb's size lie
            raise CheckpointError(f"{what}: entry '{name}' cannot be read ({type(exc).__name__})") from None

    def refuse(why: str) -> UnsafeFile:
        return UnsafeFile(f"{what}: refused, {why}; ecotrain loads no archive that would run code when read "
                          "(re-export it with `ecotrain export` or torch.export.save from this torch)")

    if "archive_format" not in names or read("archive_format") != b"pt2":
        raise refuse("not the current torch.export layout (the older zip layout unpickles its weights)")
    for name in names:
        if name.startswith("data/aotinductor/"):
            raise refuse(f"it holds compiled code ('{name}')")
        if name.endswith((".pkl", ".pickle")) or (name.startswith(("data/weights/", "data/constants/"))
                                                   and name.endswith(".pt")):
            raise refuse(f"entry '{name}' is a pickle")
    models = [n for n in names if n.startswith("models/") and n.endswith(".json")]
    if not models:
        raise CheckpointError(f"{what}: not a readable torch.export archive (no models/*.json)")
    for m in models:
        model = m[len("models/"):-len(".json")]
        for kind in ("weights", "constants"):
            config = f"data/{kind}/model_{kind}_config.json" if model == "model" else \
                f"data/{kind}/{model}_{kind}_config.json"
            if config in names:
                _check_payloads(_json(read(config), what, config), kind, what, refuse)
        sample = f"data/sample_inputs/{model}.pt"
        if sample in names and entries[sample].file_size:
            torch_load(io.BytesIO(read(sample)), f"{what}: entry '{sample}'")
        _check_program(_json(read(m), what, m), what, refuse)
    return [n[len(EXTRA_DIR):] for n in names if n.startswith(EXTRA_DIR)]


def _strip_top(name: str) -> str:
    """torch writes every entry under one top folder (the archive's name); its reader strips it."""
    return name.split("/", 1)[1] if "/" in name else name


def _json(raw: bytes, what: str, name: str) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise CheckpointError(f"{what}: entry '{name}' is not valid JSON") from None


def _check_payloads(config: Any, kind: str, what: str, refuse) -> None:
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict):
        raise CheckpointError(f"{what}: the {kind} config is not an object of entries")
    for fqn, meta in entries.items():
        if not isinstance(meta, dict):
            raise CheckpointError(f"{what}: the {kind} entry '{fqn}' is not an object")
        if meta.get("use_pickle") is not False:
            raise refuse(f"the {kind} entry '{fqn}' is stored as a pickle (use_pickle)")
        path = meta.get("path_name")
        if not isinstance(path, str) or (kind == "constants" and not path.startswith("tensor_")):
            raise refuse(f"the {kind} entry '{fqn}' is a {path!r} object, not a tensor")


def _check_program(program: Any, what: str, refuse) -> None:
    """Every string torch evaluates: shape expressions (sympify) and node targets (a name under torch)."""
    for key, value in _strings(program):
        if key == "expr_str" or key == "range_constraints":
            if not safe_expression(value):
                raise refuse(f"a shape expression is not made of sympy terms only ({value[:60]!r})")
        elif key == "target" and not safe_target(value):
            raise refuse(f"a node calls {value[:80]!r}, which is not an operator")


def _strings(obj: Any, key: str = "") -> Iterator[tuple[str, str]]:
    """(key, string) for every string value in a JSON tree; the keys of `range_constraints` as strings
    of that key (torch parses them as expressions too)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if key == "range_constraints":
                yield key, str(k)
            yield from _strings(v, str(k))
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v, key)
    elif isinstance(obj, str):
        yield key, obj


def safe_expression(text: str) -> bool:
    """Only sympy classes, torch's shape symbols and literals: what `sympy.srepr` writes, no builtin."""
    pos, n = 0, len(text)
    while pos < n:
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            return text[pos:].strip() == ""
        name = m.group(1)
        if name is not None and not _allowed_name(name):
            return False
        pos = m.end()
    return True


def _allowed_name(name: str) -> bool:
    if _SYMBOL.fullmatch(name) or name in _EXTRA_NAMES or name in _assumptions():
        return True
    # sympy (~0.4 s to import) only when a .pt2 is read: a checkpoint's reader must not pay it (start-up)
    import sympy
    import torch.utils._sympy.functions as torch_sympy  # the shape functions torch's deserializer knows

    if name in vars(torch_sympy):
        obj = vars(torch_sympy)[name]
        return isinstance(obj, type) and issubclass(obj, sympy.Basic)
    obj = getattr(sympy, name, None)
    return (isinstance(obj, type) and issubclass(obj, sympy.Basic)) or isinstance(obj, sympy.Basic)


def _assumptions() -> set[str]:
    from sympy.core.assumptions import _assume_defined  # the keyword names srepr writes (integer=True)

    return set(_assume_defined)


def safe_target(target: str) -> bool:
    """A node target torch would resolve to an operator: an op under torch.ops, a pure function of
    `operator` or `math`, or torch's sym_* functions; never another name under torch."""
    parts = target.split(".")
    if parts[0] == "_operator":
        return len(parts) == 2 and parts[1] in _OPERATOR_OK
    if parts[0] == "math":
        return len(parts) == 2 and parts[1] in _MATH_OK
    if parts[0] != "torch" or len(parts) < 2:
        return False
    if len(parts) == 2:
        return parts[1].startswith("sym_") and callable(getattr(torch, parts[1], None))
    if parts[1] != "ops" or any(p.startswith("_") for p in parts[2:3]):
        return False
    obj: Any = torch
    for p in parts[1:]:
        obj = getattr(obj, p, None)
        if obj is None:
            return False
    return isinstance(obj, (torch._ops.OpOverload, torch._ops.OpOverloadPacket, torch._ops.HigherOrderOperator))


# ---- .onnx ----

def check_onnx(data: bytes, what: str) -> None:
    """An ONNX model whose tensors all live inside it: data in an external file would be read from any
    path the model names. Every tensor the model holds is looked at (`onnx_tensors`: initializers,
    sparse ones, node attributes, subgraphs, functions, training graphs), and one that is marked
    EXTERNAL or names an external location is refused. Parsed with the onnx package when it is
    installed; without it the runtime is given the bytes alone (no folder to resolve a relative path
    against)."""
    try:
        import onnx  # the onnx extra; optional for predict
    except ImportError:
        return
    try:
        model = onnx.ModelProto.FromString(data)  # the protobuf alone: nothing outside it is read
    except Exception as exc:  # truncated or not protobuf
        raise CheckpointError(f"{what}: not a readable ONNX model ({type(exc).__name__})") from None
    for where, t in onnx_tensors(model):
        if t.data_location == onnx.TensorProto.EXTERNAL or len(t.external_data):
            named = f"tensor '{t.name}'" if t.name else "a tensor"
            raise UnsafeFile(f"{what}: refused, {named} ({where}) keeps its data in an external file; "
                             "export it into one .onnx file (ecotrain export does)")


def onnx_tensors(model) -> Iterator[tuple[str, Any]]:
    """(where it sits, tensor) for every TensorProto a ModelProto holds: each graph's initializers and
    sparse initializers (values and indices), every node attribute's t / tensors / sparse_tensor /
    sparse_tensors, the graphs of g / graphs (an If's branches, a Loop's or Scan's body) at any depth,
    the model-local functions' nodes and attribute defaults, and the training graphs. A stack, not
    recursion: a model nested deep is walked all the same."""
    stack: list[tuple[str, str, Any]] = [("graph", "graph", model.graph)]
    for i, info in enumerate(model.training_info):
        stack += [("graph", f"training_info[{i}].initialization", info.initialization),
                  ("graph", f"training_info[{i}].algorithm", info.algorithm)]
    for fn in model.functions:
        stack.append(("nodes", f"function '{fn.name}'", fn.node))
        stack.append(("attrs", f"function '{fn.name}' attribute default", fn.attribute_proto))
    while stack:
        kind, where, item = stack.pop()
        if kind == "graph":
            name = f"{where} '{item.name}'" if item.name else where
            for t in item.initializer:
                yield f"initializer of {name}", t
            for sp in item.sparse_initializer:
                yield from _sparse(f"sparse initializer of {name}", sp)
            stack.append(("nodes", name, item.node))
        elif kind == "nodes":
            for node in item:
                label = f"node '{node.name or node.op_type}' ({node.op_type}) in {where}"
                stack.append(("attrs", label, node.attribute))
        else:  # attributes
            for attr in item:
                at = f"attribute '{attr.name}' of {where}"
                if attr.HasField("t"):
                    yield at, attr.t
                for t in attr.tensors:
                    yield at, t
                if attr.HasField("sparse_tensor"):
                    yield from _sparse(at, attr.sparse_tensor)
                for sp in attr.sparse_tensors:
                    yield from _sparse(at, sp)
                if attr.HasField("g"):
                    stack.append(("graph", f"subgraph {at}", attr.g))
                for j, g in enumerate(attr.graphs):
                    stack.append(("graph", f"subgraph {j} {at}", g))


def _sparse(where: str, sp) -> Iterator[tuple[str, Any]]:
    yield f"values of {where}", sp.values
    yield f"indices of {where}", sp.indices
