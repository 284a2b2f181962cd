"""The numerical fault drill: three injected faults (a NaN gradient, a loss spike, an inf from fp16
overflow), each met by each divergence action (stop, skip, rollback), on real training runs.

The fp16 overflow is simulated on CPU (no GPU here, and fp16-mixed is refused on CPU): at the
faulty step the model computes one layer in float16 with activations past float16's largest value
(65504), so the forward really overflows to inf, as an fp16 activation does on a GPU."""

import math

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from ecotrain import Callback, fit
from tests.helpers.killer import SigtermAt
from ecotrain.checkpoint.manager import latest_valid

FAULT_AT = 25  # the faulty step (0-based: the step that state.step == FAULT_AT starts); checkpoints every 10
DRILL = {"checkpoint.every_n_steps": 10, "loop.max_steps": 40, "loop.eval_every": None, "divergence.max_skips": 3,
         "divergence.max_rollbacks": 2, "divergence.rollback_lr_factor": 0.25}
NEEDS = {"nan_grad": {"divergence.check_grads": True}, "spike": {"divergence.spike_factor": 5.0}, "fp16_inf": {}}


class FaultyNet(nn.Module):
    """An MLP for digits (64 -> 32 -> 10) that misbehaves while `fault` is armed."""

    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(64, 32), nn.Linear(32, 10)
        self.fault = None
        self.l1.weight.register_hook(lambda g: g * float("nan") if self.fault == "nan_grad" else g)

    def forward(self, x):
        h = torch.relu(self.l1(x.flatten(1)))
        if self.fault == "fp16_inf":  # one layer in float16, activations past 65504: inf
            h = (h.half() * 7e4).float()
        out = self.l2(h)
        return out * 1e4 if self.fault == "spike" else out  # a huge, finite loss


class Fault(Callback):
    """Arms `model.fault` for the step that starts at `at`, `times` times (a rollback replays it)."""

    def __init__(self, model, kind, at=FAULT_AT, times=1):
        self.model, self.kind, self.at, self.left = model, kind, at, times

    def on_step_start(self, state):
        armed = state.step == self.at and self.left > 0
        self.left -= armed
        self.model.fault = self.kind if armed else None


def _drill(tiny_cfg, tmp_path, kind, action, times=1, **more):
    torch.manual_seed(0)
    model = FaultyNet()
    cfg = tiny_cfg(**{**DRILL, **NEEDS[kind], "divergence.action": action, **more})
    return fit(cfg, model=model, run_dir=tmp_path / f"{kind}-{action}", callbacks=[Fault(model, kind, times=times)])


def _finite(model):
    return all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("kind", ["nan_grad", "spike", "fp16_inf"])
def test_stop_never_applies_the_faulty_step(tiny_cfg, tmp_path, kind):
    r = _drill(tiny_cfg, tmp_path, kind, "stop")
    assert r.summary["stopped_because"] == "diverged" and r.summary["steps"] == FAULT_AT + 1
    assert _finite(r.model) and r.summary["rollbacks"] == 0


@pytest.mark.parametrize("kind", ["nan_grad", "spike", "fp16_inf"])
def test_skip_drops_the_step_and_trains_on(tiny_cfg, tmp_path, kind):
    r = _drill(tiny_cfg, tmp_path, kind, "skip")
    assert r.summary["stopped_because"] == "max_steps" and r.summary["steps"] == 40
    assert r.summary["skipped_nonfinite_steps"] == 1 and r.summary["rollbacks"] == 0 and _finite(r.model)


@pytest.mark.parametrize("kind", ["nan_grad", "spike", "fp16_inf"])
def test_rollback_reloads_the_last_checkpoint_with_a_lower_lr(tiny_cfg, tmp_path, kind):
    r = _drill(tiny_cfg, tmp_path, kind, "rollback")
    assert r.summary["stopped_because"] == "max_steps" and r.summary["steps"] == 40
    assert r.summary["rollbacks"] == 1 and r.summary["skipped_nonfinite_steps"] == 0 and _finite(r.model)
    assert math.isclose(r.state.lr, 3e-3 * 0.25)  # tiny_cfg's lr, constant schedule, one rollback
    assert latest_valid(r.run_dir) is not None


def test_a_persistent_fault_stops_after_max_rollbacks(tiny_cfg, tmp_path):
    r = _drill(tiny_cfg, tmp_path, "fp16_inf", "rollback", times=100)  # replayed after every rollback
    assert r.summary["stopped_because"] == "diverged" and r.summary["rollbacks"] == 2
    assert r.summary["steps"] == FAULT_AT + 1 and math.isclose(r.state.lr, 3e-3 * 0.25 ** 2) and _finite(r.model)


def test_resume_after_a_rollback_is_exact(tiny_cfg, tmp_path):
    """A run that rolled back (step 26 -> 20, LR x0.25), killed at step 34 and resumed, ends
    bit-identical to the same run uninterrupted: the rollback is deterministic and its lower LR
    and count ride in the checkpoint."""
    full = _drill(tiny_cfg, tmp_path / "a", "spike", "rollback")
    torch.manual_seed(0)
    model = FaultyNet()
    cfg = tiny_cfg(**{**DRILL, **NEEDS["spike"], "divergence.action": "rollback"})
    cut = fit(cfg, model=model, run_dir=tmp_path / "cut", callbacks=[Fault(model, "spike"), SigtermAt(33)])
    assert cut.summary["stopped_because"] == "preempted" and cut.state.step == 34
    torch.manual_seed(0)
    model = FaultyNet()
    resumed = fit(cfg, model=model, run_dir=tmp_path / "cut", resume=cut.state.last_checkpoint,
                  callbacks=[Fault(model, "spike", times=0)])  # the transient fault is over
    assert resumed.summary["rollbacks"] == 1 and math.isclose(resumed.state.lr, full.state.lr)
    a = load_file(full.run_dir / "model.safetensors")
    b = load_file(tmp_path / "cut" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


class StopAfterRollback(Callback):
    """Ends the run at the first step end after a rollback (after the Checkpointer's save), as a
    kill right after the rollback would leave it."""

    def on_step_end(self, state):
        if state.counters.rollbacks:
            state.stop("preempted")


def test_the_restored_step_is_saved_again_with_the_lower_lr(tiny_cfg, tmp_path):
    """Without that save a resume from the restored step would train at the old LR (the fault was
    transient) and end elsewhere."""
    full = _drill(tiny_cfg, tmp_path / "a", "nan_grad", "rollback")
    torch.manual_seed(0)
    model = FaultyNet()
    cfg = tiny_cfg(**{**DRILL, **NEEDS["nan_grad"], "divergence.action": "rollback"})
    cut = fit(cfg, model=model, run_dir=tmp_path / "cut", callbacks=[Fault(model, "nan_grad"), StopAfterRollback()])
    assert cut.state.step == 20 and cut.state.last_checkpoint.endswith("step-00000020")
    torch.manual_seed(0)
    model = FaultyNet()
    fit(cfg, model=model, run_dir=tmp_path / "cut", resume=cut.state.last_checkpoint,
        callbacks=[Fault(model, "nan_grad", times=0)])
    a = load_file(full.run_dir / "model.safetensors")
    b = load_file(tmp_path / "cut" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
