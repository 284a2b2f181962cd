"""Model and weights files that run code when read carelessly: each would create a marker file.

One builder per way in, for every file kind ecotrain reads (a `.pt2` archive, a PyTorch `.pt` state_dict,
a checkpoint folder, a run folder's weights, an `.npz`). Each returns the `ecotrain` command line that
reads the file; the suite (tests/hostile/test_payloads.py) and bench/hostile_models.py run them all and
look for the marker. `clean_pt2` is a real export of a tiny run: the payloads are edits of it.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np
import torch


class Touch:
    """Unpickled, it runs `touch MARKER`."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch '{self.marker}'",))


def pickle_bytes(marker: Path) -> bytes:
    return pickle.dumps(Touch(marker))


def torch_pickle_bytes(marker: Path) -> bytes:
    buf = io.BytesIO()
    torch.save({"w": Touch(marker)}, buf)  # a state_dict whose value is code
    return buf.getvalue()


def rewrite_zip(src: Path, dst: Path, edit: Callable[[str, bytes], bytes | None], add: dict | None = None) -> None:
    """Copy a zip entry by entry through `edit(name, data)` (None drops the entry), then add entries."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        top = zin.namelist()[0].split("/")[0]
        for info in zin.infolist():
            data = edit(info.filename.split("/", 1)[1], zin.read(info))
            if data is not None:
                zout.writestr(info.filename, data)
        for name, data in (add or {}).items():
            zout.writestr(f"{top}/{name}", data)


def _json_edit(target: str, change: Callable[[dict], None]) -> Callable[[str, bytes], bytes]:
    def edit(name: str, data: bytes) -> bytes:
        if name != target:
            return data
        j = json.loads(data)
        change(j)
        return json.dumps(j).encode()
    return edit


WEIGHTS_CONFIG = "data/weights/model_weights_config.json"
CONSTANTS_CONFIG = "data/constants/model_constants_config.json"


def _pt2_weight_pickled(clean: Path, out: Path, marker: Path) -> None:
    """`use_pickle`: torch.export.load unpickles the weight with weights_only=False."""
    with zipfile.ZipFile(clean) as z:
        config = json.loads(z.read(next(n for n in z.namelist() if n.endswith(WEIGHTS_CONFIG))))
    fqn, entry = next(iter(config["config"].items()))
    entry["use_pickle"] = True
    payload = f"data/weights/{entry['path_name']}"
    rewrite_zip(clean, out, lambda n, d: (torch_pickle_bytes(marker) if n == payload else
                                          json.dumps(config).encode() if n == WEIGHTS_CONFIG else d))


def _pt2_constant(prefix: str, body: Callable[[Path], bytes]) -> Callable[[Path, Path, Path], None]:
    def build(clean: Path, out: Path, marker: Path) -> None:
        name = f"{prefix}0"
        config = {"config": {"evil": {"path_name": name, "is_param": False, "use_pickle": True,
                                      "tensor_meta": None}}}
        rewrite_zip(clean, out, lambda n, d: json.dumps(config).encode() if n == CONSTANTS_CONFIG else d,
                    {f"data/constants/{name}": body(marker)})
    return build


def _pt2_sample_inputs(clean: Path, out: Path, marker: Path) -> None:
    """The sample inputs: torch falls back to an unrestricted torch.load when the safe one fails."""
    rewrite_zip(clean, out, lambda n, d: torch_pickle_bytes(marker) if n == "data/sample_inputs/model.pt" else d)


def _pt2_legacy(clean: Path, out: Path, marker: Path) -> None:
    """The older zip layout (no archive_format), which torch still reads: its weights are one pickle."""
    from torch._export.serde.schema import SCHEMA_VERSION

    with zipfile.ZipFile(clean) as z:
        program = z.read(next(n for n in z.namelist() if n.endswith("models/model.json")))
    empty = io.BytesIO()
    torch.save({}, empty)
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("version", ".".join(map(str, SCHEMA_VERSION)))
        z.writestr("serialized_exported_program.json", program)
        z.writestr("serialized_state_dict.pt", torch_pickle_bytes(marker))
        z.writestr("serialized_constants.pt", empty.getvalue())
        z.writestr("serialized_example_inputs.pt", empty.getvalue())


def _pt2_expression(clean: Path, out: Path, marker: Path) -> None:
    """A shape expression: torch's deserializer hands it to sympy.sympify, which evaluates Python."""
    def change(j: dict) -> None:
        for value in j["graph_module"]["graph"]["tensor_values"].values():
            for size in value["sizes"]:
                if "as_expr" in size:
                    size["as_expr"]["expr_str"] = f"__import__('os').system(\"touch '{marker}'\")"
                    return
        raise AssertionError("the clean export has no symbolic size")
    rewrite_zip(clean, out, _json_edit("models/model.json", change))


