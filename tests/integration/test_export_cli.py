"""`ecotrain export`, `ecotrain predict MODEL.pt2|.onnx` and their refusals on real run folders, through
the real CLI: the parity figures in export.json, the card beside the file, predictions from the file
alone after the model's class is gone, and one line with nothing written for a model that cannot be
exported or does not match its export."""

import contextlib
import csv
import importlib.util
import json
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from ecotrain import Config, fit
from ecotrain.cli import main
from ecotrain.data import load_data
from ecotrain.export.inference import predict
from tests.conftest import run_cli

HAS_ONNX = all(importlib.util.find_spec(m) for m in ("onnx", "onnxscript", "onnxruntime"))

MODELS = textwrap.dedent('''
    import torch
    from torch import nn


    class ShipNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))

        def forward(self, x):
            return self.net(x)


    class Branchy(ShipNet):
        def forward(self, x):
            if x.sum() > 0:
                return self.net(x)
            return -self.net(x)


    class Noisy(ShipNet):
        def forward(self, x):
            return self.net(x) + 0.1 * torch.randn(x.shape[0], 10)
''')
DATA = {"name": "digits", "batch_size": 32, "val_split": 0.15}


@contextlib.contextmanager
def _importable(folder):
    """`shipmods` imported from `folder` (each test has its own: never another test's, cached)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(folder))
        mp.delitem(sys.modules, "shipmods", raising=False)
        yield
        sys.modules.pop("shipmods", None)


def _train(folder, model: str):
    """A short real run of a user's model class (module `shipmods` in `folder`)."""
    (folder / "shipmods.py").write_text(MODELS)
    run = folder / model
    with _importable(folder):
        fit(Config.model_validate({"data": DATA, "model": {"name": f"shipmods:{model}"},
                                   "loop": {"max_steps": 30, "max_epochs": None, "eval_every": 15},
                                   "logging": {"progress": "off"}, "ledger": {"energy": "off"}}),
            run_dir=run, quiet=True)
    return run


@pytest.fixture(scope="module")
def test_file(tmp_path_factory):
    test = load_data(Config.model_validate({"data": DATA})).test
    path = tmp_path_factory.mktemp("data") / "test.npz"
    np.savez(path, x=test.x.numpy()[:60], y=test.y.numpy()[:60])
    return path


def _rows(path):
    return list(csv.DictReader(open(path)))


def test_export_checks_parity_writes_the_card_and_predicts_without_the_class(tmp_path, test_file):
    mods = tmp_path / "mods"
    mods.mkdir()
    run = _train(mods, "ShipNet")
    env = {"PYTHONPATH": str(mods)}
    r = run_cli("export", run, env=env)
    assert r.returncode == 0, r.stderr
    assert "parity on the test split (359 samples): max abs diff 0 (program)" in r.stdout
    record = json.loads((run / "export.json").read_text())["files"]["model.pt2"]
    summary = json.loads((run / "summary.json").read_text())
    assert record["max_abs_diff"] <= 1e-5 and record["samples"] == 359
    fresh = record["fresh_process"]  # read back by a new python that cannot import transformers
    assert fresh["blocked"] == ["transformers"] and fresh["max_abs_diff"] <= 1e-5 and fresh["nonfinite"] == 0
    assert record["program"]["test_accuracy"] == record["eager"]["test_accuracy"] == summary["test_accuracy"]
    assert record["inputs"][0]["shape"] == [{"min": 0, "max": None}, 64]
    card = (run / "README.md").read_text()
    assert card.startswith("---\n") and "model.pt2" in card and "validation" in card

    with pytest.MonkeyPatch.context() as mp:  # what the run folder predicts, with the class importable
        mp.syspath_prepend(str(mods))
        predict(run, [str(test_file)], tmp_path / "eager.csv")
    shutil.rmtree(mods / "__pycache__", ignore_errors=True)
    (mods / "shipmods.py").unlink()  # the class is gone: the run folder can no longer be rebuilt
    gone = subprocess.run([sys.executable, "-c", "import shipmods"], cwd=tmp_path, capture_output=True, text=True)
    assert gone.returncode != 0 and "No module named 'shipmods'" in gone.stderr
    r = run_cli("predict", run / "model.pt2", "--data", test_file, "--out", tmp_path / "pt2.csv")
    assert r.returncode == 0 and "wrote 60 predictions" in r.stdout, r.stderr
    assert _rows(tmp_path / "pt2.csv") == _rows(tmp_path / "eager.csv")  # the same CSV, to the digit


