"""Shipping a trained model (docs/export.md): `ecotrain export` to .pt2 and to ONNX on the demo CNN and
on the char-LM, the parity of each export with the eager model on the run's own test split, the model
card read back by Hugging Face's ModelCard offline, and predictions from the .pt2 with the model's
class made unusable.

The runs, trained here with the real CLI:
- the demo: `ecotrain fit recipes/mnist1d_cnn.yaml` (its full schedule, 6,000 steps; `--cnn-steps`);
- the char-LM: `ecotrain fit recipes/charlm_long.yaml` shortened to fit a CPU bench: sequences of 128,
  d_model 64, 2 layers, 300 steps, fp32, no activation checkpointing (`--lm-steps`).

What is measured, all read from the files the commands write:
- pt2_max_abs_diff / onnx_max_abs_diff: the largest |export - eager| of any output on the test split
  (export.json; ONNX through onnxruntime), over both models; per model with suffix _cnn, _charlm;
- onnx_relative_diff: the same divided by the largest eager output (export.json relative_diff, the
  figure `--tolerance` bounds), and eager_fp32_error_cnn: the eager CNN's own float32 error, its largest
  |float32 - float64| logit on the test split, the scale against which ONNX's difference is rounding;
- pt2_acc_equal: the test accuracy of the .pt2 program equals eager's exactly, for both models;
- card_parses: `ModelCard.load` reads the demo's README.md offline and its co2_eq_emissions.emissions
  equals the ledger's grams (co2e.kg x 1000) exactly;
- predict_without_class: `ecotrain predict model.pt2` in a fresh process whose ConvBase raises on any
  use writes the same CSV as `ecotrain predict RUN` (the eager model).

    python bench/export.py [--work DIR] [--cnn-steps 6000] [--lm-steps 300] [--quick]

`--quick` (a check that the bench runs, not a figure): the demo CNN only, 20 steps (the char-LM's keys
read `skipped`), in a temporary folder.

Ends with one `RESULT` line with the keys above.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
LM = ["precision=fp32", "memory.activation_checkpointing=off", "memory.release_freed=false",
      "data.kwargs={seq_len: 128, max_bytes: 400000}", "model.kwargs={d_model: 64, n_layers: 2, n_heads: 2}",
      "data.batch_size=16", "loop.eval_every=100", "loop.log_every=50"]
# the predict process: ConvBase unusable, so a program that needed the class would fail
NO_CLASS = """
import sys
import ecotrain.models.vision1d as v
def refuse(*a, **k):
    raise RuntimeError("ConvBase was used")
v.ConvBase.__init__ = refuse
v.ConvBase.forward = refuse
from ecotrain.cli import main
sys.exit(main(sys.argv[1:]))
"""


def ecotrain(*args, code: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-c", code, *map(str, args)] if code else [sys.executable, "-m", "ecotrain", *map(str, args)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"bench/export.py: `ecotrain {' '.join(map(str, args))}` failed ({r.returncode}): {r.stderr.strip()}")
    return r


def export_both(run: Path) -> dict:
    for fmt in ("pt2", "onnx"):
        print(ecotrain("export", run, "--format", fmt).stdout.strip())
    return json.loads((run / "export.json").read_text())["files"]


def card_parses(run: Path) -> bool:
    from huggingface_hub import ModelCard  # the reader the Hugging Face Hub uses; a local path: offline

    card = ModelCard.load(run / "README.md")
    ledger = json.loads((run / "ledger.json").read_text())
    co2 = card.data.to_dict().get("co2_eq_emissions") or {}
    return co2.get("emissions") == ledger["co2e"]["kg"] * 1000


def predict_without_class(run: Path, work: Path) -> bool:
    from ecotrain.config import load_config
    from ecotrain.data import load_data

    test = load_data(load_config(run / "config.yaml")).test  # the run's own test split, as a file
    data = work / "test.npz"
    np.savez(data, x=test.x.numpy(), y=test.y.numpy())
    ecotrain("predict", run, "--data", data, "--out", work / "eager.csv")
    ecotrain("predict", run / "model.pt2", "--data", data, "--out", work / "pt2.csv", code=NO_CLASS)
    return (work / "eager.csv").read_text() == (work / "pt2.csv").read_text()


def fp32_error(run: Path) -> float:
    """The eager model's own rounding: its float32 logits against the same weights evaluated in float64."""
    import torch

    from ecotrain.export.inference import load_trained

    trained = load_trained(run, "cpu")
    x = trained.bundle.test.take(torch.arange(len(trained.bundle.test)))[0]
    with torch.inference_mode():
        low = trained.model(x).double()
        high = trained.model.double()(x.double())
    return float((low - high).abs().max())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", help="folder for the runs (default: a temporary one)")
    ap.add_argument("--cnn-steps", type=int, default=6000)
    ap.add_argument("--lm-steps", type=int, default=300)
    ap.add_argument("--quick", action="store_true", help="the CNN only, 20 steps: checks the bench runs")
    a = ap.parse_args()
    if a.quick:
        a.cnn_steps = 20
    work = Path(a.work or tempfile.mkdtemp(prefix="ecotrain-export-"))
    if a.quick and not a.work:
        atexit.register(shutil.rmtree, work, ignore_errors=True)
    cnn, lm = work / "cnn", work / "charlm"
    print(ecotrain("fit", "recipes/mnist1d_cnn.yaml", f"loop.max_steps={a.cnn_steps}", "--run-dir", cnn,
                   "--quiet", "--overwrite").stdout.strip())
    records = {"cnn": export_both(cnn)}
    if not a.quick:
        print(ecotrain("fit", "recipes/charlm_long.yaml", *LM, f"loop.max_steps={a.lm_steps}", "--run-dir", lm,
                       "--quiet", "--overwrite").stdout.strip())
        records["charlm"] = export_both(lm)
    pt2 = {k: r["model.pt2"]["program"]["max_abs_diff"] for k, r in records.items()}
    onnx = {k: r["model.onnx"]["onnxruntime"]["max_abs_diff"] for k, r in records.items()}
    lm_pt2, lm_onnx = (f"{d['charlm']:.3g}" if "charlm" in d else "skipped" for d in (pt2, onnx))
    acc_equal = all(r["model.pt2"]["program"]["test_accuracy"] == r["model.pt2"]["eager"]["test_accuracy"]
                    for r in records.values())
    relative = max(r["model.onnx"]["onnxruntime"]["relative_diff"] for r in records.values())
    parses, no_class = card_parses(cnn), predict_without_class(cnn, work)
    print(f"RESULT pt2_max_abs_diff={max(pt2.values()):.3g} onnx_max_abs_diff={max(onnx.values()):.3g} "
          f"pt2_max_abs_diff_cnn={pt2['cnn']:.3g} pt2_max_abs_diff_charlm={lm_pt2} "
          f"onnx_max_abs_diff_cnn={onnx['cnn']:.3g} onnx_max_abs_diff_charlm={lm_onnx} "
          f"onnx_relative_diff={relative:.3g} eager_fp32_error_cnn={fp32_error(cnn):.3g} "
          f"pt2_acc_equal={str(acc_equal).lower()} card_parses={str(parses).lower()} "
          f"predict_without_class={str(no_class).lower()}")


if __name__ == "__main__":
    main()
