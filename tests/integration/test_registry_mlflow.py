"""The registry on MLflow's Model Registry, in a real sqlite store (no server, nothing mocked): versions
as model versions, champion/challenger aliases, the gate's figures as tags, promote and rollback
through the folder registry's own functions, downloads verified before use, one-line errors."""

import json
import sys
from pathlib import Path

import pytest
import torch

from ecotrain.continual.registry import Registry, Slice, format_table, promote, rollback
from ecotrain.continual.registry_mlflow import MlflowRegistry, open_registry
from ecotrain.base.errors import CheckpointError, ConfigError

pytest.importorskip("mlflow")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One sqlite store for the module (MLflow's migrations take seconds); each test its own model."""
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlruns.db'}"
    MlflowClient(tracking_uri=uri, registry_uri=uri).search_registered_models()  # creates the tables
    return root, uri


@pytest.fixture
def reg_of(store, tmp_path, monkeypatch):
    """reg_of(model, cache=...) -> an MlflowRegistry on the module's store, caching under tmp_path."""
    root, uri = store

    def make(model: str, cache: str = "cache") -> MlflowRegistry:
        monkeypatch.setenv("ECOTRAIN_CACHE", str(tmp_path / cache))
        reg = open_registry(f"mlflow:{uri}#{model}")
        assert isinstance(reg, MlflowRegistry)
        return reg

    return make


def _client(store):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=store[1], registry_uri=store[1])


def _weights(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"fc.weight": torch.randn(4, 3, generator=g), "fc.bias": torch.randn(4, generator=g)}


SLICE = Slice("task+0", torch.randn(6, 3, generator=torch.Generator().manual_seed(0)), torch.arange(6) % 4,
              torch.tensor([0, 1, 0, 1, 0, 1]))


def _commit(reg, seed: int, status: str, parent=None, files=None) -> str:
    meta = {"parent": parent, "config": {"seed": seed}, "cohort_note": "kept",
            "metrics": {"tasks": {"task+0": 0.5 + seed / 100}, "average_accuracy": 0.5 + seed / 100,
                        "gate": {"promote": status == "promoted", "reason": f"gate of {seed}", "tolerance": 0.02}}}

    def settle(idx, name):
        idx["versions"][name]["note"] = {"seed": seed}  # any other key survives the round trip
        reg.make_current(idx, name, "ok") if status == "promoted" else reg.set_status(idx, name, status, "not yet")

    return reg.commit(_weights(seed), meta, files or {}, [SLICE], settle)


def test_versions_aliases_gate_tags_promote_and_rollback(store, reg_of):
    reg = reg_of("flow")
    assert reg.index()["versions"] == {} and reg.next_name(reg.index()) == "v0001"
    v1 = _commit(reg, 1, "promoted")
    v2 = _commit(reg, 2, "candidate", parent=v1)
    assert (v1, v2) == ("v0001", "v0002")
    c = _client(store)
    model = c.get_registered_model("flow")
    assert model.aliases == {"champion": 1, "challenger": 2}
    mv2 = c.get_model_version("flow", "2")
    assert mv2.tags["ecotrain.status"] == "candidate" and mv2.tags["ecotrain.parent"] == "v0001"
    assert mv2.tags["gate.reason"] == "gate of 2" and mv2.tags["gate.promote"] == "false"
    assert mv2.tags["gate.tolerance"] == "0.02" and mv2.tags["accuracy.task_0"] == "0.5200"
    run = c.get_run(mv2.run_id)
    assert run.data.metrics["average_accuracy"] == pytest.approx(0.52) and run.data.metrics["tasks.task_0"] > 0
    assert mv2.source.endswith("/version")

    idx = reg.existing_index()
    assert idx["current"] == "v0001" and idx["versions"]["v0002"]["note"] == {"seed": 2}
    assert idx["versions"]["v0001"]["parent"] is None and idx["versions"]["v0002"]["reason"] == "not yet"
    idx["cohorts"] = {"3": "v0002"}  # an index key of its own survives too
    with reg.locked():
        reg.write_index(idx)
    assert reg.index()["cohorts"] == {"3": "v0002"}
    assert "* v0001" in format_table(reg.index())

    assert promote(reg, "v0002").startswith("v0002 is now current")
    assert c.get_registered_model("flow").aliases == {"champion": 2}  # no candidate left: no challenger
    assert reg.resolve("current") == "v0002"
    assert rollback(reg) == "rolled back: current is v0001 (was v0002)"
    idx = reg.index()
    assert idx["current"] == "v0001" and idx["versions"]["v0002"]["status"] == "rolled_back"
    assert [h["current"] for h in idx["history"]] == ["v0001", "v0002", "v0001"]
    assert c.get_registered_model("flow").aliases == {"champion": 1}

    v3 = _commit(reg, 3, "rejected", parent=v1)  # numbering goes on; a rejected one holds no alias
    assert v3 == "v0003" and c.get_registered_model("flow").aliases == {"champion": 1}


