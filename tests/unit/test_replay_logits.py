"""DER++-style logit replay (methods.replay `logits: true`): the buffer keeps each example's
logits, the replay rows add logit_weight * MSE(logits, stored), logged as loss_replay_logits and
attached to the graph; the logits travel with the buffer (export.safetensors, `from`)."""

import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from ecotrain import fit
from ecotrain.data import ArraySource
from ecotrain.core.distributed import Dist
from ecotrain.base.errors import CheckpointError, ConfigError
from ecotrain.methods.replay import Buffer, Replay, load_buffer, model_logits
from tests.unit.test_methods import SigtermAt
from tests.helpers.steps import step_grads


def _cfg(tiny_cfg, methods, steps=12, **over):
    return tiny_cfg(**{"methods": methods, "data.num_classes": 10, "loop.max_steps": steps, "loop.eval_every": 6,
                       "loop.log_every": 1, "ledger.enabled": False, **over})


def _logged(run, key):
    return [json.loads(x)[key] for x in (run / "metrics.jsonl").read_text().splitlines() if f'"{key}"' in x]


@pytest.mark.parametrize("accumulate", [1, 2])
def test_the_logit_term_trains_the_model(tiny_cfg, accumulate):
    """The step's gradient is that of CE(batch) + weight * CE(replay) + logit_weight * MSE(replay logits,
    stored): a logit term detached from the graph (logged, not trained) fails here."""
    torch.manual_seed(0)
    cfg = _cfg(tiny_cfg, [{"name": "replay", "weight": 0.5, "logits": True, "logit_weight": 0.7}])
    m = Replay(cfg.methods[0], cfg)
    m.buffer = Buffer(torch.randn(12, 4, dtype=torch.double) * 3, torch.arange(12) % 3, torch.ones(12), 12,
                      torch.randn(12, 3) * 2)
    m.rows = 6
    model = nn.Linear(4, 3).double()
    x, y = torch.randn(8, 4, dtype=torch.double), torch.randint(0, 3, (8,))
    got, parts = step_grads(model, m, (x, y), accumulate, epoch=1, batch_in_epoch=1)

    idx = m.replay_indices(1, 1)
    rx, ry, z = m.buffer.x[idx], m.buffer.y[idx], m.buffer.logits[idx].double()
    params = list(model.parameters())
    task = torch.autograd.grad(F.cross_entropy(model(x), y), params)
    replay = torch.autograd.grad(0.5 * F.cross_entropy(model(rx), ry), params)
    mse = 0.7 * F.mse_loss(model(rx), z)
    from_logits = torch.autograd.grad(mse, params)
    assert all(g.abs().max() > 1e-3 for g in from_logits)  # the term pulls on every parameter
    for g, t, r, lg in zip(got, task, replay, from_logits):
        torch.testing.assert_close(g, t + r + lg, rtol=1e-5, atol=1e-7)
    assert parts["replay_logits"].item() == pytest.approx(mse.item(), rel=1e-5)  # what is logged is what trained


def test_finalize_stores_the_final_models_logits_and_keeps_the_carried_ones():
    torch.manual_seed(0)
    model = nn.Linear(3, 4)
    old_x = torch.arange(18.0).reshape(6, 3) + 100  # values the new data never has
    old = Buffer(old_x, torch.arange(6) % 4, torch.ones(6), 6, torch.full((6, 4), -7.0) + torch.arange(6.0)[:, None])
    new = ArraySource(torch.randn(40, 3), torch.arange(40) % 4)
    for selection in ("balanced", "reservoir"):
        cfg = SimpleNamespace(selection=selection, size=10, hard_weight=1.0, rare_weight=False, logits=True)
        m = Replay.__new__(Replay)
        m.cfg, m.seed, m.buffer, m.rows = cfg, 3, old, 0
        m.finalize(model, SimpleNamespace(train=new))
        b = m.buffer
        carried = (b.x[:, None, :] == old_x[None]).all(-1)  # [rows, old rows]
        assert carried.any() and not carried.all(-1).all(), selection  # both kinds of rows
        for i in range(len(b)):
            if carried[i].any():
                assert torch.equal(b.logits[i], old.logits[int(carried[i].nonzero())]), selection
            else:
                torch.testing.assert_close(b.logits[i], model(b.x[i:i + 1])[0].detach())
        assert b.logits.dtype == torch.float32 and m.report["logits"] is True


