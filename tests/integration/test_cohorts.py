"""Per-cohort versions served from the registry, end to end (continual/serve.py): a base version, a
cohort whose inputs are shifted (a new microphone, say), its adapter gated as served and promoted on
its own, `predict`/`eval --registry` routing by the request's cohort and by the learned router, an
unknown cohort served by the base, and the cohort rolled back on its own."""

import csv
import json

import numpy as np
import pytest

from ecotrain import Config, fit
from ecotrain.cli import main
from ecotrain.continual.registry import Registry
from ecotrain.continual.scenario import write_tasks

TRAIN = ["loop.max_steps=60", "optim.lr=0.01"]
ADAPTERS = "methods=[{name: adapters, target_modules: [net.0, net.3], r: 4}]"


def ecotrain(capsys, *args):
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def shifted(z, k=None):
    """The cohort's inputs: the same signals, reversed in time and offset (what the base never saw)."""
    x = z["x"][:, ::-1] + 1.5
    return np.ascontiguousarray(x[:k] if k else x).astype(np.float32)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("cohorts")
    task0 = write_tasks(root / "tasks", num_samples=2000, tasks=5)[0]
    cfg = Config.model_validate({
        "name": "base", "data": {"name": "npz", "path": str(task0), "num_classes": 10, "batch_size": 32},
        "model": {"name": "mlp", "kwargs": {"hidden": [64]}},
        "loop": {"max_steps": 60, "max_epochs": None, "log_every": 20}, "logging": {"progress": "off"},
        "ledger": {"enabled": False}})
    fit(cfg, run_dir=root / "base", quiet=True)
    z = dict(np.load(task0))
    np.savez(root / "cohort.npz", x=shifted(z), y=z["y"], x_test=shifted({"x": z["x_test"]}), y_test=z["y_test"])
    # requests: the base's own test inputs, then the cohort's, each with its cohort column
    n = len(z["y_test"])
    np.savez(root / "requests.npz", x=np.concatenate([z["x_test"].astype(np.float32), shifted({"x": z["x_test"]})]),
             y=np.concatenate([z["y_test"], z["y_test"]]), cohort=np.array([0] * n + [7] * n))
    return root, n


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_cohort_version_routed_and_rolled_back(world, capsys):
    root, n = world
    reg_dir = root / "registry"
    reg = Registry(reg_dir)
    R = ["--registry", reg_dir]
    assert ecotrain(capsys, "versions", "add", root / "base", *R)[0] == 0
    assert (reg.path("v0001") / "router.safetensors").is_file()  # the base's examples for the router

    code, out, err = ecotrain(capsys, "update", "current", root / "cohort.npz", "--cohort", "7", "--cap", "0.05",
                              *R, ADAPTERS, *TRAIN)
    assert code == 0, out + err
    assert "v0002: promoted" in out
    idx = reg.index()
    assert idx["current"] == "v0001" and idx["cohorts"] == {"7": "v0002"}  # the base still serves everyone else
    assert idx["versions"]["v0002"]["cohort"] == "7"
    gate = idx["versions"]["v0002"]["gate"]  # the decision and its figures, in the registry's entry
    assert gate["promote"] is True and gate["cap"] == 0.05
    assert gate["after"]["cohort"] > gate["before"]["cohort"] + 0.2  # the cohort, served its own version
    assert gate["before"]["base"] - gate["after"]["base"] <= 0.05  # old users, routed, within the cap

    # the request's cohort column picks the version; the router is not asked
    code, out, err = ecotrain(capsys, "predict", "current", *R, "--data", root / "requests.npz",
                              "--out", root / "p.csv")
    assert code == 0, err
    rows = _rows(root / "p.csv")
    assert [r["version"] for r in rows] == ["v0001"] * n + ["v0002"] * n  # cohort 0 has no version: the base
    assert rows[0].keys() >= {"index", "prediction", "label", "cohort", "version", "prob_0"}

    # no cohort given: the learned router tells the two input distributions apart
    z = np.load(root / "requests.npz")
    np.savez(root / "anon.npz", x=z["x"], y=z["y"])
    code, _, err = ecotrain(capsys, "predict", "current", *R, "--data", root / "anon.npz", "--out", root / "a.csv")
    assert code == 0, err
    routed = [r["version"] for r in _rows(root / "a.csv")]
    router_accuracy = np.mean([v == want for v, want in zip(routed, ["v0001"] * n + ["v0002"] * n)])
    assert router_accuracy >= 0.9

    code, out, err = ecotrain(capsys, "eval", "current", *R, "--data", root / "anon.npz", "--out", root / "e.json")
    assert code == 0, err
    rec = json.loads((root / "e.json").read_text())
    assert rec["router"] is True and set(rec["routes"]) == {"v0001", "v0002"}
    code, _, _ = ecotrain(capsys, "eval", "current", *R, "--data", root / "anon.npz", "--cohort", "99",
                          "--out", root / "e99.json")
    assert code == 0 and set(json.loads((root / "e99.json").read_text())["routes"]) == {"v0001"}  # unknown: base
    served_base = json.loads((root / "e99.json").read_text())["accuracy"]
    assert rec["accuracy"] > served_base + 0.1  # routing pays: the cohort's half is read by its adapter

    # the cohort rolled back on its own: served by the base again, `current` untouched
    code, out, _ = ecotrain(capsys, "rollback", *R, "--cohort", "7")
    assert code == 0 and out.strip() == "rolled back cohort 7: served by the base (current) (was v0002)"
    idx = reg.index()
    assert idx["cohorts"] == {} and idx["current"] == "v0001" and idx["versions"]["v0002"]["status"] == "rolled_back"
    code, _, err = ecotrain(capsys, "rollback", *R, "--cohort", "7")
    assert code != 0 and "no version serves cohort 7" in err and len(err.strip().splitlines()) == 1

    # promoting it by hand puts it back in its cohort's place, not in `current`'s
    assert ecotrain(capsys, "promote", "v0002", *R)[0] == 0
    assert reg.index()["cohorts"] == {"7": "v0002"} and reg.index()["current"] == "v0001"
    code, out, _ = ecotrain(capsys, "versions", *R)
    assert "adapter (7)" in out and sum(line.startswith("* ") for line in out.splitlines()) == 2


