"""checkpoint/ by behaviour: a flipped bit in any file (the tensors, a shard) is refused; the position
comes back exactly; every RNG stream (Python, NumPy, torch, CUDA, augmentation, each rank's own) draws
after restore what it drew after capture; each rank gets its own loader state; a background sharded
save; a save interrupted by Ctrl-C leaves nothing behind; what a failed write says is left; plain
weights are loaded with weights_only whatever the environment says."""

import random

import numpy as np
import pytest
import torch
from safetensors import SafetensorError

from ecotrain.callbacks.base import CallbackList
from ecotrain.checkpoint import CheckpointManager, latest_valid, load_state_dict_file, read_checkpoint
from ecotrain.checkpoint import format as fmt
from ecotrain.checkpoint.snapshot import capture, environment, restore, rng_state, set_rng_state
from ecotrain.base.errors import CheckpointError
from tests.unit.test_checkpoint_state import Ranked, _augment, _filled, _roundtrip, _state

pytestmark = [pytest.mark.unit, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]


def _flip(path, at=-1):
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_flipped_bit_in_the_tensors_is_refused(tiny_cfg, tmp_path):
    st = _filled(tiny_cfg)
    folder, _, _ = _roundtrip(tmp_path, st, CallbackList([]), _augment())
    _flip(folder / "tensors.safetensors")  # the last byte: tensor data, not the header
    with pytest.raises(CheckpointError):
        read_checkpoint(folder)
    assert latest_valid(tmp_path, warn=lambda m: None) is None


def test_a_flipped_bit_in_a_shard_is_refused(tiny_cfg, tmp_path):
    st = _filled(tiny_cfg, dist=Ranked(0, 1, strategy="fsdp"))
    tensors, meta, big = capture(st, CallbackList([]), _augment(), 0, "h")
    folder = CheckpointManager(tmp_path).save(12, tensors, meta, shards=big, dist=st.dist)
    read_checkpoint(folder)  # intact: verifies
    shards = sorted((folder / "shards").rglob("*.safetensors"))
    assert shards
    _flip(shards[0])
    with pytest.raises(CheckpointError):
        read_checkpoint(folder)


@pytest.mark.parametrize("pos", [(0, 0, 0, 0), (1, 0, 1, 32), (12345, 7, 3, 99991)])
def test_the_position_comes_back_exactly(tiny_cfg, tmp_path, pos):
    st = _filled(tiny_cfg)
    st.step, st.epoch, st.batch_in_epoch, st.samples_seen = pos
    folder, tensors, meta = _roundtrip(tmp_path, st, CallbackList([]), _augment())
    fresh = _state(tiny_cfg, seed=1)
    fresh.step, fresh.epoch, fresh.batch_in_epoch, fresh.samples_seen = 5, 5, 5, 5
    restore(fresh, CallbackList([]), _augment(), tensors, meta, folder)
    assert (fresh.step, fresh.epoch, fresh.batch_in_epoch, fresh.samples_seen) == pos


def _draws(augment):
    return (random.random(), random.gauss(0, 1), np.random.standard_normal(3).tolist(), np.random.randint(0, 10**9),
            torch.rand(3).tolist(), torch.rand(2, generator=augment.gen).tolist())


def test_every_rng_stream_draws_after_restore_what_it_drew_after_capture(tiny_cfg, tmp_path):
    random.seed(11)
    np.random.seed(12)
    np.random.standard_normal(1)  # NumPy holds a second Gaussian back: its state must come back too
    random.gauss(0, 1)  # as does Python's
    torch.manual_seed(13)
    st, aug = _filled(tiny_cfg), _augment()
    aug.gen.manual_seed(14)
    tensors, meta, _ = capture(st, CallbackList([]), aug, 0, "h")
    expected = _draws(aug)
    folder = CheckpointManager(tmp_path).save(st.step, tensors, meta)
    tensors, meta = read_checkpoint(folder)

    random.seed(0), np.random.seed(0), torch.manual_seed(0)  # somewhere else entirely
    fresh, aug2 = _state(tiny_cfg, seed=2), _augment(99)
    restore(fresh, CallbackList([]), aug2, tensors, meta, folder)
    assert _draws(aug2) == expected


def test_the_cuda_streams_are_saved_and_set_where_cuda_is(monkeypatch):
    states, set_to = [torch.arange(4, dtype=torch.uint8)], []
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: states)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", set_to.append)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    s = rng_state()
    assert s["cuda"] == []
    set_rng_state({**s, "cuda": states})  # saved on a GPU machine, resumed on one without: nothing to set
    assert set_to == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    s = rng_state()
    assert s["cuda"] is states
    set_rng_state(s)
    assert set_to == [states]
    set_rng_state({**s, "cuda": []})  # saved without CUDA: the GPU's streams are left as they are
    assert set_to == [states]