def test_logits_round_trip_through_export_and_from(tiny_cfg, tmp_path):
    r0 = fit(_cfg(tiny_cfg, [{"name": "replay", "size": 30, "logits": True}]), run_dir=tmp_path / "v0", quiet=True)
    exported = load_file(tmp_path / "v0" / "export.safetensors")
    assert exported["replay/logits"].shape == (30, 10)
    torch.testing.assert_close(exported["replay/logits"], model_logits(r0.model, exported["replay/x"]).float())
    assert torch.equal(load_buffer(tmp_path / "v0").logits, exported["replay/logits"])
    fit(_cfg(tiny_cfg, [{"name": "replay", "size": 30, "from": str(tmp_path / "v0"), "logits": True}]),
        run_dir=tmp_path / "v1", init_from=tmp_path / "v0", quiet=True)
    logged = _logged(tmp_path / "v1", "loss_replay_logits")
    assert len(logged) == 12 and logged[0] == pytest.approx(0.0, abs=1e-6) and max(logged) > 1e-5


def test_off_is_the_plain_buffer_and_a_zero_weight_trains_the_same_model(tiny_cfg, tmp_path):
    fit(_cfg(tiny_cfg, [{"name": "replay", "size": 30}]), run_dir=tmp_path / "v0", quiet=True)
    assert "replay/logits" not in load_file(tmp_path / "v0" / "export.safetensors")
    prev = str(tmp_path / "v0")
    runs = {}
    for name, extra in (("off", {}), ("zero", {"logits": True, "logit_weight": 0.0})):
        fit(_cfg(tiny_cfg, [{"name": "replay", "size": 30, "from": prev, **extra}]), run_dir=tmp_path / name,
            init_from=tmp_path / "v0", quiet=True)
        runs[name] = load_file(tmp_path / name / "model.safetensors")
    assert _logged(tmp_path / "off", "loss_replay_logits") == []
    assert _logged(tmp_path / "zero", "loss_replay_logits")[-1] == 0.0
    assert all(torch.equal(runs["off"][k], runs["zero"][k]) for k in runs["off"])


def test_a_buffer_without_logits_takes_the_starting_models_and_a_resume_keeps_them(tiny_cfg, tmp_path):
    fit(_cfg(tiny_cfg, [{"name": "replay", "size": 30}]), run_dir=tmp_path / "v0", quiet=True)
    entry = {"name": "replay", "size": 30, "from": str(tmp_path / "v0"), "logits": True}
    with pytest.raises(ConfigError, match=r"^methods: 'replay' needs the weights the run starts from"):
        fit(_cfg(tiny_cfg, [entry]), run_dir=tmp_path / "none")  # random weights' logits would be noise
    assert not (tmp_path / "none").exists()
    cfg = _cfg(tiny_cfg, [entry], **{"checkpoint.every_n_steps": 4, "ledger.enabled": True, "ledger.energy": "off"})
    fit(cfg, run_dir=tmp_path / "full", init_from=tmp_path / "v0", quiet=True)
    assert _logged(tmp_path / "full", "loss_replay_logits")[0] == pytest.approx(0.0, abs=1e-6)  # v0's own logits
    ledger = json.loads((tmp_path / "full" / "ledger.json").read_text())
    assert ledger["flops"]["extra"]["replay.logits"] > 0  # the one-off forward is charged (state.add_flops)
    cut = fit(cfg, run_dir=tmp_path / "cut", init_from=tmp_path / "v0", quiet=True, callbacks=[SigtermAt(6)])
    assert cut.summary["stopped_because"] == "preempted"
    fit(cfg, run_dir=tmp_path / "cut", resume=cut.state.last_checkpoint, quiet=True)  # no init_from
    a, b = load_file(tmp_path / "full" / "model.safetensors"), load_file(tmp_path / "cut" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_refusals_damaged_logits_and_another_head(tiny_cfg, tmp_path):
    ok = {"replay/x": torch.zeros(4, 2), "replay/y": torch.zeros(4, dtype=torch.long), "replay/weight": torch.ones(4),
          "replay/seen": torch.tensor([4])}
    save_file({**ok, "replay/logits": torch.zeros(3, 5)}, str(tmp_path / "bad.safetensors"))
    with pytest.raises(CheckpointError, match=r"bad.safetensors: 3 rows of logits for 4 examples; the file is damaged"):
        load_buffer(tmp_path / "bad.safetensors")
    save_file({**ok, "replay/logits": torch.zeros(4, 5)}, str(tmp_path / "b.safetensors"))
    cfg = _cfg(tiny_cfg, [{"name": "replay", "from": str(tmp_path / "b.safetensors"), "logits": True}])
    m = Replay(cfg.methods[0], cfg)
    assert m.needs == ("xy",)  # it brings its own logits: no starting weights needed
    with pytest.raises(ConfigError, match=r"^methods.replay.logits: the buffer's stored logits are \(5,\) per example "
                                          r"but this model's are \(3,\); replay logits of the same head$"):
        m.on_fit_start(SimpleNamespace(model=nn.Linear(2, 3), dist=Dist()))