def test_registry_flags_refused_in_one_line(world, capsys):
    root, _ = world
    code, _, err = ecotrain(capsys, "predict", root / "base", "--data", root / "requests.npz", "--cohort", "7",
                            "--out", root / "x.csv")
    assert code != 0 and "--cohort: only with --registry" in err and len(err.strip().splitlines()) == 1
    assert not (root / "x.csv").exists()


def test_update_average_alpha_chosen_on_the_gate(world, capsys):
    """--average: the candidate averaged with the base, alphas tried from the largest down, the first
    the gate takes registered; what is stored is the model the gate measured."""
    from ecotrain.continual.gate import slice_metrics
    from ecotrain.assembly.update import load_version_model

    root, _ = world
    reg_dir = root / "registry-avg"
    R = ["--registry", reg_dir]
    assert ecotrain(capsys, "versions", "add", root / "base", *R)[0] == 0
    code, out, err = ecotrain(capsys, "update", "current", root / "cohort.npz", "--average", "1,0.5,0.25", *R,
                              "methods=[]", *TRAIN)
    assert code in (0, 1), err
    reg = Registry(reg_dir)
    gate = reg.read_meta("v0002")["metrics"]["gate"]
    tried = gate["average"]["tried"]
    assert [t["alpha"] for t in tried] == [1.0, 0.5, 0.25][:len(tried)]  # largest first, to the first taken
    assert [t["promote"] for t in tried][:-1] == [False] * (len(tried) - 1)
    assert tried[-1]["alpha"] == gate["average"]["alpha"] and tried[-1]["promote"] is gate["promote"] is (code == 0)
    slices = [reg.get_slice(sid) for sid in reg.read_meta("v0002")["slices"]]
    stored = slice_metrics(load_version_model(reg, "v0002"), slices)["tasks"]
    assert stored == tried[-1]["tasks"]  # the stored weights are the averaged model the gate measured
    plain = reg.read_meta("v0002")["metrics"]["tasks"]
    assert plain == stored
    code, _, err = ecotrain(capsys, "update", "current", root / "cohort.npz", "--average", "2", *R)
    assert code != 0 and "--average" in err and len(err.strip().splitlines()) == 1


def test_cohort_versions_on_the_mlflow_registry(world, capsys, tmp_path, monkeypatch):
    """The same commands against MLflow's Model Registry (one registry: the index lives there)."""
    from mlflow import MlflowClient

    root, n = world
    monkeypatch.setenv("ECOTRAIN_CACHE", str(tmp_path / "cache"))
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    R = ["--registry", f"mlflow:{uri}#speech"]
    assert ecotrain(capsys, "versions", "add", root / "base", *R)[0] == 0
    code, out, err = ecotrain(capsys, "update", "current", root / "cohort.npz", "--cohort", "7", *R, ADAPTERS, *TRAIN)
    assert code == 0 and "v0002: promoted" in out, out + err
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    assert str(client.get_model_version_by_alias("speech", "champion").version) == "1"  # the base stays current
    tags = client.get_model_version("speech", "2").tags
    assert tags["ecotrain.cohort"] == "7" and tags["ecotrain.status"] == "promoted"
    assert any(k.startswith("gate.") for k in tags)  # the gate's figures, visible in MLflow
    code, _, err = ecotrain(capsys, "predict", "current", *R, "--data", root / "requests.npz", "--out",
                            tmp_path / "p.csv")
    assert code == 0, err
    assert [r["version"] for r in _rows(tmp_path / "p.csv")] == ["v0001"] * n + ["v0002"] * n
    code, out, _ = ecotrain(capsys, "rollback", *R, "--cohort", "7")
    assert code == 0 and "served by the base" in out
