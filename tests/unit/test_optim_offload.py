"""Optimizer-state offload (core/optim_offload.py): the state leaves memory between steps and the
weights after N steps are bit-identical to a run without it; state dicts see the real tensors."""

import copy

import torch

from ecotrain.core.optim_offload import OptimizerOffload, _Out
from ecotrain.models.charlm import CharLM


def _train(model, opt, steps=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randint(0, 64, (2, 32), generator=g)
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.roll(-1, 1).reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def _pair():
    torch.manual_seed(0)
    a = CharLM(vocab=64, max_len=32, d_model=128, n_layers=2, n_heads=2)  # 64 KiB+ tensors
    return a, copy.deepcopy(a)


def test_weights_bit_identical_after_steps(tmp_path):
    a, b = _pair()
    oa = torch.optim.AdamW(a.parameters(), lr=1e-2, weight_decay=0.1)
    ob = torch.optim.AdamW(b.parameters(), lr=1e-2, weight_decay=0.1)
    off = OptimizerOffload(ob, tmp_path, torch.device("cpu"))
    _train(a, oa)
    _train(b, ob)
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), n
    # between steps the big moments are out of memory: only placeholders are held
    held = [v for st in ob.state.values() for v in st.values()]
    assert any(isinstance(v, _Out) for v in held)
    assert all(not isinstance(v, torch.Tensor) or v.numel() * v.element_size() < 64 << 10 for v in held)
    off.detach()
    assert all(isinstance(v, torch.Tensor) for st in ob.state.values() for v in st.values())


def test_state_dict_and_load_round_trip(tmp_path):
    a, b = _pair()
    oa = torch.optim.AdamW(a.parameters(), lr=1e-2)
    ob = torch.optim.AdamW(b.parameters(), lr=1e-2)
    OptimizerOffload(ob, tmp_path, torch.device("cpu"))
    _train(a, oa, 3)
    _train(b, ob, 3)
    sa, sb = oa.state_dict(), ob.state_dict()
    _train(b, ob, 2, seed=5)  # later steps do not change the state dict already handed out
    for k in sa["state"]:
        for name, v in sa["state"][k].items():
            if v.numel() * v.element_size() < 64 << 10:  # kept in memory, updated in place (as without offload)
                continue
            assert torch.equal(v, sb["state"][k][name]), (k, name)
    # resume: a fresh offloaded optimizer loads the saved state and continues exactly
    c = copy.deepcopy(a)
    oc = torch.optim.AdamW(c.parameters(), lr=1e-2)
    OptimizerOffload(oc, tmp_path / "c", torch.device("cpu"))
    oc.load_state_dict(copy.deepcopy(sa))
    _train(a, oa, 2, seed=5)
    _train(c, oc, 2, seed=5)
    for p, q in zip(a.parameters(), c.parameters()):
        assert torch.equal(p, q)
