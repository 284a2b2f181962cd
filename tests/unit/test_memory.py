"""Activation checkpointing (exact gradients, fewer saved tensors) and OOM recovery (same maths)."""

import pytest
import torch
from torch import nn

from ecotrain import fit
from ecotrain.config import EveryN, NamedModules
from ecotrain.base.errors import ConfigError
from ecotrain.core.levers import OutOfMemory, apply_activation_checkpointing, find_blocks, select_modules
from ecotrain.models.charlm import CharLM


def _lm(dropout=0.1):
    torch.manual_seed(0)
    return CharLM(vocab=32, max_len=16, d_model=16, n_layers=4, n_heads=2, dropout=dropout).double()


def _grads(model, x, y):
    torch.manual_seed(123)  # the same dropout masks in both models
    model.zero_grad()
    out = model(x)
    nn.functional.cross_entropy(out.flatten(0, 1), y.flatten()).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("spec", ["all", EveryN(every_n=2), NamedModules(modules=["Block"]),
                                  NamedModules(modules=["blocks.1", "blocks.3"]), NamedModules(modules=["blocks.*.mlp"])])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_checkpointed_gradients_equal_plain(spec, dropout):
    x, y = torch.randint(0, 32, (3, 16)), torch.randint(0, 32, (3, 16))
    plain, ckpt = _lm(dropout), _lm(dropout)
    names = apply_activation_checkpointing(ckpt, spec)
    assert names
    assert list(ckpt.state_dict()) == list(plain.state_dict())  # no wrapper module, same keys
    assert all(type(m).__name__ in ("Block", "Sequential") for n, m in ckpt.named_modules() if n in names)
    g0, g1 = _grads(plain, x, y), _grads(ckpt, x, y)
    for n in g0:
        assert torch.allclose(g0[n], g1[n], rtol=1e-10, atol=1e-12), n


def test_selection():
    m = _lm()
    assert [n for n, _ in find_blocks(m)] == ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]
    assert [n for n, _ in select_modules(m, EveryN(every_n=3))] == ["blocks.0", "blocks.3"]
    assert select_modules(m, "off") == []
    # a module inside an already-chosen one is not checkpointed twice
    assert [n for n, _ in select_modules(m, NamedModules(modules=["Block", "blocks.0.mlp"]))][:1] == ["blocks.0"]
    with pytest.raises(ConfigError, match="match no module"):
        select_modules(m, NamedModules(modules=["Nope"]))
    with pytest.raises(ConfigError, match="no repeated blocks"):
        select_modules(nn.Linear(2, 2), "all")


def test_checkpointing_saves_fewer_tensors():
    saved = {}
    x = torch.randint(0, 32, (2, 16))
    for name, spec in (("plain", "off"), ("ckpt", "all")):
        m = _lm(dropout=0.0)
        apply_activation_checkpointing(m, spec)
        total = [0]

        def pack(t):
            total[0] += t.nelement() * t.element_size()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            m(x).sum()
        saved[name] = total[0]
    assert saved["ckpt"] < saved["plain"] / 2


def test_attention_is_kept_not_recomputed():
    from torch.utils._python_dispatch import TorchDispatchMode

    from ecotrain.core.levers import ATTENTION_OPS

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += func in ATTENTION_OPS
            return func(*args, **(kwargs or {}))
    m = _lm(dropout=0.0).float()
    apply_activation_checkpointing(m, "all")
    with Count():
        m(torch.randint(0, 32, (2, 16))).sum().backward()
    assert Count.n == 4  # one forward per block; the recomputation reused the kept outputs


def test_eval_mode_runs_without_checkpoint():
    m = _lm(dropout=0.0)
    apply_activation_checkpointing(m, "all")
    x = torch.randint(0, 32, (2, 16))
    with torch.inference_mode():
        assert m(x).shape == (2, 16, 32)


class OOMAbove(nn.Module):
    """An MLP that raises torch.OutOfMemoryError (as CUDA would) on training batches larger than
    `limit`, or on the training call numbered `fail_call` (1-based)."""

    def __init__(self, limit=10**9, fail_call=None):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
        self.limit, self.fail_call, self.calls, self.raised = limit, fail_call, 0, 0

    def forward(self, x):
        if self.training and torch.is_grad_enabled():
            self.calls += 1
            if len(x) > self.limit or self.calls == self.fail_call:
                self.raised += 1
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        return self.net(x)