def test_the_environment_of_a_cuda_run_names_the_gpu_and_its_libraries(tiny_cfg, monkeypatch):
    st = _state(tiny_cfg)
    st.device = torch.device("cuda", 0)
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d: asked.append(d) or "Some GPU")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91000)
    env = environment(st)
    assert env["device"] == "cuda" and (env["gpu"], env["cuda"], env["cudnn"]) == ("Some GPU", "12.8", 91000)
    assert asked == [st.device]
    assert "gpu" not in environment(_state(tiny_cfg))


def _rank_record(data, window=3.0):
    gen = torch.Generator().manual_seed(int(window))
    return {"rng": rng_state(), "augment": {"gen": gen.get_state()}, "window": torch.tensor([window]),
            "window_parts": {}, "data": data}


def test_each_rank_restores_its_own_loader_state(tiny_cfg, tmp_path):
    st = _filled(tiny_cfg, dist=Ranked(1, 2, others=[_rank_record({"pos": 100})]))
    folder, tensors, meta = _roundtrip(tmp_path, st, CallbackList([]), _augment())
    assert [r["data"] for r in meta["ranks"]] == [{"pos": 100}, {"pos": 5}]
    for rank, pos in ((0, 100), (1, 5), (2, 100)):  # a rank the checkpoint lacks: rank 0's
        fresh = _state(tiny_cfg, seed=1, dist=Ranked(rank, 3))
        restore(fresh, CallbackList([]), _augment(), tensors, dict(meta), folder)
        assert fresh.data_source.pos == pos, rank


def test_a_loaders_own_position_resumes_only_at_the_world_size_that_saved_it(tiny_cfg, tmp_path):
    class Stream:  # a stream split per rank: its position cannot be resharded
        def __init__(self, at=0):
            self.at = at

        def state_dict(self):
            return {"loader": {"at": self.at}}

        def load_state_dict(self, sd):
            self.at = sd["loader"]["at"]

    st = _filled(tiny_cfg, dist=Ranked(0, 2, others=[_rank_record({"loader": {"at": 70}})]))
    st.data_source = Stream(30)
    folder, tensors, meta = _roundtrip(tmp_path, st, CallbackList([]), _augment())
    for rank, at in ((0, 30), (1, 70)):
        fresh = _state(tiny_cfg, seed=1, dist=Ranked(rank, 2))
        fresh.data_source = Stream()
        restore(fresh, CallbackList([]), _augment(), tensors, dict(meta), folder)
        assert fresh.data_source.at == at
    for world in (1, 3):
        fresh = _state(tiny_cfg, seed=1, dist=Ranked(0, world))
        fresh.data_source = Stream()
        with pytest.raises(CheckpointError):
            restore(fresh, CallbackList([]), _augment(), tensors, dict(meta), folder)

    # a stateless position (the sampler's, a function of seed and epoch) reshards freely
    st = _filled(tiny_cfg, dist=Ranked(0, 2, others=[_rank_record({"pos": 70})]))
    folder, tensors, meta = _roundtrip(tmp_path / "b", st, CallbackList([]), _augment())
    fresh = _state(tiny_cfg, seed=1, dist=Ranked(0, 1))
    restore(fresh, CallbackList([]), _augment(), tensors, dict(meta), folder)
    assert fresh.data_source.pos == 5


def test_the_log_windows_come_back_on_the_runs_device(tiny_cfg, tmp_path):
    st = _filled(tiny_cfg)
    folder, tensors, meta = _roundtrip(tmp_path, st, CallbackList([]), _augment())
    fresh = _state(tiny_cfg, seed=1)
    fresh.device = torch.device("meta")  # any device but the CPU the file was read to
    restore(fresh, CallbackList([]), _augment(), tensors, meta, folder)
    assert [t.device.type for t in fresh.window_losses] == ["meta", "meta"]
    assert [t.device.type for t in fresh.window_parts["task"]] == ["meta", "meta"]


def test_a_raised_micro_batch_count_rides_in_the_counters(tiny_cfg):
    st = _filled(tiny_cfg)
    st.plan.raise_micro_batches(st.plan.accumulate * 4)
    _, meta, _ = capture(st, CallbackList([]), _augment(), 0, "h")
    assert meta["counters"]["micro_batches"] == st.plan.accumulate * 4