@pytest.mark.skipif(not HAS_ONNX, reason="the onnx extra is not installed")
def test_onnx_export_is_checked_in_onnxruntime_and_predicts(tmp_path, test_file, capsys):
    run = _train(tmp_path, "ShipNet")
    out = tmp_path / "dist" / "net.onnx"
    out.parent.mkdir()
    with _importable(tmp_path):
        assert main(["export", str(run), "--format", "onnx", "--out", str(out)]) == 0
        predict(run, [str(test_file)], tmp_path / "eager.csv")
    record = json.loads((out.parent / "export.json").read_text())["files"]["net.onnx"]
    assert record["onnxruntime"]["max_abs_diff"] <= 1e-5 and record["program"]["max_abs_diff"] == 0
    assert record["onnxruntime"]["test_accuracy"] == record["eager"]["test_accuracy"]
    assert (out.parent / "README.md").is_file()  # the card goes beside the exported file
    assert main(["predict", str(out), "--data", str(test_file), "--out", str(tmp_path / "onnx.csv")]) == 0
    got, want = _rows(tmp_path / "onnx.csv"), _rows(tmp_path / "eager.csv")
    assert [r["prediction"] for r in got] == [r["prediction"] for r in want]
    probs = lambda rows: np.array([[float(r[f"prob_{k}"]) for k in range(10)] for r in rows])  # noqa: E731
    assert np.abs(probs(got) - probs(want)).max() < 1e-5


def test_a_model_that_cannot_be_exported_is_one_line_and_nothing_is_written(tmp_path, capfd):
    run = _train(tmp_path, "Branchy")
    before = sorted(p.name for p in run.iterdir())
    capfd.readouterr()
    with _importable(tmp_path):
        assert main(["export", str(run)]) == 2
    out, err = capfd.readouterr()  # file descriptors: torch's own prints would show here too
    assert out == "" and len(err.strip().splitlines()) == 1, err  # not torch's pages of graph
    assert "Branchy.forward cannot be exported: data-dependent control flow" in err
    assert "shipmods.py" in err and "if x.sum() > 0:" in err and "torch.cond" in err
    assert sorted(p.name for p in run.iterdir()) == before


def test_an_export_that_differs_from_eager_is_exit_1_and_not_kept(tmp_path, capsys):
    run = _train(tmp_path, "Noisy")
    before = sorted(p.name for p in run.iterdir())
    with _importable(tmp_path):
        assert main(["export", str(run)]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "parity check failed" in err and "tolerance 0.0001" in err
    assert sorted(p.name for p in run.iterdir()) == before  # no model.pt2, export.json, README.md


def test_export_refuses_a_wrong_suffix_and_never_replaces_a_users_readme(tmp_path, capsys):
    run = _train(tmp_path, "ShipNet")
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "README.md").write_text("# ours\n")
    with _importable(tmp_path):
        assert main(["export", str(run), "--out", str(dist / "m.onnx")]) == 2  # --format pt2 (default)
        assert "ends in .pt2" in capsys.readouterr().err
        assert main(["export", str(run), "--out", str(dist / "m.pt2")]) == 0
    assert "is not ecotrain's, so no card" in capsys.readouterr().out
    assert (dist / "README.md").read_text() == "# ours\n" and (dist / "m.pt2").is_file()
    program = torch.export.load(dist / "m.pt2").module()  # plain torch, as any user loads it
    assert program(torch.zeros(3, 64)).shape == (3, 10)


def test_batchnorm_domains_export_one_program_per_domain(tmp_path, capsys):
    """`policy: domain`: each export holds one domain's statistics, checked against eager with the same."""
    base = {"data": DATA, "model": {"name": "resnet", "kwargs": {"widths": [8]}},
            "loop": {"max_steps": 10, "max_epochs": None, "eval_every": 5},
            "logging": {"progress": "off"}, "ledger": {"energy": "off"}}
    fit(Config.model_validate(base), run_dir=tmp_path / "pre", quiet=True)
    test = load_data(Config.model_validate(base)).test
    x, y = test.x.numpy() * 2 + 1, test.y.numpy()
    np.savez(tmp_path / "shifted.npz", x=x, y=y, x_test=x, y_test=y)
    ft = tmp_path / "ft"
    fit(Config.model_validate({**base, "data": {"name": "npz", "path": str(tmp_path / "shifted.npz"), "batch_size": 8},
                               "methods": [{"name": "batchnorm", "policy": "domain", "domain": "shifted"}]}),
        run_dir=ft, quiet=True, init_from=tmp_path / "pre" / "model.safetensors")
    assert main(["export", str(ft), "--no-card"]) == 0
    assert main(["export", str(ft), "--domain", "elsewhere", "--no-card"]) == 0
    files = json.loads((ft / "export.json").read_text())["files"]
    assert files["model.pt2"]["bn_statistics"].startswith("the run's own domain")
    assert files["model-elsewhere.pt2"]["bn_statistics"] == "pre-trained"  # an unknown domain: the fallback
    assert all(f["max_abs_diff"] == 0 for f in files.values()) and not (ft / "README.md").exists()
    own, other = (torch.export.load(ft / n).module() for n in ("model.pt2", "model-elsewhere.pt2"))
    batch = torch.as_tensor(x[:16])
    assert not torch.allclose(own(batch), other(batch))  # different statistics, as constants of each program
