"""`ecotrain plan`: exact parameter/gradient/optimizer bytes, measured and extrapolated activations."""

import pytest
import torch

from ecotrain.config import load_config
from ecotrain.data import load_data
from ecotrain.models import build_model
from ecotrain.memory.estimate import _activations, make_plan, measure_saved
from ecotrain.core.precision import Precision
from ecotrain.core.task import LanguageModelTask

TEXT = ["data.name=text", "data.kwargs={seq_len: 64, max_bytes: 20000}", "data.batch_size=6", "model.name=charlm",
        "model.kwargs={d_model: 32, n_layers: 3, n_heads: 2}"]


def test_plan_counts_state_exactly_and_checkpointing_cuts_activations():
    cfg = load_config(None, TEXT)
    plan, blocks = make_plan(cfg)
    n = plan.params
    assert plan.param_bytes == plan.grad_bytes == 4 * n and plan.optim_bytes == 8 * n  # AdamW: two moments
    assert blocks == ["blocks.0", "blocks.1", "blocks.2"] and plan.n_checkpointed == 0
    assert plan.act_bytes == plan.act_bytes_off > 1.5 * plan.act_bytes_all > 0  # logits stay: vocab 256 >> d 32
    ck, _ = make_plan(load_config(None, [*TEXT, "memory.activation_checkpointing=all"]))
    assert ck.act_bytes == pytest.approx(plan.act_bytes_all) and ck.n_checkpointed == 3
    sgd, _ = make_plan(load_config(None, [*TEXT, "optim.name=sgd", "optim.momentum=0"]))
    assert sgd.optim_bytes == 0


def test_linear_extrapolation_matches_a_measured_batch():
    cfg = load_config(None, TEXT)
    bundle = load_data(cfg)
    model = build_model(cfg.model, bundle.input_shape, bundle.num_classes)
    prec, task = Precision("fp32", torch.device("cpu")), LanguageModelTask()
    measured = _activations(measure_saved(model, task, bundle.train.take(torch.arange(6)), prec, []), set())
    plan, _ = make_plan(cfg)
    assert plan.act_bytes == pytest.approx(measured, rel=0.05)


def test_plan_cli(cli):
    r = cli("plan", "recipes/charlm_long.yaml", "data.kwargs.max_bytes=100000", "model.kwargs.n_layers=2")
    assert r.returncode == 0, r.stderr
    for word in ("parameters", "gradients", "optimizer state", "activations", "measured", "levers"):
        assert word in r.stdout


def test_estimates_order_the_levers_and_the_eval_batch_follows_the_plan():
    from ecotrain.core.offload import MIN_BYTES
    from ecotrain.core.stepplan import StepPlan

    cfg = load_config(None, TEXT)
    bundle = load_data(cfg)
    model = build_model(cfg.model, bundle.input_shape, bundle.num_classes)
    blocks = [(f"blocks.{i}", b) for i, b in enumerate(model.blocks)]
    x, y = bundle.train.take(torch.arange(6))
    m = measure_saved(model, LanguageModelTask(), (x, y), Precision("fp32", torch.device("cpu")), blocks)
    every = {n for n, _ in blocks}
    off, whole, sel = _activations(m, set()), _activations(m, every), _activations(m, every, "matmuls")
    assert whole < sel < off  # selective recompute keeps the matmul outputs: between none and whole blocks
    assert all(m["attention"][n] < m["matmul"][n] < m["saved"][n] for n in every)
    offloaded = _activations(m, set(), offloaded=every)
    big = sum(v for v in m["offloadable"].values())
    assert big > 0 and all(v == 0 or v >= MIN_BYTES for v in m["offloadable"].values())
    assert offloaded == pytest.approx(off - big + max(m["offloadable"].values()))
    assert StepPlan.resolve(cfg).eval_batch == 6 * 4
    assert StepPlan.resolve(load_config(None, [*TEXT, "memory.eval_batch_size=3"])).eval_batch == 3
