"""Activation offload (core/offload.py): bit-identical gradients, activations really leave the process."""

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from ecotrain.config import Config
from ecotrain.base.errors import ConfigError
from ecotrain.config import load_config
from ecotrain.core.levers import apply_activation_checkpointing, configure_memory, find_blocks, offload_targets
from ecotrain.memory.estimate import measure_saved
from ecotrain.core.offload import Offloader, apply_offload
from ecotrain.models.charlm import CharLM
from ecotrain.core.precision import Precision


def _lm(dropout=0.1, seq=64):
    torch.manual_seed(0)
    return CharLM(vocab=32, max_len=seq, d_model=32, n_layers=3, n_heads=2, dropout=dropout)


def _grads(model, x, y):
    torch.manual_seed(123)  # the same dropout masks in both models
    model.zero_grad()
    out = model(x)
    nn.functional.cross_entropy(out.flatten(0, 1), y.flatten()).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_offloaded_step_gradients_are_bit_identical(tmp_path, dropout):
    x, y = torch.randint(0, 32, (4, 64)), torch.randint(0, 32, (4, 64))
    plain, off = _lm(dropout), _lm(dropout)
    offloader = apply_offload(find_blocks(off), tmp_path, min_bytes=1024)
    assert list(off.state_dict()) == list(plain.state_dict())  # no wrapper module
    g0, g1 = _grads(plain, x, y), _grads(off, x, y)
    assert offloader.bytes_offloaded > 0
    assert all(torch.equal(g0[n], g1[n]) for n in g0)
    assert offloader.stores[torch.device("cpu")].live == 0  # the graph is gone: every record freed
    assert list(tmp_path.iterdir()) == []  # the file was unlinked at once


def test_views_strides_and_offsets_survive(tmp_path):
    o = Offloader(tmp_path, min_bytes=0)
    base = torch.randn(8, 6, 5)
    for t in (base, base.transpose(0, 2), base[2:5, ::2], base.permute(2, 0, 1)[1]):
        back = o.unpack(o.pack(t))
        assert torch.equal(back, t) and back.stride() == t.stride() and back.storage_offset() == t.storage_offset()
    w = nn.Parameter(torch.randn(300, 300))
    with o.hooks(nn.Linear(1, 1)):
        assert o.pack(w) is w  # a leaf that requires grad is never written out
    assert o.pack(torch.ones(3)) is not None


def test_views_of_one_storage_are_written_once(tmp_path):
    o = Offloader(tmp_path, min_bytes=0)
    qkv = torch.randn(4, 3, 64)
    q, k, v = qkv.unbind(1)
    packed = [o.pack(t) for t in (q, k, v)]
    assert o.bytes_offloaded == qkv.untyped_storage().nbytes()
    assert all(torch.equal(o.unpack(p), t) for p, t in zip(packed, (q, k, v)))


def test_offload_takes_the_blocks_saved_activations_and_lossy_needs_permission(tmp_path):
    model, x = _lm(0.0, seq=256), torch.randint(0, 32, (4, 256))
    saved = measure_saved(model, _Task(), (x, x), Precision("fp32", torch.device("cpu")), find_blocks(model))["saved"]
    offloader = apply_offload(find_blocks(model), tmp_path)
    model(x).sum().backward()
    assert offloader.bytes_offloaded >= 0.9 * sum(saved.values())  # nearly all the blocks keep is written out
    lossy = Offloader(tmp_path, lossy=True, min_bytes=0)
    t = torch.randn(1000)
    back = lossy.unpack(lossy.pack(t))
    assert back.dtype == torch.float32 and torch.allclose(back, t, rtol=1e-2) and not torch.equal(back, t)
    with pytest.raises(ConfigError, match="allow_precision_change"):
        load_config(None, ["memory.activation_offload=bf16"])


class _Task:
    def forward(self, model, batch):
        return model(batch[0])

    def loss(self, out, batch):
        return out.sum()


