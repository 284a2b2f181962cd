"""The Objective: task loss x task weight + each method's terms x the micro-batch's share, the logged
parts, the plain path, the (x, y) flag, and the methods' batch changes in config order."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ecotrain.methods import Method, Methods
from ecotrain.core.objective import Objective
from ecotrain.core.task import ClassificationTask


class _Term(Method):
    """A loss term through the model's weights, and an optional task weight."""

    def __init__(self, key, scale, task_weight=None):
        self.key, self.scale = key, scale
        if task_weight is not None:
            self.task_weight = task_weight

    def loss_terms(self, batch, outputs, state):
        return {self.key: self.scale * (state.weight ** 2).sum()}


class _Prepare(Method):
    def __init__(self, key, fn):
        self.key, self.fn = key, fn

    def prepare_batch(self, batch, state):
        state.seen.append(self.key)
        return self.fn(batch)


def _setup():
    torch.manual_seed(0)
    model = nn.Linear(3, 2).double()
    x, y = torch.randn(6, 3, dtype=torch.double), torch.tensor([0, 1, 1, 0, 1, 0])
    return model, x, y


def test_loss_is_weighted_task_plus_each_term_times_its_share():
    model, x, y = _setup()
    methods = Methods([_Term("a", 0.5, task_weight=0.8), _Term("b", 2.0, task_weight=0.5)])
    obj = Objective(ClassificationTask(), methods)
    assert obj.task_weight == pytest.approx(0.4) and not obj.plain
    state = type("S", (), {"weight": model.weight})()
    xm, ym = x[:2], y[:2]
    loss, parts = obj(model, (xm, ym), 6, state)  # this micro-batch: 2 of the step's 6 rows
    task = F.cross_entropy(model(xm), ym)
    w2 = (model.weight ** 2).sum()
    want = (0.4 * task + 0.5 * w2 + 2.0 * w2) * (2 / 6)  # the task loss too is this micro-batch's share
    assert loss.item() == pytest.approx(want.item(), rel=1e-6)
    assert set(parts) == {"task", "a", "b"} and not any(p.requires_grad for p in parts.values())
    assert parts["task"].item() == pytest.approx(0.4 * task.item() / 3, rel=1e-6)
    assert parts["a"].item() == pytest.approx(0.5 * w2.item() / 3, rel=1e-9)
    assert parts["b"].item() == pytest.approx(2.0 * w2.item() / 3, rel=1e-9)
    got = torch.autograd.grad(loss, model.weight)[0]
    torch.testing.assert_close(got, torch.autograd.grad(want, model.weight)[0])  # the terms train too
    loss, _ = obj(model, (x, y), None, state)  # the whole effective batch: share 1
    whole = 0.4 * F.cross_entropy(model(x), y) + 2.5 * (model.weight ** 2).sum()
    assert loss.item() == pytest.approx(whole.item(), rel=1e-6)


def test_plain_objective_is_the_task_loss_alone():
    model, x, y = _setup()
    obj = Objective(ClassificationTask(), Methods([]))
    assert obj.plain and obj.task_weight == 1.0 and obj.batch_methods == []
    loss, parts = obj(model, (x, y), None, None)
    assert parts is None and loss.item() == pytest.approx(F.cross_entropy(model(x), y).item(), rel=1e-9)
    assert Objective(ClassificationTask(), Methods([_Prepare("p", lambda b: b)])).plain  # a batch change alone


def test_a_task_weight_without_terms_scales_the_task_loss():
    model, x, y = _setup()
    weighted = _Prepare("w", lambda b: b)
    weighted.task_weight = 2.0
    obj = Objective(ClassificationTask(), Methods([weighted]))
    assert not obj.plain and obj.task_weight == 2.0
    loss, parts = obj(model, (x, y), None, None)
    assert loss.item() == pytest.approx(2.0 * F.cross_entropy(model(x), y).item(), rel=1e-9)
    assert set(parts) == {"task"} and parts["task"].item() == pytest.approx(loss.item())


def test_xy_flag_follows_the_task():
    assert Objective(ClassificationTask(), Methods([])).xy is True
    assert Objective(ClassificationTask(target="label"), Methods([])).xy is False
    assert Objective(object(), Methods([])).xy is False  # a user task without the flag


def test_prepare_runs_the_batch_methods_in_config_order():
    seen = []
    state = type("S", (), {"seen": seen})()
    methods = Methods([_Prepare("double", lambda b: b * 2), _Term("t", 1.0), _Prepare("inc", lambda b: b + 1)])
    obj = Objective(ClassificationTask(), methods)
    assert [m.key for m in obj.batch_methods] == ["double", "inc"]
    assert obj.prepare(state, torch.tensor([1.0, 3.0])).tolist() == [3.0, 7.0]  # (x * 2) + 1, not (x + 1) * 2
    assert seen == ["double", "inc"]
