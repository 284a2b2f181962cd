"""`ecotrain eval`, `ecotrain predict` and `ecotrain bn-report` on real run folders and checkpoints."""

import csv
import json
import shutil

import numpy as np
import pytest
import torch

from ecotrain import Config, fit
from ecotrain.data import load_data
from ecotrain.export.inference import evaluate, load_trained, predict
from tests.conftest import run_cli

TINY = {"data": {"name": "digits", "batch_size": 32, "val_split": 0.15},
        "model": {"name": "mlp", "kwargs": {"hidden": [16]}},
        "loop": {"max_steps": 20, "max_epochs": None, "eval_every": 10},
        "checkpoint": {"every_n_steps": 10}, "logging": {"progress": "off"}, "ledger": {"energy": "off"}}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("runs") / "mlp"
    fit(Config.model_validate(TINY), run_dir=path, quiet=True)
    return path


def test_eval_on_a_run_reproduces_its_test_metrics(run):
    r = run_cli("eval", run)
    assert r.returncode == 0, r.stderr
    summary = json.loads((run / "summary.json").read_text())
    written = json.loads((run / "eval-test.json").read_text())
    assert written["accuracy"] == pytest.approx(summary["test_accuracy"], abs=1e-9)
    assert written["loss"] == pytest.approx(summary["test_loss"], rel=1e-6)
    assert written["mode"] == "eval" and written["split"] == "test" and written["samples"] == 359
    assert f"test_accuracy: {summary['test_accuracy']:.4f}" in r.stdout and "eval-test.json" in r.stdout


def test_eval_on_a_bare_checkpoint(run, tmp_path):
    ckpt = tmp_path / "step-00000010"
    shutil.copytree(run / "checkpoints" / "step-00000010", ckpt)  # no run folder around it
    r = run_cli("eval", ckpt, "--split", "val")
    assert r.returncode == 0, r.stderr
    written = json.loads((tmp_path / "eval-step-00000010-val.json").read_text())
    meta = json.loads((ckpt / "meta.json").read_text())
    assert written["accuracy"] == pytest.approx(meta["last_eval"]["val_accuracy"], abs=1e-9)  # the step-10 eval
    assert sorted(p.name for p in ckpt.iterdir()) == ["MANIFEST.json", "meta.json", "tensors.safetensors"]


def test_eval_of_a_checkpoint_inside_its_run_writes_to_the_run(run):
    record, path = evaluate(run / "checkpoints" / "step-00000020")
    assert path == run / "eval-step-00000020-test.json" and path.is_file()
    assert record["accuracy"] == pytest.approx(json.loads((run / "summary.json").read_text())["test_accuracy"])


def test_eval_and_predict_on_a_file(run, tmp_path):
    test = load_data(Config.model_validate(TINY)).test
    np.savez(tmp_path / "d.npz", x=test.x.numpy()[:50], y=test.y.numpy()[:50])
    record, path = evaluate(run, [str(tmp_path / "d.npz")])
    assert path == run / "eval-d-all.json" and record["samples"] == 50
    r = run_cli("predict", run, "--data", tmp_path / "d.npz", "--out", tmp_path / "p.csv")
    assert r.returncode == 0 and "wrote 50 predictions" in r.stdout, r.stderr
    rows = list(csv.DictReader(open(tmp_path / "p.csv")))
    assert len(rows) == 50 and list(rows[0])[:3] == ["index", "prediction", "label"]
    probs = np.array([[float(r[f"prob_{k}"]) for k in range(10)] for r in rows])
    assert np.allclose(probs.sum(1), 1, atol=1e-5)
    assert [int(r["prediction"]) for r in rows] == probs.argmax(1).tolist()
    acc = np.mean([r["prediction"] == r["label"] for r in rows])
    assert acc == pytest.approx(record["accuracy"])  # predict and eval agree, both in eval mode


