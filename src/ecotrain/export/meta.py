"""ecotrain.json, what travels inside an exported file (the task, the classes, the input spec, a
table's column names), checked when it is read back: the file may come from anyone, so every field is
typed and each dtype is one of a fixed list (never `getattr(torch, name)` on a string from a file).
A bad field is one line naming the file and the field, exit 2.
"""

from __future__ import annotations

import json

import torch

from ecotrain.base.errors import DataError
from ecotrain.base.jsonfile import check_fields

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16, "int64": torch.int64, "int32": torch.int32, "int16": torch.int16,
          "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool}
FIELDS = {"task?": (str, None), "num_classes?": (int, None), "inputs?": list, "columns?": (list, None),
          "columns.*?": str, "columns_chosen?": bool, "target?": (str, None)}
INPUT_FIELDS = {"inputs.*.name?": str, "inputs.*.dtype": str, "inputs.*.shape": list}  # when there are inputs
FIX = "re-export the run with `ecotrain export` (the file was altered, or not written by ecotrain)"


def check_meta(meta, path) -> dict:
    """`meta` (ecotrain.json as read) checked; {} when the file holds none."""
    if not isinstance(meta, dict):
        raise DataError(f"{path}: its ecotrain.json is {json.dumps(meta)[:40]}, not an object; {FIX}")
    check_fields(meta, {**FIELDS, **(INPUT_FIELDS if "inputs" in meta else {})}, path, "ecotrain.json", FIX, DataError)
    if meta.get("num_classes") is not None and meta["num_classes"] < 1:
        raise DataError(f"{path}: the ecotrain.json's 'num_classes' is {meta['num_classes']}, not 1 or more; {FIX}")
    for i, spec in enumerate(meta.get("inputs") or []):
        if spec["dtype"] not in DTYPES:
            raise DataError(f"{path}: the ecotrain.json's 'inputs.{i}.dtype' is {json.dumps(spec['dtype'])[:40]}, "
                            f"not one of {', '.join(DTYPES)}; {FIX}")
        for j, dim in enumerate(spec["shape"]):
            if not (_size(dim) or (isinstance(dim, dict) and _size(dim.get("min"))
                                   and (dim.get("max") is None or _size(dim.get("max"))))):
                raise DataError(f"{path}: the ecotrain.json's 'inputs.{i}.shape.{j}' is {json.dumps(dim)[:40]}, not "
                                f"a size (a whole number of 0 or more, or {{\"min\", \"max\"}}); {FIX}")
    return meta


def _size(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def dims(spec: dict) -> list:
    """A sample's dimensions (the batch's left out): a size, or None where any size is taken."""
    return [d if isinstance(d, int) else None for d in spec["shape"][1:]]