def _pt2_target(clean: Path, out: Path, marker: Path) -> None:
    """A node whose target is a name under torch that is not an operator (torch.os.system)."""
    def change(j: dict) -> None:
        for node in j["graph_module"]["graph"]["nodes"]:
            node["target"] = "torch.os.system"
            return
    rewrite_zip(clean, out, _json_edit("models/model.json", change))


PT2 = {"pt2_weight_use_pickle": _pt2_weight_pickled,
       "pt2_constant_use_pickle": _pt2_constant("tensor_", torch_pickle_bytes),
       "pt2_custom_object_constant": _pt2_constant("custom_obj_", pickle_bytes),
       "pt2_opaque_object_constant": _pt2_constant("opaque_obj_", pickle_bytes),
       "pt2_sample_inputs_pickle": _pt2_sample_inputs,
       "pt2_legacy_zip_layout": _pt2_legacy,
       "pt2_shape_expression_eval": _pt2_expression,
       "pt2_node_target_not_an_operator": _pt2_target}


IDS = [*PT2, "init_from_pickle", "init_from_plain_pickle", "checkpoint_with_pickle", "checkpoint_tensors_pickle",
       "run_weights_pickle", "npz_object_array"]


def build_all(tmp: Path, run: Path, clean_pt2: Path, query: Path) -> dict[str, list[str]]:
    """Every hostile file under tmp, each with the command line that reads it: {id: args after ecotrain}.
    `run`: a finished tiny run (a checkpoint folder under it); `query`: an .npz for predict."""
    cases: dict[str, list[str]] = {}
    (tmp / "markers").mkdir(exist_ok=True)
    for name, build in PT2.items():
        path = tmp / f"{name}.pt2"
        build(clean_pt2, path, marker(tmp, name))
        cases[name] = ["predict", str(path), "--data", str(query), "--out", str(tmp / f"{name}.csv")]

    pt = tmp / "init_from_pickle.pt"
    pt.write_bytes(torch_pickle_bytes(marker(tmp, "init_from_pickle")))
    cases["init_from_pickle"] = ["fit", str(run / "config.yaml"), "--run-dir", str(tmp / "from_pt"), "--init-from", str(pt)]
    plain = tmp / "init_from_plain_pickle.pt"
    plain.write_bytes(pickle_bytes(marker(tmp, "init_from_plain_pickle")))
    cases["init_from_plain_pickle"] = ["fit", str(run / "config.yaml"), "--run-dir", str(tmp / "from_plain"),
                                       "--init-from", str(plain)]

    ckpt = sorted((run / "checkpoints").glob("step-*"))[-1]
    bad_ckpt = tmp / "ckpt_with_pickle"
    shutil.copytree(ckpt, bad_ckpt)
    (bad_ckpt / "extra.pt").write_bytes(torch_pickle_bytes(marker(tmp, "checkpoint_with_pickle")))
    cases["checkpoint_with_pickle"] = ["eval", str(bad_ckpt)]
    swapped = tmp / "ckpt_tensors_pickle"
    shutil.copytree(ckpt, swapped)
    (swapped / "tensors.safetensors").write_bytes(torch_pickle_bytes(marker(tmp, "checkpoint_tensors_pickle")))
    cases["checkpoint_tensors_pickle"] = ["eval", str(swapped)]

    weights_run = tmp / "run_weights_pickle"
    shutil.copytree(run, weights_run)
    (weights_run / "model.safetensors").write_bytes(torch_pickle_bytes(marker(tmp, "run_weights_pickle")))
    cases["run_weights_pickle"] = ["eval", str(weights_run)]

    npz = tmp / "object_array.npz"
    with zipfile.ZipFile(npz, "w") as z:  # np.save of an object array is a pickle inside the .npy
        buf = io.BytesIO()
        np.save(buf, np.array([Touch(marker(tmp, "npz_object_array"))], dtype=object), allow_pickle=True)
        z.writestr("x.npy", buf.getvalue())
    cases["npz_object_array"] = ["predict", str(run), "--data", str(npz), "--out", str(tmp / "npz.csv")]
    return cases


def marker(tmp: Path, name: str) -> Path:
    return tmp / "markers" / name


def markers_made(tmp: Path) -> list[str]:
    folder = tmp / "markers"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