def test_predict_unlabelled_data(run, tmp_path):
    x = load_data(Config.model_validate(TINY)).test.x.numpy()[:7]
    with open(tmp_path / "u.csv", "w") as f:
        f.write(",".join(f"f{i}" for i in range(64)) + "\n")
        for row in x:
            f.write(",".join(map(str, row)) + "\n")
    rows, path = predict(run, [str(tmp_path / "u.csv")], tmp_path / "out.csv")
    header = (tmp_path / "out.csv").read_text().splitlines()[0].split(",")
    assert rows == 7 and header[:2] == ["index", "prediction"] and "label" not in header


def test_eval_with_data_overrides(run):
    record, path = evaluate(run, ["val_split=0.3"], split="val")
    assert record["split"] == "val" and record["samples"] > 250 and path.name == "eval-digits-val.json"


def test_eval_of_a_groupnorm_run_rebuilds_the_swapped_model(tmp_path):
    cfg = Config.model_validate({**TINY, "model": {"name": "resnet", "kwargs": {"widths": [8]}},
                                 "loop": {"max_steps": 6, "max_epochs": None, "eval_every": 3},
                                 "methods": [{"name": "batchnorm", "policy": "groupnorm", "groups": 4}]})
    s = fit(cfg, run_dir=tmp_path / "gn", quiet=True).summary
    trained = load_trained(tmp_path / "gn")
    assert any(isinstance(m, torch.nn.GroupNorm) for m in trained.model.modules()) and not trained.model.training
    record, _ = evaluate(tmp_path / "gn")
    assert record["accuracy"] == pytest.approx(s["test_accuracy"])
    r = run_cli("bn-report", tmp_path / "gn")
    assert r.returncode == 0 and "BatchNorm policy: groupnorm, groups 4" in r.stdout, r.stderr


def test_bn_report_prints_the_layers(tmp_path):
    cfg = Config.model_validate({**TINY, "model": {"name": "resnet", "kwargs": {"widths": [8]}},
                                 "loop": {"max_steps": 6, "max_epochs": None, "eval_every": 3},
                                 "methods": [{"name": "batchnorm", "policy": "recompute"}]})
    fit(cfg, run_dir=tmp_path / "r", quiet=True)
    r = run_cli("bn-report", tmp_path / "r")
    assert r.returncode == 0, r.stderr
    assert "BatchNorm policy: recompute" in r.stdout and "stem.1" in r.stdout and "eval mode" in r.stdout


def test_a_parquet_run_reads_a_csv_by_column_name(tmp_path):
    """A run trained from Parquet keeps its feature columns (summary.json `inputs`), so a CSV with the
    columns in another order gives the same predictions, and one without a column is one line; before,
    the CSV was read by position and reordered columns changed predictions without a word."""
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(150, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 2] > 0.5)  # a model that ignores no column's position
    names = ["w", "x", "y", "z"]
    (tmp_path / "p").mkdir()
    pq.write_table(pa.table({**{n: x[:, i] for i, n in enumerate(names)}, "label": y}), tmp_path / "p" / "a.parquet")
    run = tmp_path / "run"
    fit(Config.model_validate({**TINY, "data": {"name": f"parquet:{tmp_path / 'p'}", "batch_size": 32,
                                                 "val_split": 0.15}}), run_dir=run, quiet=True)
    assert json.loads((run / "summary.json").read_text())["inputs"] == {"columns": names}

    def table(path, order):
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(order + ["label"])
            w.writerows([[repr(float(x[r, names.index(c)])) for c in order] + [int(y[r])] for r in range(150)])

    table(tmp_path / "same.csv", names)
    table(tmp_path / "swap.csv", names[::-1])
    predict(run, [str(tmp_path / "same.csv")], tmp_path / "same-p.csv")
    predict(run, [str(tmp_path / "swap.csv")], tmp_path / "swap-p.csv")
    read = lambda p: list(csv.DictReader(open(p)))  # noqa: E731
    assert read(tmp_path / "swap-p.csv") == read(tmp_path / "same-p.csv")
    table(tmp_path / "miss.csv", ["z", "w", "x"])
    r = run_cli("predict", run, "--data", tmp_path / "miss.csv", "--out", tmp_path / "miss-p.csv")
    assert r.returncode == 2 and "no column 'y'" in r.stderr and "by name" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "miss-p.csv").exists()
