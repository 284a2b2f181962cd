"""task.py part by part: which tensor of a batch is the target (by position, by name, by key) and what
the model is called with, the refusals word for word, half-precision and integer outputs, each
reduction's shape, label smoothing, the metrics each task builds, a user's metric objects copied
afresh, a micro-batch of no units, and `auto` with a named target."""

import pytest
import torch
import torch.nn.functional as F

import ecotrain
from ecotrain.base.errors import ConfigError
from ecotrain.core.task import (
    ClassificationTask,
    ModelLossTask,
    MultiLabelTask,
    RegressionTask,
    SequenceTask,
    SupervisedTask,
    UserTask,
    _infer,
    build_task,
    normalized_loss,
)

pytestmark = pytest.mark.unit


def _err(fn, *args) -> str:
    with pytest.raises(ConfigError) as err:
        fn(*args)
    return str(err.value)


def test_a_named_target_position():
    a, b, c = torch.zeros(2), torch.ones(2), torch.full((2,), 2.0)
    first = SupervisedTask(target=0)
    assert first.targets((a, b)) is a and first.inputs((a, b)) == ((), {})
    assert SupervisedTask(target=1).targets((a, b, c)) is b
    by_name = SupervisedTask(target="y")  # a name on a tuple batch: the last element
    assert by_name.targets((a, b, c)) is c and by_name.inputs((a, b, c))[0] == (a, b)
    assert SupervisedTask().targets((a, b, c)) is c and SupervisedTask().targets((a, b, "meta")) is b
    assert _err(SupervisedTask().targets, ("x", "y", "z")) == "task: the batch holds no tensor to use as the target"


def test_dict_batches_and_their_refusals():
    batch = {k: torch.zeros(1) for k in "abcdefghij"}
    assert _err(SupervisedTask(target="z").targets, batch) == (
        "task.target: 'z' is not a key of the batch (keys: ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'])")
    assert _err(SupervisedTask().targets, batch) == (
        "task: a dict batch needs its target under one of ['labels', 'label', 'y', 'target', 'targets'] or "
        "task.target (keys: ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h']); or task.name=model_loss when the model "
        "computes its loss")
    args, kwargs = SupervisedTask(target="c").inputs({"a": batch["a"], "c": batch["c"], "s": "text"})
    assert args == () and list(kwargs) == ["a"]
    assert _err(SupervisedTask().inputs, 3) == ("task: a supervised batch is a tuple (x, y) or a dict with a target, "
                                                "got int")


def test_forward_calls_the_model_with_the_inputs():
    seen = []

    def model(*args, **kwargs):
        seen.append((args, kwargs))
        return torch.zeros(1)

    words, y = ["a", "b"], torch.zeros(2)
    SupervisedTask().forward(model, (words, y))  # a pair: model(x), whatever x is
    assert seen[-1] == ((words,), {})
    x = torch.ones(2)
    SupervisedTask().forward(model, [x, y])  # a list is inspected: the tensors before the target
    assert seen[-1][0][0] is x and len(seen[-1][0]) == 1
    SupervisedTask(target=0).forward(model, (y, x))  # a named target: no shortcut
    assert seen[-1] == ((), {})
    ModelLossTask().forward(model, x)
    assert seen[-1][0][0] is x
    ModelLossTask().forward(model, (x, y))
    assert seen[-1][0] == (x, y)


def test_half_and_integer_outputs_are_lost_in_fp32():
    y = torch.tensor([[1, 0], [0, 1]])
    logits = torch.tensor([[2.0, -1.0], [0.5, 0.25]])
    ml = MultiLabelTask()
    full = ml.loss(logits, (None, y))
    half = ml.loss(logits.bfloat16(), (None, y))
    assert half.dtype == torch.float32 and full.dtype == torch.float32
    assert torch.allclose(half, full, atol=1e-2)
    reg = RegressionTask()
    out = reg.loss(torch.tensor([1, 3]), (None, torch.tensor([1.0, 1.0])))
    assert out.dtype == torch.float32 and out.item() == 2.0
    assert reg.loss(torch.tensor([1.0, 3.0]), (None, torch.tensor([1, 1]))).item() == 2.0  # integer targets
    assert ml.loss(logits.double(), (None, y)).dtype == torch.float64


def test_each_reduction_shape():
    y = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    out = torch.tensor([[0.5, -1.0, 2.0], [1.0, 0.0, -0.5]])
    for task in (MultiLabelTask(), RegressionTask()):
        none = task.loss(out, (None, y), reduction="none")
        assert none.shape == (2,), task.name
        assert torch.allclose(task.loss(out, (None, y), reduction="sum"), none.sum())
        assert torch.allclose(task.loss(out, (None, y)), none.mean())
    per = F.binary_cross_entropy_with_logits(out, y, reduction="none").mean(1)
    assert torch.allclose(MultiLabelTask().loss(out, (None, y), reduction="none"), per)
    assert torch.allclose(RegressionTask().loss(out, (None, y), reduction="none"), ((out - y) ** 2).mean(1))


