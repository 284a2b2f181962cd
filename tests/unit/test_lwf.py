"""LwF: the KD term is zero when the student is its teacher, positive once it moves, and the
teacher comes from the previous run folder."""

import json

import pytest
import torch

from ecotrain import fit
from ecotrain.base.errors import ConfigError
from ecotrain.methods.kd import kd_loss


def _cfg(tiny_cfg, methods, steps=6):
    return tiny_cfg(**{"methods": methods, "loop.max_steps": steps, "loop.eval_every": steps, "loop.log_every": 1,
                       "ledger.enabled": False})


def _logged(run, key):
    return [json.loads(x)[key] for x in (run / "metrics.jsonl").read_text().splitlines() if f'"{key}"' in x]


def test_lwf_is_zero_when_student_is_teacher_and_grows_after(tiny_cfg, tmp_path):
    fit(_cfg(tiny_cfg, []), run_dir=tmp_path / "v0", quiet=True)
    fit(_cfg(tiny_cfg, [{"name": "lwf", "teacher": str(tmp_path / "v0"), "alpha": 2.0}], steps=8),
        run_dir=tmp_path / "v1", init_from=tmp_path / "v0", quiet=True)
    lwf = _logged(tmp_path / "v1", "loss_lwf")
    assert lwf[0] == pytest.approx(0.0, abs=1e-6)  # step 1's batch: the student still is the teacher
    assert max(lwf[1:]) > 1e-5  # it moved


def test_kd_loss_is_the_shared_one():
    s = torch.randn(5, 10)
    assert float(kd_loss(s, s.clone(), 2.0)) == pytest.approx(0.0, abs=1e-6)
    assert float(kd_loss(s, torch.randn(5, 10), 2.0)) > 0


def test_no_teacher_means_no_term_and_a_missing_one_is_one_line(tiny_cfg, tmp_path):
    r = fit(_cfg(tiny_cfg, [{"name": "lwf"}]), run_dir=tmp_path / "v0", quiet=True)
    assert _logged(tmp_path / "v0", "loss_lwf") == [] and r.summary["steps"] == 6
    with pytest.raises(ConfigError, match="methods.lwf.teacher: .* not found"):
        fit(_cfg(tiny_cfg, [{"name": "lwf", "teacher": str(tmp_path / "nope")}]), run_dir=tmp_path / "v1")


def test_replay_rows_are_distilled_too(tiny_cfg, tmp_path):
    fit(_cfg(tiny_cfg, [{"name": "replay", "size": 30}]), run_dir=tmp_path / "v0", quiet=True)
    prev = str(tmp_path / "v0")
    fit(_cfg(tiny_cfg, [{"name": "replay", "size": 30, "from": prev},
                        {"name": "lwf", "teacher": prev, "on_new": False}], steps=4),
        run_dir=tmp_path / "v1", init_from=tmp_path / "v0", quiet=True)
    lwf = _logged(tmp_path / "v1", "loss_lwf")
    assert len(lwf) == 4 and lwf[0] == pytest.approx(0.0, abs=1e-6) and lwf[-1] > 0  # only the replay rows