def _same_weights(a, b):
    for (k, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.allclose(p, q, atol=1e-5), k


def test_oom_recovery_halves_micro_batch_and_keeps_the_maths(tiny_cfg, tmp_path, ecotrain_log):
    cfg = tiny_cfg(**{"loop.max_steps": 12})
    ref = fit(cfg, model=OOMAbove(), run_dir=tmp_path / "ref")
    oom_model = OOMAbove(limit=8)
    r = fit(cfg, model=oom_model, run_dir=tmp_path / "oom")
    assert r.summary["micro_batches"] == 4 and r.summary["oom_recoveries"] == 2  # 32 -> 16 -> 8
    assert oom_model.raised == 2 and r.summary["steps"] == 12
    assert "out of memory at step 1; micro-batch 32 -> 16" in ecotrain_log.text
    _same_weights(ref.model, r.model)


def test_oom_mid_accumulation_drops_partial_gradients(tiny_cfg, tmp_path):
    """The OOM hits the 2nd micro-batch, after the 1st one's backward: the retry must not add to it."""
    cfg = tiny_cfg(**{"loop.max_steps": 6, "loop.accumulate": 2})
    ref = fit(cfg, model=OOMAbove(), run_dir=tmp_path / "ref")
    r = fit(cfg, model=OOMAbove(fail_call=2), run_dir=tmp_path / "oom")
    assert r.summary["micro_batches"] == 4
    _same_weights(ref.model, r.model)


def test_oom_gives_up_below_min_micro_batch(tiny_cfg, tmp_path):
    cfg = tiny_cfg(**{"loop.max_steps": 3, "memory.min_micro_batch": 8})
    with pytest.raises(OutOfMemory, match="micro-batch 8 .* memory.min_micro_batch=8"):
        fit(cfg, model=OOMAbove(limit=4), run_dir=tmp_path)


def test_oom_cli_message(cli, tmp_path):
    recipe = tmp_path / "oom.yaml"
    recipe.write_text("data: {name: digits}\nmodel: {name: 'tests.unit.test_memory:OOMAbove', kwargs: {limit: 0}}\n"
                      "loop: {max_epochs: 1}\n")
    r = cli("fit", recipe, "--run-dir", tmp_path / "run", "--quiet", env={"PYTHONPATH": "."})
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1].startswith("ecotrain: error: out of memory at step 1")


def test_micro_batch_count_survives_resume(tiny_cfg, tmp_path):
    first = fit(tiny_cfg(**{"loop.max_steps": 6}), model=OOMAbove(limit=8), run_dir=tmp_path / "a")
    ckpt = first.summary["last_checkpoint"]
    resumed = fit(tiny_cfg(**{"loop.max_steps": 12}), model=OOMAbove(limit=8), run_dir=tmp_path / "a",
                  resume=ckpt, allow_config_change=True)
    assert resumed.summary["micro_batches"] == 4 and resumed.summary["oom_recoveries"] == 2  # no new OOM
    _same_weights(fit(tiny_cfg(**{"loop.max_steps": 12}), model=OOMAbove(), run_dir=tmp_path / "b").model, resumed.model)


def test_configure_memory_applies_the_section():
    from ecotrain.config import MemoryConfig
    from ecotrain.core.levers import configure_memory

    m = _lm()
    names = configure_memory(m, MemoryConfig(activation_checkpointing=EveryN(every_n=2), release_freed=True))
    assert names == ["blocks.0", "blocks.2"]
    assert hasattr(m.blocks[0].forward, "__wrapped__") and not hasattr(m.blocks[1].forward, "__wrapped__")
    assert configure_memory(_lm(), MemoryConfig()) == []


def test_config_spellings():
    from ecotrain.config import load_config

    def spec(v):
        return load_config(None, [f"memory.activation_checkpointing={v}"]).memory.activation_checkpointing
    assert spec("off") == "off" and spec("all") == "all"  # YAML reads a bare off as false
    assert spec("{every_n: 2}") == EveryN(every_n=2) and spec("{modules: [Block]}") == NamedModules(modules=["Block"])
    with pytest.raises(ConfigError, match="memory.activation_checkpointing"):
        spec("sometimes")