def test_a_background_sharded_save_is_the_same_checkpoint(tiny_cfg, tmp_path):
    st = _filled(tiny_cfg, dist=Ranked(0, 1, strategy="fsdp"))
    tensors, meta, big = capture(st, CallbackList([]), _augment(), 0, "h")
    sync = CheckpointManager(tmp_path / "sync").save(12, tensors, dict(meta), shards=big, dist=st.dist)
    m = CheckpointManager(tmp_path / "bg", keep_last=1, background=True)
    first = m.save(12, tensors, dict(meta), is_best=True, shards=big, dist=st.dist)
    m.wait()
    m.save(13, tensors, dict(meta), shards=big, dist=st.dist)
    m.wait()
    assert m.best == first and first.is_dir() and (tmp_path / "bg" / "checkpoints" / "step-00000013").is_dir()
    (a_tensors, a_meta), (b_tensors, b_meta) = read_checkpoint(sync), read_checkpoint(first)
    assert a_meta == b_meta and a_tensors.keys() == b_tensors.keys()
    fresh = _state(tiny_cfg, seed=1, dist=Ranked(0, 1, strategy="fsdp"))
    restore(fresh, CallbackList([]), _augment(), b_tensors, b_meta, first)
    for k, v in st.model.state_dict().items():
        assert torch.equal(fresh.model.state_dict()[k], v), k
    assert not list((tmp_path / "bg" / "checkpoints").glob(".tmp-*"))


def test_a_background_sharded_save_that_fails_is_raised_at_the_next_wait(tiny_cfg, tmp_path, monkeypatch):
    st = _filled(tiny_cfg, dist=Ranked(0, 1, strategy="fsdp"))
    tensors, meta, big = capture(st, CallbackList([]), _augment(), 0, "h")
    m = CheckpointManager(tmp_path, background=True)

    def refuse(*a, **k):
        raise CheckpointError("disk full")

    monkeypatch.setattr("ecotrain.checkpoint.sharded.write_checkpoint", refuse)
    m.save(12, tensors, meta, is_best=True, shards=big, dist=st.dist)
    with pytest.raises(CheckpointError):
        m.wait()
    assert m.best is None
    m.wait()  # reported once


def test_ctrl_c_mid_save_leaves_no_folder_behind(tmp_path, monkeypatch):
    def interrupted(path, data):
        raise KeyboardInterrupt

    monkeypatch.setattr(fmt, "_write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fmt.write_checkpoint(tmp_path / "step-00000001", {"a": torch.ones(2)}, {"position": {"step": 1}})
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_names_the_newest_earlier_checkpoint_as_what_is_left(tmp_path):
    for name in ("step-00000001", "step-00000004", "step-00000002", "step-00000009"):
        (tmp_path / name).mkdir()
    (tmp_path / "step-00000003").write_text("a file, not a checkpoint")
    folder = tmp_path / "step-00000005"
    said = fmt._write_failed(folder, OSError(28, "No space left on device"))
    assert "step-00000004" in said and "step-00000009" not in said and "step-00000002)" not in said
    folder.mkdir()  # re-saving a step: the folder being replaced is not what is left
    (tmp_path / "step-00000004").rmdir()
    assert "step-00000002" in fmt._write_failed(folder, OSError(28, "No space left on device"))
    lone = tmp_path / "x" / "step-00000001"
    assert "no earlier checkpoint" in fmt._write_failed(lone, OSError(28, "No space left on device"))


def test_a_safetensors_error_without_an_os_error_code_still_says_what_failed(tmp_path):
    said = fmt._write_failed(tmp_path / "step-00000001", SafetensorError("header too large"))
    assert "header too large" in said
    said = fmt._write_failed(tmp_path / "step-00000001", SafetensorError("I/O error: No space left (os error 28)"))
    assert said.startswith(f"could not write checkpoint {tmp_path / 'step-00000001'}: No space left (os error 28)")


def test_plain_weights_load_with_weights_only_whatever_the_environment_says(tmp_path, monkeypatch):
    class Code:  # code that builds a tensor: a plain unpickler runs it and gets a valid-looking state_dict
        def __reduce__(self):
            return (torch.ones, (2,))

    path = tmp_path / "w.pt"
    torch.save({"w": Code()}, path)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # torch's default would unpickle anything
    with pytest.raises(CheckpointError):
        load_state_dict_file(path)
    good = tmp_path / "good.pt"
    torch.save({"w": torch.ones(2)}, good)
    assert torch.equal(load_state_dict_file(good)["w"], torch.ones(2))
