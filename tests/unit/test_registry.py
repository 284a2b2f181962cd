"""The model registry: atomic versions verified on read, names that are never paths, the lock between
real processes, promote and rollback."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from ecotrain.continual.registry import Registry, Slice, check_version_name, format_table, promote, rollback
from ecotrain.base.errors import CheckpointError, ConfigError


def _weights(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"fc.weight": torch.randn(4, 3, generator=g), "fc.bias": torch.randn(4, generator=g)}


def _commit(reg: Registry, seed: int, status: str = "promoted", parent=None, files=None) -> str:
    s = Slice("task0", torch.randn(5, 3), torch.arange(5) % 4)

    def settle(idx, name):
        reg.make_current(idx, name, "ok") if status == "promoted" else reg.set_status(idx, name, status, "no")

    return reg.commit(_weights(seed), {"parent": parent, "config": {"seed": seed}}, files or {}, [s], settle)


def test_version_round_trip_and_table(tmp_path):
    reg = Registry(tmp_path / "reg")
    export = tmp_path / "export.safetensors"
    from safetensors.torch import save_file
    save_file({"replay/x": torch.ones(2, 3)}, str(export))
    name = _commit(reg, 1, files={"export.safetensors": export})
    assert name == "v0001" and reg.index()["current"] == "v0001"
    meta = reg.read_meta(name)
    assert meta["config"] == {"seed": 1} and meta["slices"][0].startswith("task0-")
    assert torch.equal(reg.weights(name)["fc.weight"], _weights(1)["fc.weight"])
    manifest = json.loads((reg.path(name) / "MANIFEST.json").read_text())
    assert "export.safetensors" in manifest["files"]  # the export is under the same checksums
    got = reg.get_slice(meta["slices"][0])
    assert got.name == "task0" and got.x.shape == (5, 3)
    assert "* v0001" in format_table(reg.index())


@pytest.mark.parametrize("damage", ["flip", "truncate", "export"])
def test_damaged_version_is_one_line(tmp_path, damage):
    reg = Registry(tmp_path / "reg")
    export = tmp_path / "e.safetensors"
    from safetensors.torch import save_file
    save_file({"ewc/fisher": torch.ones(64)}, str(export))
    name = _commit(reg, 2, files={"export.safetensors": export})
    target = reg.path(name) / ("export.safetensors" if damage == "export" else "tensors.safetensors")
    data = bytearray(target.read_bytes())
    if damage == "truncate":
        target.write_bytes(bytes(data[: len(data) // 2]))
    else:
        data[-5] ^= 0x01  # one bit in the tensor bytes
        target.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="does not match its checksum") as err:
        reg.read_meta(name)
    assert "\n" not in str(err.value)
    with pytest.raises(CheckpointError):  # promote refuses it too
        promote(reg, name)


def test_damaged_slice_is_detected(tmp_path):
    reg = Registry(tmp_path / "reg")
    sid = reg.put_slice(Slice("t", torch.zeros(4, 2), torch.zeros(4, dtype=torch.long)))
    f = reg.data_dir / sid / "tensors.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0x40
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum"):
        reg.get_slice(sid)


@pytest.mark.parametrize("bad", ["../v0001", "v0001/../../etc", "/tmp/v1", "v", "v12a", "", "current/.."])
def test_version_names_are_never_paths(tmp_path, bad):
    with pytest.raises(ConfigError, match="not a version name"):
        check_version_name(bad)
    with pytest.raises(ConfigError):
        Registry(tmp_path).resolve(bad)


def test_promote_and_rollback(tmp_path):
    reg = Registry(tmp_path / "reg")
    v1 = _commit(reg, 1)
    v2 = _commit(reg, 2, "rejected", parent=v1)
    assert reg.index()["current"] == v1
    with pytest.raises(ConfigError, match="nothing to roll back"):
        rollback(reg)
    assert "was rejected" in promote(reg, v2)
    v3 = _commit(reg, 3, parent=v2)
    assert reg.index()["current"] == v3
    assert rollback(reg) == f"rolled back: current is {v2} (was {v3})"
    assert rollback(reg) == f"rolled back: current is {v1} (was {v2})"
    idx = reg.index()
    assert idx["current"] == v1
    assert idx["versions"][v3]["status"] == idx["versions"][v2]["status"] == "rolled_back"
    with pytest.raises(ConfigError, match="no version v0009"):
        promote(reg, "v0009")


WORKER = textwrap.dedent("""
    import os, sys, time, torch
    from ecotrain.continual.registry import Registry
    reg = Registry(sys.argv[1])
    print("ready", flush=True)
    while not os.path.exists(sys.argv[2]):  # both processes begin together
        time.sleep(0.005)
    for i in range(6):
        def settle(idx, name):
            time.sleep(0.01)  # widen the window a missing lock would lose an index update in
            reg.set_status(idx, name, "candidate", sys.argv[3])
        reg.commit({"w": torch.full((8,), float(i))}, {"parent": None}, {}, [], settle)
