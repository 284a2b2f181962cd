"""Schedule methods' mechanics: progressive resizing's stages and shapes, the batch ramp's sizes,
sampler and LR rule, late freezing's cheaper step, the stability stop."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from ecotrain.config import (Config, LateFreezeConfig, ProgressiveResizeConfig,
                             StabilityStopConfig)
from ecotrain.data import ArraySource, EpochSampler
from ecotrain.base.errors import ConfigError
from ecotrain.methods.batch_ramp import BatchRamp
from ecotrain.methods.late_freeze import LateFreeze
from ecotrain.methods.resize import ProgressiveResize, resize
from ecotrain.methods.stability import StabilityStop, is_stable
from ecotrain.models.vision1d import ConvBase, ResNet1d


class _Flags:
    def __init__(self, step=0, total=100):
        self.step, self.total_steps, self.changed, self.device = step, total, 0, torch.device("cpu")
        self.dist = SimpleNamespace(unwrap=lambda m: m)
        self.stopped = None

    def flops_changed(self):
        self.changed += 1

    def stop(self, why):
        self.stopped = why


def test_resize_downsamples_signals_and_crops_token_sequences():
    x = torch.arange(40.0).repeat(3, 1)
    out, y = resize(x, torch.tensor([1, 2, 3]), 0.5, "downsample")
    assert out.shape == (3, 20) and y.tolist() == [1, 2, 3]
    torch.testing.assert_close(out[0, :3], torch.tensor([0.5, 2.5, 4.5]))  # linear: pairs averaged
    tok, tgt = resize(torch.arange(12).view(2, 6), torch.arange(12).view(2, 6) + 1, 0.5, "crop")
    assert tok.tolist() == [[0, 1, 2], [6, 7, 8]] and tgt.tolist() == [[1, 2, 3], [7, 8, 9]]


def test_resize_stages_follow_the_step_and_each_change_remeasures_flops():
    m = ProgressiveResize(ProgressiveResizeConfig(name="progressive_resize", scales=[0.5, 0.75], until=[0.2, 0.5]))
    src = ArraySource(torch.randn(8, 40), torch.zeros(8, dtype=torch.long))
    m.data(src, None)
    st = _Flags(total=100)
    m.on_fit_start(st)
    assert [m.scale_at(s) for s in (0, 19, 20, 49, 50, 99)] == [0.5, 0.5, 0.75, 0.75, 1.0, 1.0]
    for s in range(1, 100):
        st.step = s
        m.on_step_end(st)
    assert st.changed == 2  # at steps 20 and 50, once each
    x, _ = m.prepare_batch(src.take(torch.arange(4)), SimpleNamespace(step=10))
    assert x.shape == (4, 20)
    assert m.prepare_batch((x, None), SimpleNamespace(step=60))[0] is x  # full size: untouched


def test_resize_refuses_a_model_with_a_fixed_size_head_before_the_run_starts():
    src = ArraySource(torch.randn(4, 40), torch.zeros(4, dtype=torch.long))
    m = ProgressiveResize(ProgressiveResizeConfig(name="progressive_resize", scales=[0.5], until=[0.3]))
    model = m.transform(ConvBase(40, 10))
    with pytest.raises(ConfigError, match="cannot take inputs of length 20"):
        m.data(src, None)  # the data hook runs while assembling, before the run folder is written
    assert model.training  # put back as it was
    ok = ProgressiveResize(ProgressiveResizeConfig(name="progressive_resize", scales=[0.5], until=[0.3]))
    ok.transform(ResNet1d(40, 10, widths=(4,)))
    assert ok.data(src, "sampler") == (src, "sampler") and ok.mode == "downsample"


def _ramp(rule="sqrt", **over):
    run = Config.model_validate({"data": {"batch_size": 16}, "loop": {"max_steps": 100, "max_epochs": None},
                                 "methods": [{"name": "batch_ramp", "lr_scaling": rule, "start": 0.25, "steps": 12,
                                              "stages": 3, **over}]})
    return BatchRamp(run.methods[0], run)


def test_batch_ramp_sizes_sampler_and_resume_position():
    m = _ramp()
    assert [m.size_at(s) for s in (0, 3, 4, 8, 11, 12, 500)] == [4, 4, 8, 12, 12, 16, 16]
    base = EpochSampler(50, 16, seed=2)
    _, s = m.data(None, base)
    for epoch in (0, 1, 2):
        batches = list(s.batches(epoch))
        assert torch.equal(torch.cat(batches), base.order(epoch))  # every sample once, the engine's order
        step0 = s.start_step(epoch)
        assert [len(b) for b in batches[:-1]] == [m.size_at(step0 + i) for i in range(len(batches) - 1)]
        assert [b.tolist() for b in s.batches(epoch, 2)] == [b.tolist() for b in batches[2:]]  # resume at batch 2
    e0 = list(s.batches(0))
    assert s.start_step(1) == len(e0) and len(e0) > len(base)  # small batches: more steps in epoch 0
    assert len(s) == len(base)  # the engine plans with full-size batches


def test_batch_ramp_lr_rule_scales_the_schedule_and_gives_it_back():
    from ecotrain.core.optim import build_scheduler
    from ecotrain.config import ScheduleConfig
    for rule, first in (("none", 1.0), ("linear", 0.25), ("sqrt", 0.5)):
        m = _ramp(rule)
        opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
        sched = build_scheduler(opt, ScheduleConfig(name="cosine"), 100)
        st = SimpleNamespace(step=0, scheduler=sched, optimizer=opt)
        m.on_step_start(st)
        assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * first)
        for s in range(1, 13):
            sched.step()
            st.step = s
            m.on_step_start(st)
        assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * sched.fn(12))  # full size: the schedule's own
    assert m.summary()["sizes"] == [4, 8, 12, 16] and m.summary()["lr_scaling"] == "sqrt"


def test_the_schedule_writes_every_scale_and_a_resume_sets_the_same_lr():
    """Methods and callbacks ask the schedule for a named scale; it is saved with t, so a schedule
    rebuilt from the checkpoint sets the same LR (and a factor of 1 drops the name)."""
    from ecotrain.config import ScheduleConfig
    from ecotrain.core.optim import build_scheduler

    def fresh():
        opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
        return opt, build_scheduler(opt, ScheduleConfig(name="cosine"), 100)

    opt, sched = fresh()
    for _ in range(7):
        sched.step()
    sched.scale("batch_ramp", 0.5)
    sched.scale("divergence", 0.25)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * sched.fn(7) * 0.125)
    opt2, again = fresh()
    again.load_state_dict(sched.state_dict())
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    again.scale("batch_ramp", 1.0)
    assert again.state_dict()["scales"] == {"divergence": 0.25}
    again.step()  # the scale outlives the step
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.1 * again.fn(8) * 0.25)


def test_a_method_that_scales_the_lr_refuses_a_users_own_scheduler(tmp_path):
    from ecotrain import fit

    cfg = Config.model_validate({"data": {"name": "mnist1d", "num_samples": 200}, "loop": {"max_steps": 2},
                                 "methods": [{"name": "batch_ramp", "lr_scaling": "sqrt", "steps": 2}]})
    with pytest.raises(ConfigError, match="methods.batch_ramp: scales the learning rate.*LambdaLR"):
        fit(cfg, run_dir=tmp_path / "run", quiet=True,
            scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1.0))
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_batch_ramp_needs_a_step_budget():
    run = Config.model_validate({"loop": {"max_epochs": 3}, "methods": [{"name": "batch_ramp", "lr_scaling": "none"}]})
    with pytest.raises(ConfigError, match="loop.max_steps"):
        BatchRamp(run.methods[0], run)
    with pytest.raises(Exception, match="lr_scaling"):  # the rule is required: no silent default
        Config.model_validate({"methods": [{"name": "batch_ramp"}]})


def _freeze(**over):
    run = Config.model_validate({"methods": [{"name": "late_freeze", "at": 0.5, **over}]})
    return LateFreeze(run.methods[0], run)


def test_late_freeze_freezes_at_its_step_and_the_step_gets_cheaper():
    from ecotrain.accounting.flops import count_flops

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    m = _freeze(freeze_depth=1)
    m.transform(model)
    x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))

    def step():
        nn.functional.cross_entropy(model(x), y).backward()

    before = count_flops(model, step, 16).total
    st = _Flags(step=0, total=40)
    m.on_fit_start(st)
    st.step = 19
    m.on_step_end(st)
    assert not m.frozen and st.changed == 0
    st.step = 20
    m.on_step_end(st)
    assert m.frozen and st.changed == 1 and not model[0].weight.requires_grad and model[2].weight.requires_grad
    model.zero_grad(set_to_none=True)
    after = count_flops(model, step, 16).total
    assert model[0].weight.grad is None and model[2].weight.grad is not None
    # no weight gradient for the first layer, and no input gradient for the second (nothing below needs it)
    assert after == before - 2 * 16 * 32 * 64 - 2 * 16 * 64 * 64
    resumed = _freeze(freeze_depth=1)
    fresh = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    resumed.transform(fresh)
    resumed.on_fit_start(_Flags(step=25, total=40))  # a resume past the point: frozen again
    assert not fresh[0].weight.requires_grad


def test_late_freeze_config_errors():
    with pytest.raises(ConfigError, match="matches no parameter"):
        _freeze(freeze=["nothing.*"]).transform(nn.Sequential(nn.Linear(2, 2)))
    with pytest.raises(ConfigError, match="freeze fewer"):
        _freeze(freeze_depth=2).transform(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)))
    with pytest.raises(Exception, match="say what to freeze"):
        LateFreezeConfig(name="late_freeze")
    run = Config.model_validate({"distributed": {"strategy": "ddp"}, "methods": [{"name": "late_freeze", "freeze_depth": 1}]})
    with pytest.raises(ConfigError, match="torchrun"):
        LateFreeze(run.methods[0], run)


def test_stability_stop_stops_once_the_window_is_flat_and_resumes_its_window():
    assert is_stable([1.0, 1.004, 1.002], 0.005) and not is_stable([1.0, 1.01, 1.0], 0.005)
    m = StabilityStop(StabilityStopConfig(name="stability_stop", window=3, tolerance=0.005, min_steps=30))
    st = _Flags()
    for step, v in ((10, 2.0), (20, 1.0), (25, 1.002), (28, 1.001)):
        st.step = step
        m.on_eval_end(st, {"val_loss": v})
    assert st.stopped is None  # flat, but before min_steps
    m2 = StabilityStop(StabilityStopConfig(name="stability_stop", window=3, tolerance=0.005, min_steps=30))
    m2.load_state_dict(m.state_dict())
    st.step = 30
    m2.on_eval_end(st, {"val_loss": 1.003})
    assert st.stopped == "stable:val_loss" and m2.summary()["stopped_at_step"] == 30
    m2.on_eval_end(st, {"other": 1.0})  # a record without the monitor: ignored
