"""The Objective with a methods object that has only what it must (no `methods`, no
`batch_methods`), and a micro-batch's unit count given by the caller (task.unit_counts) scaling
its loss instead of the batch's own count."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ecotrain.methods import Methods
from ecotrain.core.objective import Objective
from ecotrain.core.task import ClassificationTask

pytestmark = pytest.mark.unit


def test_a_methods_object_without_method_lists_weighs_nothing_and_prepares_nothing():
    bare = SimpleNamespace(has_loss_terms=False)
    obj = Objective(ClassificationTask(), bare)
    assert obj.task_weight == 1.0 and obj.plain and obj.batch_methods == []
    batch = (torch.zeros(2, 3), torch.zeros(2, dtype=torch.long))
    assert obj.prepare(None, batch) is batch


def test_a_given_unit_count_scales_the_micro_batch_not_its_own_count():
    torch.manual_seed(0)
    model = nn.Linear(3, 4)
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 2, 3])
    whole = F.cross_entropy(model(x), y)
    obj = Objective(ClassificationTask(), Methods([]))
    loss, _ = obj(model, (x, y), 8, None, units=2)  # the caller read 2 units for this piece
    assert loss.item() == pytest.approx(whole.item() * 2 / 8)
    loss, _ = obj(model, (x, y), 8, None)  # none given: the batch's own 4
    assert loss.item() == pytest.approx(whole.item() * 4 / 8)
    loss, _ = obj(model, (x, y), None, None)  # the whole effective batch
    assert loss.item() == pytest.approx(whole.item())