PEAK = """
import sys, torch
from ecotrain.core.levers import find_blocks, release_freed_memory
from ecotrain.memory.measure import peak_rss
from ecotrain.core.offload import apply_offload
from ecotrain.models.charlm import CharLM
from ecotrain.core.precision import Precision
release_freed_memory()
torch.manual_seed(0)
m = CharLM(vocab=32, max_len=1024, d_model=64, n_layers=6, n_heads=2)
x = torch.randint(0, 32, (8, 1024))
if sys.argv[1] == "on":
    apply_offload(find_blocks(m), sys.argv[2])
m(x).sum().backward()
print(peak_rss())  # VmHWM: ru_maxrss would carry pytest's own peak into the child
"""


def test_cpu_offload_lowers_the_measured_peak_rss(tmp_path):
    # memory.budget's CPU figure is a fresh process's peak RSS: offload's file pages must not count in it
    peaks = {}
    for mode in ("off", "on"):
        r = subprocess.run([sys.executable, "-c", PEAK, mode, str(tmp_path)], capture_output=True, text=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120)
        assert r.returncode == 0, r.stderr
        peaks[mode] = int(r.stdout.split()[-1])
    assert peaks["off"] - peaks["on"] > 100 * 2**20  # ~6 blocks x 8 x 1024 x 64 x ~17 x 4 bytes kept


def test_configure_memory_offloads_the_blocks_not_checkpointed(tmp_path):
    cfg = Config.model_validate({"memory": {"activation_checkpointing": {"every_n": 2}, "activation_offload": "on",
                                            "offload_dir": str(tmp_path), "checkpoint_policy": "matmuls"}})
    model = _lm()
    names = configure_memory(model, cfg.memory)
    assert names == ["blocks.0", "blocks.2"]
    assert [n for n, _ in offload_targets(model, names)] == ["blocks.1"]
    assert hasattr(model.blocks[1].forward, "__offloaded__") and not hasattr(model.blocks[0].forward, "__offloaded__")
    x, y = torch.randint(0, 32, (2, 64)), torch.randint(0, 32, (2, 64))
    plain = _lm()
    g0, g1 = _grads(plain, x, y), _grads(model, x, y)
    assert all(torch.equal(g0[n], g1[n]) for n in g0)
    assert apply_activation_checkpointing(_lm(), "off") == []


def test_a_storage_written_in_place_is_stored_again(tmp_path):
    # pins the private Tensor._version the dedup relies on: views share it, an in-place op bumps it
    o = Offloader(tmp_path, min_bytes=0)
    x = torch.randn(64, 64)
    view = x[:8]
    first = o.pack(x)
    assert view._version == x._version
    assert o.pack(view).stored is first.stored  # same storage, unchanged: one record
    x.mul_(2)
    assert view._version == x._version
    again = o.pack(x)
    assert again.stored is not first.stored and torch.equal(o.unpack(again), x)


def test_a_worker_peak_does_not_inherit_its_parents():
    # Linux carries the parent's peak into a child's ru_maxrss at exec; memory.budget's workers read VmHWM
    big = bytearray(900 * 2**20)
    big[::4096] = b"\1" * len(big[::4096])  # touched: resident
    code = ("import resource; from ecotrain.memory.measure import peak_rss; "
            "print(peak_rss(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    del big
    mine, inherited = map(int, r.stdout.split())
    assert inherited >= 900 * 2**20 > mine


def test_offload_blocks_takes_the_first_k_of_the_blocks_not_checkpointed(tmp_path):
    cfg = Config.model_validate({"memory": {"activation_offload": "on", "offload_blocks": 2,
                                            "offload_dir": str(tmp_path)}})
    model = _lm()
    configure_memory(model, cfg.memory)
    wrapped = [hasattr(b.forward, "__offloaded__") for b in model.blocks]
    assert wrapped == [True, True, False]
    x, y = torch.randint(0, 32, (2, 64)), torch.randint(0, 32, (2, 64))
    g0, g1 = _grads(_lm(), x, y), _grads(model, x, y)
    assert all(torch.equal(g0[n], g1[n]) for n in g0)
    with pytest.raises(ConfigError):
        load_config(None, ["memory.offload_blocks=0"])
