"""Mixed precision: fp16 loss scaling skips and counts inf steps, unscales before clipping, and
its scaler state round-trips; bf16 and fp16 runs work end to end on CPU."""

import math

import pytest
import torch
from torch import nn

from ecotrain import Callback, fit
from ecotrain.base.errors import ConfigError
from ecotrain.core.precision import Precision

CPU = torch.device("cpu")


def _setup():
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    return model, opt


def _backward(prec, model, x=None):
    x = torch.randn(8, 4) if x is None else x
    with prec.autocast():
        loss = model(x).float().pow(2).mean()
    prec.backward(loss)
    return loss


def test_fp16_skips_step_with_inf_gradients_and_counts_it():
    model, opt = _setup()
    prec = Precision("fp16-mixed", CPU)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    scale = prec.scaler.get_scale()
    _backward(prec, model)
    model.weight.grad[0, 0] = float("inf")
    prec.step(opt)
    assert prec.skipped_steps == 1 and prec.scaler.get_scale() == scale / 2
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k  # the poisoned step changed nothing
    opt.zero_grad()
    _backward(prec, model)
    prec.step(opt)
    assert prec.skipped_steps == 1
    assert not torch.equal(model.weight, before["weight"])


def test_fp16_unscales_before_clipping():
    model, opt = _setup()
    x = torch.randn(8, 4)
    prec = Precision("fp16-mixed", CPU)
    _backward(prec, model, x)
    assert model.weight.grad.abs().max() > 100  # scaled by 65536
    prec.unscale(opt)
    scaled = model.weight.grad.clone()
    model.zero_grad()
    _backward(Precision("fp32", CPU), model, x)
    assert torch.allclose(scaled, model.weight.grad, rtol=1e-2, atol=1e-3)  # fp16 forward: loose


def test_scaler_state_round_trips():
    model, opt = _setup()
    prec = Precision("fp16-mixed", CPU)
    _backward(prec, model)
    model.weight.grad[0, 0] = float("nan")
    prec.step(opt)
    sd = prec.state_dict()
    fresh = Precision("fp16-mixed", CPU)
    fresh.load_state_dict(sd)
    assert fresh.scaler.get_scale() == prec.scaler.get_scale() == 32768.0 and fresh.skipped_steps == 1
    assert Precision("fp32", CPU).state_dict() == {"scaler": None, "skipped_steps": 0}


def test_unsupported_autocast_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.amp, "is_autocast_available", lambda device_type: False)
    with pytest.raises(ConfigError, match="fp16-mixed is not supported on cpu.*use precision=bf16-mixed"):
        Precision("fp16-mixed", CPU)


class _HugeInitialScale(Callback):
    """Starts the grad scaler at 2**40, so fp16 gradients overflow and the first steps are skipped
    until the scale has come down; counts the scale drops it sees, independently of Precision."""

    def __init__(self):
        self.drops, self.last = 0, None

    def on_fit_start(self, state):
        if state.precision.scaler:
            state.precision.scaler._init_scale = 2.0 ** 40  # read lazily, at the first scale()

    def on_step_end(self, state):
        if state.precision.scaler:
            scale = state.precision.scaler.get_scale()
            self.drops += int(self.last is not None and scale < self.last)
            self.last = scale


@pytest.mark.parametrize("mode", ["bf16-mixed", "fp16-mixed"])
def test_mixed_precision_run_end_to_end(tiny_cfg, tmp_path, mode):
    seen = _HugeInitialScale()
    r = fit(tiny_cfg(**{"precision": mode, "loop.grad_clip": 1.0}), run_dir=tmp_path, callbacks=[seen])
    s = r.summary
    assert s["steps"] == 60 and math.isfinite(s["val_loss"]) and s["val_accuracy"] > 0.5
    assert all(p.dtype == torch.float32 for p in r.model.parameters())  # master weights stay fp32
    if mode == "fp16-mixed":  # 2**40 -> a scale fp16 gradients fit in: many skipped steps, each counted
        assert s["fp16_skipped_steps"] >= 10 and s["fp16_skipped_steps"] == seen.drops + 1  # + the first step's
    else:
        assert "fp16_skipped_steps" not in s


def test_fp16_step_counts_skips_on_the_device_without_a_host_sync(monkeypatch):
    """get_scale() is a .item() (a host sync on CUDA); the step reads the scaler's scale tensor
    (`_get_scale_async`, private: pinned here) and keeps the count as a tensor until asked."""
    model, opt = _setup()
    prec = Precision("fp16-mixed", CPU)
    _backward(prec, model)
    assert isinstance(prec.scaler._get_scale_async(), torch.Tensor)
    assert prec.scaler._get_scale_async().item() == prec.scaler.get_scale()

    def no_sync():
        raise AssertionError("get_scale() called inside the step")

    monkeypatch.setattr(prec.scaler, "get_scale", no_sync)
    model.weight.grad[0, 0] = float("nan")
    prec.step(opt)
    assert isinstance(prec._skipped, torch.Tensor) and prec.skipped_steps == 1
