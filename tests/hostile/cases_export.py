"""The hostile corpus, the shipping commands: `export` (a program that returns NaN), `predict MODEL.pt2
|.onnx` (data `predict RUN` refuses, a damaged or altered file), `predict` on a run trained from
Parquet (a CSV read by name), `card` (a damaged or missing ledger, a run listed twice) and the
read-back schema of summary.json and ledger.json. The harness is in cases.py."""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np

from tests.hostile.cases import RANDOM_BYTES, Case, both, edit_json, npz, parquet, trained_run, write

CASES: list[Case] = []

_EXPORTED: dict[tuple, Path] = {}


def exported(*overrides: str, inputs=None) -> Callable[[Path], None]:
    """tmp/model.pt2: the tiny run (trained_run's, with `overrides`) exported once per session, copied."""
    train = trained_run("run", *overrides, inputs=inputs)

    def setup(tmp: Path) -> None:
        from tests.conftest import run_cli

        key = (overrides, inputs)
        if key not in _EXPORTED:
            home = Path(tempfile.mkdtemp(prefix="ecotrain-hostile-export-"))
            atexit.register(shutil.rmtree, home, True)
            train(home)
            r = run_cli("export", home / "run", "--no-card", cwd=home)
            assert r.returncode == 0, r.stderr
            _EXPORTED[key] = home / "run" / "model.pt2"
        shutil.copy(_EXPORTED[key], tmp / "model.pt2")
    return setup


def edit_meta(change) -> Callable[[Path], None]:
    """tmp/model.pt2 with its ecotrain.json replaced by `change(meta)` (a dict to edit, or what to write)."""
    def setup(tmp: Path) -> None:
        path = tmp / "model.pt2"
        with zipfile.ZipFile(path) as z:
            entries = [(i, z.read(i)) for i in z.infolist()]
        with zipfile.ZipFile(path, "w") as z:
            for info, data in entries:
                if info.filename.endswith("extra/ecotrain.json"):
                    meta = json.loads(data)
                    new = change(meta)  # None: edited in place
                    data = json.dumps(meta if new is None else new).encode()
                z.writestr(info, data)
    return setup


def setting(**values):
    def change(meta: dict) -> None:
        for dotted, v in values.items():
            node, *path = dotted.split("__")
            target = meta
            for part in [node, *path][:-1]:
                target = target[int(part)] if isinstance(target, list) else target[part]
            last = [node, *path][-1]
            if isinstance(target, list):
                target[int(last)] = v
            else:
                target[last] = v
    return change


def rows(n: int = 10, width: int = 64, nan_at=None) -> np.ndarray:
    x = np.random.default_rng(0).normal(size=(n, width)).astype(np.float32)
    if nan_at is not None:
        x[nan_at, 5] = np.nan
    return x


EXPORTED = exported()  # one object: exported()'s key
P = ["predict", "{tmp}/model.pt2", "--out", "{tmp}/p.csv", "--data"]
NO_PREDS = ("p.csv", ".p.csv.tmp-*")


# ---- export: a program that is not the eager model's, in NaNs (export/parity.py) ----
NANMODS = write("nanmods.py", """\
import torch
from torch import nn


class Net(nn.Module):
    '''Finite in eager, NaN once traced: what the parity check must catch.'''

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(64, 10)

    def forward(self, x):
        return self.net(x) + (float("nan") if torch.compiler.is_exporting() else 0.0)
""")
NAN_RUN = both(NANMODS, trained_run("run", "model.name=nanmods:Net", "model.kwargs={}", inputs=NANMODS))
NO_EXPORT = ("run/model.pt2", "run/export.json", "run/README.md", "run/.model.pt2*")
CASES += [
    Case("export_program_returns_nan", ["export", "{tmp}/run"], 1,
         ["parity check failed", "returns NaN/Inf", "where the eager model's are finite", "nothing was written"],
         NAN_RUN, absent=NO_EXPORT),
    Case("export_program_returns_nan_whatever_the_tolerance", ["export", "{tmp}/run", "--tolerance", "1e30"], 1,
         ["parity check failed", "NaN/Inf", "whatever --tolerance"], NAN_RUN, absent=NO_EXPORT),
]