def test_round_trip_from_a_fresh_cache_is_bit_identical(store, reg_of, tmp_path):
    from safetensors.torch import save_file

    export = tmp_path / "export.safetensors"
    save_file({"replay/x": torch.arange(12.0).reshape(4, 3)}, str(export))
    writer = reg_of("trip", cache="writer")
    name = _commit(writer, 7, "promoted", files={"export.safetensors": export})
    reader = reg_of("trip", cache="reader")  # another machine: nothing cached yet
    meta = reader.read_meta(reader.resolve("current"))
    assert meta["config"] == {"seed": 7} and meta["cohort_note"] == "kept"
    got = reader.weights(name)
    assert all(torch.equal(got[k], v) for k, v in _weights(7).items())
    folder = reader.path(name)
    assert folder.is_relative_to(tmp_path / "reader")
    for f in ("tensors.safetensors", "meta.json", "MANIFEST.json", "export.safetensors"):
        assert (folder / f).read_bytes() == (writer.path(name) / f).read_bytes()
    s = reader.get_slice(meta["slices"][0])
    assert s.name == "task+0" and torch.equal(s.x, SLICE.x) and torch.equal(s.cohort, SLICE.cohort)
    assert (reader.data_dir / meta["slices"][0]).is_dir()


def _artifact(store, model: str, version: str, rel: str) -> Path:
    from mlflow.utils.file_utils import local_file_uri_to_path

    return Path(local_file_uri_to_path(_client(store).get_model_version(model, version).source)) / rel


def test_damaged_artifact_in_the_store_is_refused(store, reg_of):
    writer = reg_of("damaged", cache="writer")
    _commit(writer, 1, "promoted")
    name = _commit(writer, 2, "candidate", parent="v0001")
    target = _artifact(store, "damaged", "2", "tensors.safetensors")
    data = bytearray(target.read_bytes())
    data[-3] ^= 0x01
    target.write_bytes(bytes(data))
    reader = reg_of("damaged", cache="reader")
    with pytest.raises(CheckpointError, match="v0002 .* is damaged in the store: .*does not match its checksum") as err:
        reader.read_meta(name)
    assert "\n" not in str(err.value)
    with pytest.raises(CheckpointError):
        promote(reader, name)  # never made current
    assert _client(store).get_registered_model("damaged").aliases["champion"] == 1
    assert not list((reader.versions_dir).glob("v0002*"))  # nothing damaged is cached


def test_damaged_cached_copy_is_fetched_again(store, reg_of):
    reg = reg_of("healing")
    name = _commit(reg, 4, "promoted")
    cached = reg.path(name) / "tensors.safetensors"
    reg._fresh.clear()  # as in a later process: the copy is an old one now
    data = bytearray(cached.read_bytes())
    data[-1] ^= 0x10
    cached.write_bytes(bytes(data))
    assert torch.equal(reg.weights(name)["fc.bias"], _weights(4)["fc.bias"])
    sid = reg.read_meta(name)["slices"][0]
    (reg.data_dir / sid / "meta.json").write_text("{}")
    reg._fresh.clear()
    assert reg.get_slice(sid).name == "task+0"


def test_missing_store_model_or_extra_is_one_line(store, reg_of, tmp_path, monkeypatch):
    monkeypatch.setenv("ECOTRAIN_CACHE", str(tmp_path / "cache"))
    for absent in (tmp_path / "mlruns.db", tmp_path / "nowhere" / "mlruns.db"):
        reg = open_registry(f"mlflow:sqlite:///{absent}")
        assert reg.index()["versions"] == {}
        for call in (lambda: reg.resolve("current"), lambda: rollback(reg), lambda: promote(reg, "v0001")):
            with pytest.raises(ConfigError, match=r"^mlflow:sqlite:////.*: no registry here \(no registered model "
                               r"'ecotrain'\)") as err:
                call()
            assert "\n" not in str(err.value)
        assert not absent.exists()  # reading never creates a store

    other = reg_of("empty-here")
    with pytest.raises(ConfigError, match="no registry here"):
        other.existing_index()
    _commit(other, 1, "promoted")
    with pytest.raises(ConfigError, match=r"^mlflow:sqlite:.*#empty-here: no version v0009 \(versions: v0001\)$"):
        other.resolve("v0009")

    for bad in ("bogus://x", "http://127.0.0.1:1"):  # no such store kind; nothing listening (at once, no retries)
        with pytest.raises(ConfigError, match=rf"^mlflow:{bad}: cannot open the MLflow store \(") as err:
            open_registry(f"mlflow:{bad}").existing_index()
        assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="give the tracking URI"):
        open_registry("mlflow:")
    with pytest.raises(ConfigError, match="not a registered model name"):
        open_registry(f"mlflow:{store[1]}#a/b")

    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if the extra were not installed
    with pytest.raises(ConfigError) as err:
        open_registry(f"mlflow:{store[1]}")
    assert str(err.value) == (f"registry mlflow:{store[1]}: needs the mlflow extra: pip install 'ecotrain[mlflow]'")


def test_a_plain_path_is_the_folder_registry(tmp_path):
    reg = open_registry(tmp_path / "reg")
    assert type(reg) is Registry and reg.root == tmp_path / "reg"
    assert type(open_registry(str(tmp_path / "reg"))) is Registry


def test_relative_sqlite_path_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    reg = open_registry("mlflow:sqlite:///rel/mlruns.db#m")
    assert reg.uri == f"sqlite:///{tmp_path.resolve() / 'rel' / 'mlruns.db'}" and reg.model == "m"
    assert json.dumps(reg.index()["versions"]) == "{}"
