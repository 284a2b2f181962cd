"""verify_checkpoint reads past the checksums: a file swapped together with its manifest entry is
still caught (its safetensors header, the tensors meta.json refers to); every read error is a
CheckpointError; --init-from accepts a run folder."""

import json

import pytest
import torch
from safetensors.torch import save_file

from ecotrain.checkpoint import latest_valid, load_state_dict_file, read_checkpoint, verify_checkpoint
from ecotrain.checkpoint.format import _digest, write_checkpoint
from ecotrain.base.errors import CheckpointError
from ecotrain.core.resume import _run_folder_weights, init_from


def _ckpt(run, step, value=1.0):
    folder = run / "checkpoints" / f"step-{step:08d}"
    tensors = {"model/weight": torch.full((2, 3), value), "model/bias": torch.zeros(2)}
    meta = {"model": {"weight": {"__tensor__": "model/weight"}, "bias": {"__tensor__": "model/bias"}},
            "optimizer": {"state": {}, "param_groups": [{"lr": 0.1, "params": [0, 1]}]},
            "position": {"step": step}}
    return write_checkpoint(folder, tensors, meta)


def _swap_tensors(folder, data: bytes):
    t = folder / "tensors.safetensors"
    t.write_bytes(data)
    m = json.loads((folder / "MANIFEST.json").read_text())
    m["files"]["tensors.safetensors"] = {"xxh3_128": _digest(t), "bytes": t.stat().st_size}
    (folder / "MANIFEST.json").write_text(json.dumps(m))


def test_random_tensors_with_a_matching_manifest_are_skipped(tmp_path):
    old, new = _ckpt(tmp_path, 2), _ckpt(tmp_path, 4)
    _swap_tensors(new, bytes(range(256)) * 2)
    with pytest.raises(CheckpointError, match="tensors.safetensors: not a readable safetensors file"):
        verify_checkpoint(new)
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        read_checkpoint(new)
    msgs = []
    assert latest_valid(tmp_path, msgs.append) == old
    assert len(msgs) == 1 and "skipping checkpoint" in msgs[0] and "step-00000004" in msgs[0]


def test_other_valid_tensors_with_a_matching_manifest_are_skipped(tmp_path):
    old, new = _ckpt(tmp_path, 2), _ckpt(tmp_path, 4)
    save_file({"something": torch.zeros(3)}, str(tmp_path / "other.safetensors"))
    _swap_tensors(new, (tmp_path / "other.safetensors").read_bytes())
    with pytest.raises(CheckpointError, match="lacks 2 tensor.*meta.json refers to"):
        verify_checkpoint(new)
    assert latest_valid(tmp_path, lambda m: None) == old


def test_a_folder_that_is_no_checkpoint_says_so(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(CheckpointError, match="not a checkpoint folder"):
        verify_checkpoint(tmp_path)


@pytest.mark.parametrize("data", [b"", bytes(range(256)), b"\x08\x00\x00\x00\x00\x00\x00\x00{}"])
def test_a_bad_safetensors_weights_file_is_a_checkpoint_error(tmp_path, data):
    p = tmp_path / "w.safetensors"
    p.write_bytes(data)
    with pytest.raises(CheckpointError, match="w.safetensors: not a readable safetensors file"):
        load_state_dict_file(p)


def test_init_from_a_run_folder_takes_its_best_weights(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    save_file({"weight": torch.zeros(2, 3)}, str(run / "model.safetensors"))
    (run / "config.yaml").write_text("name: run\n")
    newest = _ckpt(run, 4)
    assert _run_folder_weights(run, keep_optimizer=False) == run / "model.safetensors"
    assert _run_folder_weights(run, keep_optimizer=True) == newest  # the optimizer state is in checkpoints only


def test_init_from_a_run_folder_without_best_weights_takes_its_newest_valid_checkpoint(tmp_path):
    old, new = _ckpt(tmp_path, 2), _ckpt(tmp_path, 4)
    assert _run_folder_weights(tmp_path, keep_optimizer=False) == new
    _swap_tensors(new, b"")
    assert _run_folder_weights(tmp_path, keep_optimizer=False) == old


def test_init_from_a_run_folder_with_no_weights(tmp_path):
    (tmp_path / "config.yaml").write_text("name: run\n")
    model = torch.nn.Linear(3, 2)
    with pytest.raises(CheckpointError, match="no weights to start from"):
        init_from(model, None, tmp_path, keep_optimizer=False)
