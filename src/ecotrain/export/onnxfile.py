"""ONNX: the traced program converted by `torch.onnx.export(..., dynamo=True)`, and onnxruntime to run
it. The one module that touches the onnx extra (onnx, onnxscript, onnxruntime); each is imported in
the function that needs it, so nothing else pays for it or needs it installed.
"""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import torch
from torch.export import ExportedProgram

from ecotrain.base import safefile
from ecotrain.base import safeload
from ecotrain.base.errors import CheckpointError, ConfigError
from ecotrain.export.program import META_FILE, quiet_torch

EXTRA = "needs the onnx extra: pip install 'ecotrain[onnx]'"
MAX_BYTES = 2 << 30  # protobuf's 2 GB limit: a bigger .onnx cannot be one file (onnx_bytes writes one)


def require(what: str = "export --format onnx") -> None:
    """One line when the exporter's packages are missing, before any work."""
    missing = [m for m in ("onnx", "onnxscript") if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(f"{what} {EXTRA} ({', '.join(missing)} not installed)")


def has_runtime() -> bool:
    return importlib.util.find_spec("onnxruntime") is not None


def onnx_bytes(ep: ExportedProgram, args: tuple, kwargs: dict, meta: dict, extra: dict[str, str] | None = None) -> bytes:
    """The ONNX model of the traced program (its dynamic dimensions kept), `meta` in its metadata (and
    `extra`, each under its file name: a language model's tokenizer.json)."""
    require()
    outputs = len(ep.graph_signature.user_outputs)
    with quiet_torch():  # the exporter logs each torchvision op it skips, and prints its steps
        program = torch.onnx.export(ep, args, kwargs=kwargs or None, dynamo=True, verbose=False,
                                    output_names=["logits"] if outputs == 1 else None)
    proto = program.model_proto
    for key, value in {**(extra or {}), META_FILE: json.dumps(meta, sort_keys=True)}.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    return proto.SerializeToString()  # protobuf's 2 GB limit: larger models need the .pt2


class Session:
    """An onnxruntime session called like the model: tensors in (by position, then by name), tensors out."""

    def __init__(self, model: bytes | str):
        import onnxruntime as ort  # the onnx extra

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = torch.get_num_threads()  # as many as torch uses here, not every core
        opts.log_severity_level = 3
        self.session = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        self.names = [i.name for i in self.session.get_inputs()]
        props = self.session.get_modelmeta().custom_metadata_map
        meta = props.get(META_FILE)
        self.extra = {k: v for k, v in props.items() if k != META_FILE}  # a language model's tokenizer.json
        try:
            self.meta = json.loads(meta) if meta else {}
        except ValueError:
            self.meta = {}

    def __call__(self, *args, **kwargs):
        given = [*args, *kwargs.values()]  # the order torch.export flattened them in
        feed = {n: t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
                for n, t in zip(self.names, given)}
        out = [torch.from_numpy(np.asarray(o)) for o in self.session.run(None, feed)]
        return out[0] if len(out) == 1 else tuple(out)


def load(path) -> Session:
    """An .onnx file to run (predict): the runtime is needed, not the exporter."""
    if not has_runtime():
        raise ConfigError(f"predict {path}: an .onnx model {EXTRA} (onnxruntime not installed)")
    data = safefile.read_bytes(path, "ONNX model", MAX_BYTES, error=CheckpointError,
                               fix="give the .onnx file that `ecotrain export` wrote")
    safeload.check_onnx(data, str(path))
    try:
        return Session(data)  # bytes, not the path: nothing beside the file is read
    except Exception as exc:  # onnxruntime's InvalidProtobuf, InvalidGraph, ...
        raise CheckpointError(f"{path}: not a readable ONNX model ({' '.join(str(exc).split())[:200]})") from None
