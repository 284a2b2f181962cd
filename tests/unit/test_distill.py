"""Distillation: the KD term and the task weight, the cache's index lookup under accumulation, the
teacher's costs in the ledger and in compare's verdict, and the one-line refusals."""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from ecotrain import fit
from ecotrain.accounting.compare import compare
from ecotrain.data import ArraySource
from ecotrain.base.errors import ConfigError
from ecotrain.methods import Methods
from ecotrain.methods.distill import Distill
from ecotrain.core.objective import Objective
from ecotrain.core.task import ClassificationTask


def _distill(cfg_factory, **kw):
    cfg = cfg_factory(methods=[{"name": "distill", "teacher": "unused", **kw}])
    return Distill(cfg.methods[0], cfg), cfg


def test_kd_term_and_task_weight_per_micro_batch(tiny_cfg):
    """loss = (1 - alpha) * CE + alpha * T^2 KL(teacher_T || student_T), each micro-batch's share, and the
    cached logits found by the micro-batch's rows inside the effective batch."""
    torch.manual_seed(0)
    d, _ = _distill(tiny_cfg, alpha=0.3, temperature=3.0)
    x, y = torch.randn(12, 5), torch.randint(0, 4, (12,))
    d.teacher = torch.nn.Linear(5, 4)  # given: the cache below stands for its logits
    d.data(ArraySource(x, y), None)
    d.cache, d.cache_labels = torch.randn(12, 4), y
    idx = torch.tensor([3, 1, 7, 0, 11, 5])
    xb, yb = d.source.take(idx)
    student = torch.nn.Linear(5, 4)
    objective = Objective(ClassificationTask(0.0), Methods([d]))
    assert objective.task_weight == pytest.approx(0.7)
    for i, (xm, ym) in enumerate(zip(xb.split(3), yb.split(3))):
        loss, parts = objective(student, (xm, ym), 6, None)
        out = student(xm)
        p = F.softmax(d.cache[idx[3 * i:3 * i + 3]] / 3, -1)
        kl = (p * (p.log() - F.log_softmax(out / 3, -1))).sum(-1).mean() * 9
        ce = F.cross_entropy(out, ym)
        assert parts["kd"].item() == pytest.approx(0.3 * kl.item() * 0.5, rel=1e-5)
        assert loss.item() == pytest.approx(0.7 * ce.item() * 0.5 + 0.3 * kl.item() * 0.5, rel=1e-5)


def test_a_reordered_batch_is_refused(tiny_cfg):
    d, _ = _distill(tiny_cfg)
    x, y = torch.randn(8, 5), torch.arange(8) % 4
    d.teacher = torch.nn.Linear(5, 4)
    d.data(ArraySource(x, y), None)
    d.cache, d.cache_labels = torch.randn(8, 4), y
    xb, yb = d.source.take(torch.tensor([0, 1, 2, 3]))
    with pytest.raises(ConfigError, match="set cache: false"):
        d.loss_terms((xb.flip(0).contiguous(), yb.flip(0)), torch.randn(4, 4), None)


def test_refusals_are_one_line(tiny_cfg, tmp_path):
    with pytest.raises(ConfigError, match="data.augment"):
        _distill(lambda **kw: tiny_cfg(**{"data.augment": {"noise": 0.1}}, **kw))
    data = ArraySource(torch.randn(4, 64), torch.arange(4))
    d, _ = _distill(tiny_cfg, teacher=str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="not found"):  # while the run is assembled, before it writes anything
        d.data(data, None)
    save_file({"w": torch.zeros(1)}, tmp_path / "t.safetensors")
    d, _ = _distill(tiny_cfg, teacher=str(tmp_path / "t.safetensors"))
    with pytest.raises(ConfigError, match="teacher_model"):
        d.data(data, None)


def test_teacher_costs_in_the_ledger_and_the_verdict(tiny_cfg, tmp_path):
    quiet = {"ledger.energy": "off", "loop.max_steps": 20, "loop.eval_every": 10}
    fit(tiny_cfg(**quiet, **{"model.kwargs": {"hidden": [64]}}), run_dir=tmp_path / "teacher")
    teacher_flops = json.loads((tmp_path / "teacher" / "ledger.json").read_text())["flops"]["total"]
    student = {**quiet, "model.kwargs": {"hidden": [8]}}
    fit(tiny_cfg(**student, methods=[{"name": "distill", "teacher": str(tmp_path / "teacher")}]),
        run_dir=tmp_path / "folder")
    s = json.loads((tmp_path / "folder" / "summary.json").read_text())["methods"]["distill"]
    extra = json.loads((tmp_path / "folder" / "ledger.json").read_text())["flops"]["extra"]
    assert s["teacher_cost_included"] is True and s["teacher_flops"] == teacher_flops
    assert extra["distill.teacher_training"] == teacher_flops
    assert extra["distill.teacher_cache"] == s["cache_flops"] > 0  # one forward over the train set, measured
    # a bare weights file: the model is named in the config, and its training cost cannot be counted
    fit(tiny_cfg(**student, methods=[{"name": "distill", "teacher": str(tmp_path / "teacher" / "model.safetensors"),
                                      "teacher_model": {"name": "mlp", "kwargs": {"hidden": [64]}}}]),
        run_dir=tmp_path / "file")
    s2 = json.loads((tmp_path / "file" / "summary.json").read_text())["methods"]["distill"]
    assert s2["teacher_cost_included"] is False and "unknown" in s2["teacher_cost_note"]
    text, _ = compare([str(tmp_path / "teacher")], [str(tmp_path / "folder")], by="flops")
    assert "teacher's training FLOPs are included" in text
    text, _ = compare([str(tmp_path / "teacher")], [str(tmp_path / "file")], by="flops")
    assert "teacher's training FLOPs are NOT included" in text
