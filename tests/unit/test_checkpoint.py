"""The checkpoint format and its failure modes: corrupt, truncated, pickles, other models, full disks."""

import errno
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ecotrain import fit
from ecotrain.checkpoint import latest_valid, list_checkpoints, load_state_dict_file, read_checkpoint
from ecotrain.checkpoint.format import flatten, unflatten
from ecotrain.base.errors import CheckpointError, ConfigError

SRC = Path(__file__).resolve().parents[2] / "src"


def _run(tiny_cfg, tmp_path, **over):
    over.setdefault("checkpoint.every_n_steps", 10)
    return fit(tiny_cfg(**over), run_dir=tmp_path)


def test_flatten_roundtrip_keeps_types():
    obj = {"a": torch.arange(3), 1: [1.5, (2, "x"), None], "n": {"t": torch.ones(2, 2)}}
    tensors = {}
    back = unflatten(flatten(obj, tensors), tensors)
    assert set(tensors) == {"a", "n/t"}
    assert back[1] == [1.5, (2, "x"), None] and torch.equal(back["a"], obj["a"]) and torch.equal(back["n"]["t"], obj["n"]["t"])


def test_whole_state_is_in_the_checkpoint(tiny_cfg, tmp_path):
    _run(tiny_cfg, tmp_path, **{"precision": "bf16-mixed"})
    tensors, meta = read_checkpoint(list_checkpoints(tmp_path)[0])
    for key in ("model", "optimizer", "scheduler", "precision", "rng", "augment", "callbacks", "position",
                "best", "config", "dataset_hash", "env", "metrics_offset"):
        assert key in meta, key
    assert meta["position"]["step"] == 60 and meta["rng"]["torch"]["__tensor__"] in tensors
    assert any(k.startswith("optimizer/state/") for k in tensors) and any(k.startswith("best/weights/") for k in tensors)


def test_keep_last_k(tiny_cfg, tmp_path):
    _run(tiny_cfg, tmp_path, **{"checkpoint.keep_last": 2})
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000060", "step-00000050"]


def test_corrupt_or_truncated_newest_falls_back(tiny_cfg, tmp_path, capsys):
    _run(tiny_cfg, tmp_path, **{"checkpoint.keep_last": 3})
    newest, middle, oldest = list_checkpoints(tmp_path)
    t = newest / "tensors.safetensors"
    t.write_bytes(t.read_bytes()[:-100])  # truncated
    m = middle / "meta.json"
    m.write_text(m.read_text().replace('"step": 50', '"step": 51'))  # silently edited
    msgs = []
    assert latest_valid(tmp_path, msgs.append) == oldest
    assert "does not match its checksum" in msgs[0] and "does not match its checksum" in msgs[1]


def test_incomplete_checkpoint_without_manifest_is_skipped(tiny_cfg, tmp_path):
    _run(tiny_cfg, tmp_path)
    newest = list_checkpoints(tmp_path)[0]
    (newest / "MANIFEST.json").unlink()
    with pytest.raises(CheckpointError, match="incomplete"):
        read_checkpoint(newest)
    assert latest_valid(tmp_path, lambda m: None) == list_checkpoints(tmp_path)[1]


def test_a_pickle_in_the_folder_is_refused(tiny_cfg, tmp_path):
    _run(tiny_cfg, tmp_path)
    newest = list_checkpoints(tmp_path)[0]
    (newest / "extra.pt").write_bytes(pickle.dumps({"x": 1}))
    with pytest.raises(CheckpointError, match="holds a pickle file 'extra.pt'"):
        read_checkpoint(newest)
    (newest / "extra.pt").unlink()
    (newest / "innocent.json").write_bytes(pickle.dumps([1]))  # pickle bytes under another name
    with pytest.raises(CheckpointError, match="pickle file 'innocent.json'"):
        read_checkpoint(newest)


def test_different_model_names_the_keys(tiny_cfg, tmp_path):
    _run(tiny_cfg, tmp_path)
    ckpt = list_checkpoints(tmp_path)[0]
    other = tiny_cfg(**{"model.kwargs": {"hidden": [32, 16]}})
    with pytest.raises(CheckpointError, match=r"different model: missing keys \['net.6.bias'"):
        fit(other, run_dir=tmp_path / "b", resume=ckpt, allow_config_change=True)
    wider = tiny_cfg(**{"model.kwargs": {"hidden": [48]}})
    with pytest.raises(CheckpointError, match=r"shape mismatch in \['net.0.weight: \(32, 64\) in file vs \(48, 64\)"):
        fit(wider, run_dir=tmp_path / "c", resume=ckpt, allow_config_change=True)


def test_changed_config_is_refused_unless_allowed(tiny_cfg, tmp_path, ecotrain_log):
    _run(tiny_cfg, tmp_path)
    ckpt = list_checkpoints(tmp_path)[0]
    changed = tiny_cfg(**{"checkpoint.every_n_steps": 10, "optim.lr": 1e-2, "loop.max_steps": 80})
    with pytest.raises(ConfigError, match=r"loop.max_steps: 60 -> 80; optim.lr: 0.003 -> 0.01"):
        fit(changed, run_dir=tmp_path, resume=ckpt)
    r = fit(changed, run_dir=tmp_path, resume=ckpt, allow_config_change=True)
    assert r.summary["steps"] == 80 and "optim.lr: 0.003 -> 0.01" in ecotrain_log.text