""")


def test_lock_two_processes_commit_without_loss(tmp_path):
    root = tmp_path / "reg"
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(root), str(go), tag], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for tag in ("A", "B")]
    for p in procs:
        assert p.stdout.readline().strip() == b"ready", p.stderr.read().decode()[-2000:]
    go.touch()
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()[-2000:]
    reg = Registry(root)
    idx = reg.index()
    assert sorted(idx["versions"]) == [f"v{i:04d}" for i in range(1, 13)]
    assert sorted(v["reason"] for v in idx["versions"].values()) == ["A"] * 6 + ["B"] * 6
    for name in idx["versions"]:
        reg.read_meta(name)  # every folder complete and verified
    assert not list(reg.versions_dir.glob(".tmp-*"))


HOLDER = textwrap.dedent("""
    import sys, time
    from ecotrain.continual.lock import registry_lock  # no torch: starts in a fraction of a second
    with registry_lock(sys.argv[1]):
        print("locked", flush=True)
        time.sleep(30)
""")


def test_lock_timeout_names_the_holder(tmp_path):
    root = tmp_path / "reg"
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(root)], stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline().strip() == b"locked"
        with pytest.raises(ConfigError, match=rf"locked by another process \(pid {p.pid}\)"):
            with Registry(root).locked(timeout=0.3):
                pass
    finally:
        p.kill()
        p.wait()
    with Registry(root).locked(timeout=5):  # the kernel released the dead holder's lock
        pass


def test_promote_on_a_full_disk_changes_nothing(tmp_path):
    """A real write failure from the OS (RLIMIT_FSIZE -> EFBIG, as a full disk) during `ecotrain promote`:
    one line, a non-zero exit, index.json byte for byte as it was, no temporary file left."""
    reg = Registry(tmp_path / "reg")
    v1 = _commit(reg, 1)
    v2 = _commit(reg, 2, "rejected", parent=v1)
    def files():  # registry.lock holds the last holder's pid: it changes by design
        return {p.name: p.read_bytes() for p in (tmp_path / "reg").iterdir() if p.is_file() and p.suffix != ".lock"}

    before = files()
    code = ("import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN);"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64));"
            "from ecotrain.cli import main; sys.exit(main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", code, "promote", v2, "--registry", str(tmp_path / "reg")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "index.json" in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert files() == before and reg.index()["current"] == v1


def _edit_index(reg: Registry, change) -> bytes:
    idx = json.loads(reg.index_path.read_text())
    change(idx)
    reg.index_path.write_text(json.dumps(idx))
    return reg.index_path.read_bytes()


@pytest.mark.parametrize("change, said", [
    (lambda i: i.update(current="v0009"), "the registry index's 'current' names v0009, which is not among its "
                                          "versions (v0001, v0002); set it to one of them (or null) in index.json"),
    (lambda i: i.update(cohorts={"eu": "v0007"}), "'cohorts.eu' names v0007, which is not among its versions"),
    (lambda i: i.pop("history"), "the registry index has no 'history' (the record of promotions rollback reads); "
                                 'add "history": [] to it'),
    (lambda i: i.update(history=[{"time": "x"}]), "the registry index has no 'history.0.current' field"),
    (lambda i: i.update(versions=[]), "the registry index's 'versions' is [], not an object"),
    (lambda i: i["versions"].update({"../x": {}}), "lists '../x', not a version name"),
])
def test_a_damaged_index_is_one_line_saying_how_to_repair_it(tmp_path, change, said):
    """Never a KeyError: every command that reads the index (list, resolve, promote, rollback) says what is
    wrong in which file and what to do, and leaves the file as it was."""
    reg = Registry(tmp_path / "reg")
    _commit(reg, 1)
    _commit(reg, 2)
    before = _edit_index(reg, change)
    for command in (reg.index, lambda: reg.resolve("current"), lambda: rollback(reg), lambda: promote(reg, "v0001")):
        with pytest.raises(CheckpointError) as err:
            command()
        assert str(err.value).startswith(f"{reg.index_path}: ") and said in str(err.value)
    assert reg.index_path.read_bytes() == before


def test_a_version_record_of_another_shape_is_named(tmp_path):
    reg = Registry(tmp_path / "reg")
    name = reg.commit(_weights(1), {"parent": None, "config": {}, "input_shape": "64"}, {}, [], lambda i, n: None)
    with pytest.raises(CheckpointError, match=r"meta.json: the version v0001's record's 'input_shape' is \"64\", "
                                              "not a list"):
        reg.read_meta(name)
