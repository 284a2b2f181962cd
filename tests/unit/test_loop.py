
import pytest
import torch
from torch import nn

from ecotrain import fit
from ecotrain.config import ScheduleConfig
from ecotrain.core.optim import lr_multiplier, param_groups
from ecotrain.core.task import ClassificationTask


class _Terms:
    """Loss terms of both kinds: one per sample (a mean over the micro-batch's units) and one that
    does not depend on the batch (a weight penalty)."""

    key = "terms"

    def loss_terms(self, batch, outputs, state):
        x, _ = batch
        w = next(iter(state.model.parameters()))
        return {"out_l2": (outputs ** 2).mean(1).mean() * 0.1, "penalty": (w ** 2).sum() * 0.01,
                "input_weighted": (outputs.sum(1) * x[:, 0]).mean()}


def _grads_after(model, x, y, accumulate, terms=False):
    """Gradients of one effective batch through the loop's own backward_micro_batches."""
    from types import SimpleNamespace

    from ecotrain.core.distributed import Dist
    from ecotrain.core.loop import backward_micro_batches
    from ecotrain.methods import Method, Methods
    from ecotrain.core.objective import Objective
    from ecotrain.core.precision import Precision
    methods = Methods([type("T", (_Terms, Method), {})()] if terms else [])
    state = SimpleNamespace(model=model, precision=Precision("fp32", torch.device("cpu")), dist=Dist(),
                            objective=Objective(ClassificationTask(), methods), task=ClassificationTask())
    loss = backward_micro_batches(state, (x, y), accumulate)
    return [p.grad.clone() for p in model.parameters()], loss, state.loss_parts


@pytest.mark.parametrize("terms", [False, True])
@pytest.mark.parametrize("n, accumulate", [(32, 4), (30, 4), (7, 3)])  # uneven last micro-batch too
def test_accumulation_equals_one_big_batch(n, accumulate, terms):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3)).double()
    x, y = torch.randn(n, 5, dtype=torch.double), torch.randint(0, 3, (n,))
    big, big_loss, big_parts = _grads_after(model, x, y, 1, terms)
    model.zero_grad()
    acc, acc_loss, acc_parts = _grads_after(model, x, y, accumulate, terms)
    for a, b in zip(big, acc):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-14)
    assert torch.allclose(big_loss, acc_loss, rtol=1e-6)  # the task loss is computed in float32
    if terms:  # each logged term is the one big batch's value too
        assert set(big_parts) == {"task", "out_l2", "penalty", "input_weighted"}
        for k in big_parts:
            assert torch.allclose(big_parts[k], acc_parts[k], rtol=1e-6, atol=1e-9), k
    else:
        assert acc_parts is None


def test_accumulated_run_matches_big_batch_run(tiny_cfg, tmp_path):
    """Whole runs: batch 32 x accumulate 2 == batch 64, same weights (float tolerance)."""
    a = fit(tiny_cfg(**{"data.batch_size": 64, "loop.max_steps": 15}), run_dir=tmp_path / "a")
    b = fit(tiny_cfg(**{"data.batch_size": 32, "loop.accumulate": 2, "loop.max_steps": 15}), run_dir=tmp_path / "b")
    for (k, p), (_, q) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert torch.allclose(p, q, atol=1e-5), k


@pytest.mark.parametrize("name", ["constant", "cosine", "onecycle", "step"])
def test_schedules_warm_up_linearly_then_follow_shape(name):
    cfg = ScheduleConfig(name=name, warmup=10, step_size=20, gamma=0.5, min_lr_ratio=0.1)
    f = lr_multiplier(cfg, 100)
    warm = [f(t) for t in range(10)]
    assert all(b > a for a, b in zip(warm, warm[1:])) and warm[0] == pytest.approx(1 / 11)
    if name == "constant":
        assert f(50) == 1.0
    if name == "cosine":
        assert f(10) == pytest.approx(1.0) and f(99) == pytest.approx(0.1, abs=1e-2) and f(55) == pytest.approx(0.55, abs=1e-2)
    if name == "step":
        assert f(29) == 1.0 and f(30) == 0.5 and f(50) == 0.25
    if name == "onecycle":
        peak = max(range(100), key=f)
        assert 25 <= peak <= 35 and f(99) < 0.2


def test_weight_decay_skips_biases_and_norms():
    m = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    groups = param_groups(m, 0.1)
    assert [p.ndim for p in groups[0]["params"]] == [2] and groups[1]["weight_decay"] == 0
    assert len(groups[1]["params"]) == 3


def test_early_stopping_stops_and_restores_best(tiny_cfg, tmp_path):
    # lr huge: val loss gets worse quickly -> stop after patience evals
    cfg = tiny_cfg(**{"optim.lr": 0.5, "loop.max_steps": 2000, "loop.eval_every": 5,
                      "early_stopping.enabled": True, "early_stopping.patience": 3})
    r = fit(cfg, run_dir=tmp_path)
    s = r.summary
    assert s["stopped_because"] == "early_stopping" and s["steps"] < 2000
    assert s["steps"] - s["best_step"] == 15  # 3 evals x 5 steps after the best
    assert s["val_loss"] == pytest.approx(s["best_val_metric"], rel=1e-6)  # best weights restored


class _Poison(nn.Module):
    """Returns NaN logits from step `at` on (counted in training forward passes)."""
    def __init__(self, at):
        super().__init__()
        self.lin, self.at, self.n = nn.Linear(64, 10), at, 0

    def forward(self, x):
        out = self.lin(x.flatten(1))
        if self.training:
            self.n += 1
            if self.n >= self.at:
                out = out * float("nan")
        return out


def test_divergence_guard_stops_without_applying_nan(tiny_cfg, tmp_path):
    model = _Poison(at=5)
    r = fit(tiny_cfg(), model=model, run_dir=tmp_path)
    assert r.summary["stopped_because"] == "diverged" and r.summary["steps"] == 5
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_divergence_guard_skip_mode(tiny_cfg, tmp_path):
    model = _Poison(at=50)
    r = fit(tiny_cfg(**{"divergence.action": "skip", "divergence.max_skips": 3}), model=model, run_dir=tmp_path)
    assert r.summary["stopped_because"] == "diverged" and r.summary["skipped_nonfinite_steps"] == 3
    assert r.summary["steps"] == 53 and all(torch.isfinite(p).all() for p in model.parameters())


def test_grad_clip_bounds_update(tiny_cfg, tmp_path):
    r = fit(tiny_cfg(**{"loop.grad_clip": 1e-6, "optim.name": "sgd", "optim.lr": 1.0, "optim.momentum": 0.0,
                        "loop.max_steps": 1}), run_dir=tmp_path)
    torch.manual_seed(0)  # same init as fit's
    from ecotrain.models import build_model
    from ecotrain.config import ModelConfig
    fresh = build_model(ModelConfig(name="mlp", kwargs={"hidden": [32]}), (64,), 10)
    moved = sum((p - q).pow(2).sum() for p, q in zip(fresh.parameters(), r.model.parameters())).sqrt()
    assert float(moved) <= 1e-6 * 1.01