def test_failed_save_keeps_previous_and_stops_with_a_clear_error(tiny_cfg, tmp_path, monkeypatch):
    import ecotrain.checkpoint.format as fmt
    real = fmt.write_tensors
    calls = {"n": 0}

    def flaky(path, tensors):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, tensors)

    monkeypatch.setattr(fmt, "write_tensors", flaky)
    with pytest.raises(CheckpointError, match=r"No space left on device; the disk is full: free space or write "
                                              r"elsewhere; earlier checkpoints are intact \(newest step-00000020\)"):
        _run(tiny_cfg, tmp_path)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000020", "step-00000010"]
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".tmp")]
    read_checkpoint(list_checkpoints(tmp_path)[0])


def test_real_file_size_limit_gives_exit_3(tmp_path):
    """A real write failure from the OS (RLIMIT_FSIZE -> EFBIG) through the real CLI."""
    code = (
        "import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN);"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (40000, 40000));"
        "from ecotrain.cli import main; sys.exit(main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", code, "fit", "recipes/mnist1d_cnn.yaml", "loop.max_steps=30",
                        "model.kwargs={channels: 64}", "checkpoint.every_n_steps=10", "--run-dir", str(tmp_path), "--quiet"],
                       capture_output=True, text=True, cwd=SRC.parent, timeout=120)
    assert r.returncode == 3, r.stderr
    assert "could not write checkpoint" in r.stderr and "Traceback" not in r.stderr
    # what to do, and no promise of earlier checkpoints to a run that has none
    assert "(ulimit -f): raise the limit" in r.stderr and "there is no earlier checkpoint" in r.stderr, r.stderr
    assert not list_checkpoints(tmp_path) and not [p for p in (tmp_path / "checkpoints").iterdir()]


def test_background_save_gives_the_same_checkpoint(tiny_cfg, tmp_path):
    _run(tiny_cfg, tmp_path / "a")
    _run(tiny_cfg, tmp_path / "b", **{"checkpoint.background": True})
    ta, ma = read_checkpoint(list_checkpoints(tmp_path / "a")[0])
    tb, mb = read_checkpoint(list_checkpoints(tmp_path / "b")[0])
    assert all(torch.equal(ta[k], tb[k]) for k in ta)
    assert ma["position"] == mb["position"]


def test_init_from_checkpoint_and_plain_state_dict(tiny_cfg, tmp_path):
    r = _run(tiny_cfg, tmp_path / "a")
    ckpt = list_checkpoints(tmp_path / "a")[0]
    cfg = tiny_cfg(**{"loop.max_steps": 1, "optim.lr": 1e-9})
    b = fit(cfg, run_dir=tmp_path / "b", init_from=ckpt, keep_optimizer=True)
    assert b.state.optimizer.state_dict()["state"]  # optimizer state carried over
    assert b.state.optimizer.param_groups[0]["lr"] == pytest.approx(1e-9)  # but the new run's lr
    for p, q in zip(b.model.parameters(), r.model.parameters()):
        assert torch.allclose(p, q, atol=1e-6)
    torch.save(r.model.state_dict(), tmp_path / "plain.pt")
    c = fit(cfg, run_dir=tmp_path / "c", init_from=tmp_path / "plain.pt")
    for p, q in zip(c.model.parameters(), r.model.parameters()):
        assert torch.allclose(p, q, atol=1e-6)


class _MakesADir:
    """Unpickled, this creates the folder `marker`: the proof that the payload ran."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (str(self.marker),)


@pytest.mark.parametrize("writer", ["torch.save", "pickle.dump"])
def test_state_dict_import_refuses_code(tmp_path, writer):
    marker = tmp_path / "PWNED"
    evil = {"w": torch.zeros(2), "b": _MakesADir(marker)}
    if writer == "torch.save":  # the zip format: with weights_only=False it would load (and run the payload)
        torch.save(evil, tmp_path / "evil.pt")
    else:
        with open(tmp_path / "evil.pt", "wb") as f:
            pickle.dump(evil, f, protocol=2)
    with pytest.raises(CheckpointError) as err:
        load_state_dict_file(tmp_path / "evil.pt")
    assert not marker.exists(), "the pickle's payload ran"
    assert str(err.value) == (f"{tmp_path / 'evil.pt'}: not a plain state_dict loadable with weights_only=True "
                              "(UnpicklingError)")


def test_state_dict_import_reads_plain_weights_and_refuses_the_rest(tmp_path):
    from safetensors.torch import save_file

    w = {"net.0.weight": torch.ones(2, 2), "net.0.bias": torch.zeros(2)}
    save_file(w, str(tmp_path / "w.safetensors"))
    torch.save(w, tmp_path / "plain.pt")
    torch.save({"state_dict": w, "epoch": 3}, tmp_path / "lightning.ckpt")  # Lightning's layout: unwrapped
    for name in ("w.safetensors", "plain.pt", "lightning.ckpt"):
        got = load_state_dict_file(tmp_path / name)
        assert set(got) == set(w) and all(torch.equal(got[k], w[k]) for k in w), name
    for name, obj in (("mixed.pt", {"net.0.weight": torch.ones(2), "step": 3}), ("list.pt", [torch.ones(2)])):
        torch.save(obj, tmp_path / name)
        with pytest.raises(CheckpointError, match=rf"^{tmp_path / name}: expected a dict of tensors \(a model state_dict\)$"):
            load_state_dict_file(tmp_path / name)
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="junk.safetensors"):
        load_state_dict_file(tmp_path / "junk.safetensors")


def test_no_torch_load_without_weights_only():
    for path in (SRC / "ecotrain").rglob("*.py"):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if "torch.load(" in line:
                assert "weights_only=True" in line, f"{path}:{i}"