def test_regression_refusals():
    assert _err(RegressionTask, "hinge") == "task.loss: 'hinge' is not one of ['huber', 'l1', 'mse']"
    assert _err(RegressionTask().loss, torch.zeros(4, 3), (None, torch.zeros(4))) == (
        "task=regression: the model's output (4, 3) does not match the target (4,); give the model one output per "
        "target value")


def test_classification_loss_in_fp32_with_label_smoothing():
    logits = torch.tensor([[2.0, -1.0, 0.0], [0.5, 0.25, 3.0]])
    y = torch.tensor([0, 2])
    task = ClassificationTask(label_smoothing=0.1)
    expected = F.cross_entropy(logits, y, label_smoothing=0.1)
    assert torch.allclose(task.loss(logits, (None, y)), expected)
    half = task.loss(logits.half(), (None, y))
    assert half.dtype == torch.float32 and torch.allclose(half, expected, atol=1e-2)
    assert torch.allclose(task.loss({"logits": logits}, {"x": None, "y": y}), expected)


def test_sequence_loss_takes_its_target_where_the_batch_says():
    out = torch.tensor([[[2.0, 0.0], [0.0, 1.0]], [[1.0, 1.5], [3.0, 0.0]]])
    y = torch.tensor([[0, 1], [1, -100]])
    other = torch.tensor([[1, 0], [0, 0]])
    expected = F.cross_entropy(out.flatten(0, 1), y.reshape(-1), ignore_index=-100)
    for task, batch in ((SequenceTask(), (None, y)), (SequenceTask(), (None, other, y)),
                        (SequenceTask(target=0), (y, other)), (SequenceTask(), {"x": other, "labels": y})):
        assert torch.allclose(task.loss(out, batch), expected), batch
    half = SequenceTask().loss(out.bfloat16(), (None, y))
    assert half.dtype == torch.float32 and torch.allclose(half, expected, atol=2e-2)


def _value(metric, preds, target):
    metric.update(preds, target)
    return metric.compute()


def test_the_metrics_each_task_builds():
    logits = torch.tensor([[2.0, 0.0], [0.0, 2.0]])
    padded = torch.tensor([0, -100])
    assert _value(ClassificationTask().metrics()["accuracy"], logits, padded) == 0.5  # class ids: no padding
    assert _value(SequenceTask().metrics()["accuracy"], logits, padded) == 1.0  # -100 skipped
    ml = MultiLabelTask(threshold=0.7).metrics()
    assert list(ml) == ["accuracy"]
    # sigmoid: 0.73, 0.62 -> on, off at 0.7; at 0.5 both would be on
    assert _value(ml["accuracy"], torch.tensor([[1.0, 0.5]]), torch.tensor([[1.0, 1.0]])) == 0.5
    assert _value(MultiLabelTask().metrics()["accuracy"], torch.tensor([[1.0, 0.5]]), torch.tensor([[1.0, 1.0]])) == 1.0


class Collect:
    """A stateful metric that is also callable (as torchmetrics' are)."""

    def __init__(self):
        self.seen = []

    def __call__(self, preds, target):
        return 0.0

    def update(self, preds, target):
        self.seen.append(float(preds.sum()))

    def compute(self):
        return sum(self.seen)

    def reset(self):
        self.seen = []


def test_a_users_metric_objects_are_fresh_copies():
    given = Collect()
    task = UserTask(lambda out, y: (out - y).abs().mean(), metrics={"total": given})
    first, second = task.metrics()["total"], task.metrics()["total"]
    first.update(torch.ones(3), None)
    assert first is not given and second is not given and second.seen == [] and given.seen == []
    assert first.compute() == 3.0


def test_a_micro_batch_without_units_adds_nothing():
    w = torch.tensor(2.0, requires_grad=True)
    task = UserTask(lambda out, y: w * 1.5)
    empty = (torch.zeros(0), torch.zeros(0))
    loss = normalized_loss(task, None, empty, total_units=4)
    assert loss.item() == 0.0
    loss.backward()
    assert w.grad.item() == 0.0
    part = normalized_loss(task, None, (torch.zeros(1), torch.zeros(1)), total_units=4)
    assert part.item() == pytest.approx(0.75)


def test_auto_reads_a_named_target():
    cfg = ecotrain.Config.model_validate({"task": {"name": "auto", "target": "tgt"}})
    sample = {"x": torch.zeros(4, 3), "tgt": torch.randn(4)}
    task = build_task(cfg, sample)
    assert type(task) is RegressionTask and task.target == "tgt"
    assert _infer(("a", "b", "c"), None) == "model_loss"  # no tensor to be a target
    assert _infer({"x": torch.zeros(2)}, "gone") == "model_loss"