# ---- predict MODEL.pt2: the data contract of predict RUN (contract.py) ----
CASES += [
    Case("predict_export_nan_rows", [*P, "{tmp}/nan.npz"], 2, ["nan.npz", "NaN/Inf", "row 3"],
         both(EXPORTED, npz("nan.npz", x=rows(nan_at=3))), absent=NO_PREDS),
    Case("predict_export_labels_shorter_than_rows", [*P, "{tmp}/short.npz"], 2,
         ["short.npz", "10 feature rows but 7 labels"], both(EXPORTED, npz("short.npz", x=rows(), y=np.arange(7) % 3)),
         absent=NO_PREDS),
    Case("predict_export_nan_labels", [*P, "{tmp}/nanlab.npz"], 2, ["nanlab.npz", "labels hold NaN/Inf", "row 2"],
         both(EXPORTED, npz("nanlab.npz", x=rows(), y=np.array([0, 1, np.nan, 3, 4, 5, 6, 7, 8, 9.0]))),
         absent=NO_PREDS),
    Case("predict_export_nan_label_in_a_csv", [*P, "{tmp}/l.csv"], 2, ["l.csv", "labels hold NaN/Inf", "row 1"],
         both(EXPORTED, write("l.csv", ",".join([f"c{i}" for i in range(64)] + ["label"]) + "\n"
                              + "".join(",".join(["0.5"] * 64 + [lab]) + "\n" for lab in ("1", "nan", "2")))),
         absent=NO_PREDS),
    Case("predict_export_label_out_of_range", [*P, "{tmp}/big.npz"], 2, ["big.npz", "label 12", "10 classes"],
         both(EXPORTED, npz("big.npz", x=rows(), y=np.arange(10) + 3)), absent=NO_PREDS),
    Case("predict_export_wrong_width", [*P, "{tmp}/w.npz"], 2, ["w.npz", "10 features", "64 features"],
         both(EXPORTED, npz("w.npz", x=rows(width=10))), absent=NO_PREDS),
    Case("predict_export_text_features", [*P, "{tmp}/s.npz"], 2, ["s.npz", "features must be numbers"],
         both(EXPORTED, npz("s.npz", x=np.array([["a"] * 64] * 3))), absent=NO_PREDS),
    Case("predict_export_no_rows", [*P, "{tmp}/e.npz"], 2, ["e.npz", "no samples"],
         both(EXPORTED, npz("e.npz", x=np.zeros((0, 64), np.float32))), absent=NO_PREDS),
    Case("predict_export_a_good_file", [*P, "{tmp}/ok.npz"], 0, ["wrote 10 predictions"],
         both(EXPORTED, npz("ok.npz", x=rows(), y=np.arange(10) % 3)), may_change=("p.csv",)),
]


# ---- predict MODEL.pt2|.onnx: a damaged or altered file (export/meta.py; opening it: safeload.py) ----
CASES += [
    Case("predict_onnx_truncated", ["predict", "{tmp}/m.onnx", "--out", "{tmp}/p.csv", "--data", "{tmp}/ok.npz"], 3,
         ["m.onnx", "not a readable ONNX model"], both(write("m.onnx", RANDOM_BYTES[:100]), npz("ok.npz", x=rows())),
         absent=NO_PREDS),
    Case("predict_export_dtype_is_a_torch_attribute", [*P, "{tmp}/ok.npz"], 2,
         ["model.pt2", "'inputs.0.dtype' is \"__class__\"", "float32", "re-export"],
         both(EXPORTED, edit_meta(setting(inputs__0__dtype="__class__")), npz("ok.npz", x=rows())),
         absent=NO_PREDS),
    Case("predict_export_dtype_is_a_class_name", [*P, "{tmp}/ok.npz"], 2, ["'inputs.0.dtype' is \"Tensor\""],
         both(EXPORTED, edit_meta(setting(inputs__0__dtype="Tensor")), npz("ok.npz", x=rows())), absent=NO_PREDS),
    Case("predict_export_meta_wrong_types", [*P, "{tmp}/ok.npz"], 2,
         ["model.pt2", "'num_classes' is \"ten\"", "not a whole number"],
         both(EXPORTED, edit_meta(setting(num_classes="ten")), npz("ok.npz", x=rows())), absent=NO_PREDS),
    Case("predict_export_meta_not_an_object", [*P, "{tmp}/ok.npz"], 2, ["model.pt2", "unknown inputs"],  # read as {}
         both(EXPORTED, edit_meta(lambda meta: [1, 2]), npz("ok.npz", x=rows())), absent=NO_PREDS),
    Case("predict_export_meta_shape_not_a_size", [*P, "{tmp}/ok.npz"], 2, ["'inputs.0.shape.1' is -4", "a size"],
         both(EXPORTED, edit_meta(setting(inputs__0__shape__1=-4)), npz("ok.npz", x=rows())), absent=NO_PREDS),
    Case("predict_export_spec_altered_to_pass_the_guard", [*P, "{tmp}/w.npz"], 2,
         ["model.pt2 refused the input", "does not match its program", "re-export"],
         both(EXPORTED, edit_meta(setting(inputs__0__shape__1=10)), npz("w.npz", x=rows(width=10))),
         absent=NO_PREDS),
]


# ---- predict RUN trained from Parquet: a CSV's columns by name, as for a CSV run (data/builtin.py) ----
_TX = np.random.default_rng(1).normal(size=(60, 3)).astype(np.float32)
_TY = np.arange(60) % 3
TRAIN_PARQUET = parquet("p/a.parquet", a=_TX[:, 0], b=_TX[:, 1], c=_TX[:, 2], label=_TY)
PARQUET_RUN = trained_run("run", "data.name=parquet:p", inputs=TRAIN_PARQUET)


def table(name: str, cols: str) -> Callable[[Path], None]:
    """A CSV of the training rows, its columns in the order `cols` names (a, b, c; l: the label)."""
    def cell(r: int, c: str) -> str:
        return str(int(_TY[r])) if c == "l" else repr(float(_TX[r, "abc".index(c)]))
    header = ",".join("label" if c == "l" else c for c in cols)
    return write(name, header + "\n" + "".join(",".join(cell(r, c) for c in cols) + "\n" for r in range(8)))


PR = ["predict", "{tmp}/run", "--out", "{tmp}/p.csv", "--data"]
CASES += [
    Case("predict_parquet_run_csv_in_another_order", [*PR, "{tmp}/swap.csv"], 0,
         ["columns in another order", "read by name, as a, b, c", "wrote 8 predictions"],
         both(TRAIN_PARQUET, PARQUET_RUN, table("swap.csv", "cbal")), may_change=("p.csv",)),
    Case("predict_parquet_run_csv_missing_a_column", [*PR, "{tmp}/miss.csv"], 2,
         ["miss.csv", "no column 'c'", "takes the columns a, b, c", "by name"],
         both(TRAIN_PARQUET, PARQUET_RUN, table("miss.csv", "bal")), absent=NO_PREDS),
]


# ---- card: the ledger read back with the one schema; a missing ledger said; a run listed twice ----

def remove(name: str) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        (tmp / name).unlink()
    return setup


GROUP_TWICE = write("g-group.json", json.dumps({"schema": 1, "kind": "ecotrain.seed_group", "name": "g",
                                                "runs": ["run", "run", "./run"], "seeds": [0, 0, 0]}))
RUN = trained_run()
CARD = ["card", "{tmp}/run"]
NO_CARD = ("run/README.md", "run/.README.md*")
CASES += [
    Case("card_ledger_nan_emissions", CARD, 2, ["ledger.json", "'co2e.kg' is NaN", "finite number of 0 or more"],
         both(RUN, edit_json("run/ledger.json", lambda L: L["co2e"].update(kg=float("nan")))), absent=NO_CARD),
    Case("card_ledger_negative_emissions", CARD, 2, ["ledger.json", "'co2e.kg' is -0.5"],
         both(RUN, edit_json("run/ledger.json", lambda L: L["co2e"].update(kg=-0.5))), absent=NO_CARD),
    Case("card_ledger_infinite_wall_seconds", CARD, 2, ["ledger.json", "'wall_seconds' is Infinity"],
         both(RUN, edit_json("run/ledger.json", lambda L: L.update(wall_seconds=float("inf")))), absent=NO_CARD),
    Case("card_ledger_missing", CARD, 0, ["ledger.json is missing"], both(RUN, remove("run/ledger.json")),
         may_change=("run/README.md",)),
    Case("card_group_lists_one_run_three_times", ["card", "{tmp}/g-group.json"], 0,
         ["listed more than once", "counted once (1 distinct run)"], both(RUN, GROUP_TWICE),
         may_change=("run/README.md",)),
    Case("card_summary_nan_steps", CARD, 2, ["summary.json", "'steps' is NaN"],
         both(RUN, edit_json("run/summary.json", lambda s: s.update(steps=float("nan")))), absent=NO_CARD),
    Case("compare_ledger_negative_flops", ["compare", "{tmp}/run", "{tmp}/run2", "--by", "flops"], 2,
         ["run2/ledger.json", "'flops.total' is -1000.0"],
         both(RUN, trained_run("run2"), edit_json("run2/ledger.json", lambda L: L["flops"].update(total=-1e3)))),
]
