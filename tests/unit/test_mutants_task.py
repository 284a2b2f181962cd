"""task.py's calling convention and unit counting, case by case: how `call_model` reads a forward's
signature (keywords, positional arity, *args, **kwargs, DDP/compile wrappers, no signature at all),
the (x, y) shortcut, which counts stay on the device, and how accumulation scales a micro-batch.

Classes are defined inside each test: task.py caches signatures and count owners per class, and a
class made afresh is read afresh."""

import pytest
import torch
from torch import nn

from ecotrain.base.errors import ConfigError
from ecotrain.core.task import (
    ClassificationTask,
    ModelLossTask,
    RegressionTask,
    SequenceTask,
    SupervisedTask,
    UserTask,
    call_model,
    normalized_loss,
    unit_count,
    unit_counts,
)

pytestmark = pytest.mark.unit


def test_a_dict_goes_as_keywords_when_forward_names_every_key():
    class Two(nn.Module):
        def forward(self, a, b=None):
            return ("kw", a, b)

    class One(nn.Module):
        def forward(self, batch):
            return ("whole", batch)

    class Star(nn.Module):
        def forward(self, a, *rest):
            return ("kw", a, rest)

    a, b = torch.zeros(1), torch.ones(1)
    assert call_model(Two(), {"a": a, "b": b}) == ("kw", a, b)  # exactly the named keys
    assert call_model(Two(), {"a": a}) == ("kw", a, None)  # a subset
    whole = {"a": a, "zzz": b}
    assert call_model(One(), whole) == ("whole", whole)  # keys forward does not name: the dict whole
    assert call_model(Two(), whole) == ("kw", whole, None)  # one unnamed key: whole, as the first argument
    assert call_model(Star(), {"a": a}) == ("kw", a, ())  # *rest is no keyword name
    assert call_model(Star(), {"rest": a}) == ("kw", {"rest": a}, ())


def test_a_dict_goes_as_keywords_to_a_forward_with_kwargs_only_then():
    class Kw(nn.Module):
        def forward(self, x=None, **kw):
            return ("kw", x, sorted(kw))

    class Plain(nn.Module):
        def forward(self, x):
            return ("whole", x)

    batch = {"p": torch.zeros(1), "q": torch.ones(1)}
    assert call_model(Kw(), batch) == ("kw", None, ["p", "q"])
    assert call_model(Plain(), batch) == ("whole", batch)


def test_a_tuple_of_tensors_is_spread_when_forward_takes_that_many():
    class One(nn.Module):
        def forward(self, x):
            return ("whole", x)

    class Two(nn.Module):
        def forward(self, a, b):
            return ("spread", a, b)

    class TwoOrThree(nn.Module):
        def forward(self, a, b, c=None):
            return ("spread", a, b, c)

    class Many(nn.Module):
        def forward(self, a, b, *rest):
            return ("spread", a, b, rest)

    x, y, z = torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)
    assert call_model(One(), (x, y)) == ("whole", (x, y))  # one required argument: the tuple whole
    assert call_model(One(), [x, y])[1] == [x, y]
    assert call_model(Two(), (x, y)) == ("spread", x, y)
    assert call_model(TwoOrThree(), (x, y)) == ("spread", x, y, None)
    assert call_model(TwoOrThree(), (x, y, z)) == ("spread", x, y, z)  # up to the most it takes
    assert call_model(Many(), (x, y, z)) == ("spread", x, y, (z,))  # *args: any number past the required
    assert call_model(Many(), [x, y, z, x])[3] == (z, x)


@pytest.mark.parametrize("n", [1, 3])
def test_a_tuple_that_does_not_fit_forward_is_a_config_error_naming_the_model(n):
    class Exactly2(nn.Module):
        def forward(self, a, b):
            return a

    with pytest.raises(ConfigError) as err:
        call_model(Exactly2(), tuple(torch.zeros(1) for _ in range(n)))
    assert "Exactly2" in str(err.value) and f"a tuple of {n} tensors" in str(err.value)  # what the batch held


def test_too_few_tensors_for_the_required_arguments_is_refused():
    class Three(nn.Module):
        def forward(self, a, b, c, d=None):
            return a

    with pytest.raises(ConfigError):
        call_model(Three(), (torch.zeros(1), torch.zeros(1)))
    assert call_model(Three(), (torch.zeros(1), torch.ones(1), torch.zeros(1))).item() == 0.0


def test_anything_else_goes_whole():
    class Two(nn.Module):
        def forward(self, a, b=None):
            return ("whole", a, b)

    words = ["a", "b"]
    assert call_model(Two(), words) == ("whole", words, None)
    assert call_model(Two(), ()) == ("whole", (), None)
    mixed = (torch.zeros(1), "meta")
    assert call_model(Two(), mixed) == ("whole", mixed, None)


def test_wrappers_are_looked_through_to_the_users_forward():
    class Inner(nn.Module):
        def forward(self, x):
            return ("whole", x)

    class Ddp(nn.Module):  # DistributedDataParallel's shape: forward(*inputs, **kwargs), the model as .module
        def __init__(self, m):
            super().__init__()
            self.module = m

        def forward(self, *a, **k):
            return self.module(*a, **k)

    class Compiled(nn.Module):  # torch.compile's OptimizedModule: the model as ._orig_mod
        def __init__(self, m):
            super().__init__()
            self._orig_mod = m

        def forward(self, *a, **k):
            return self._orig_mod(*a, **k)

    x, y = torch.zeros(1), torch.ones(1)
    inner = Inner()
    for wrapped in (Ddp(inner), Compiled(inner), Ddp(Compiled(inner)), Compiled(Ddp(inner))):
        assert call_model(wrapped, (x, y)) == ("whole", (x, y)), type(wrapped).__name__
        batch = {"q": x}
        assert call_model(wrapped, batch) == ("whole", batch)


def test_a_callable_without_a_signature_takes_inputs_as_they_come():
    class NoSignature:
        __signature__ = "unreadable"  # inspect.signature raises TypeError

        def __call__(self, *a, **k):
            return a, sorted(k)

    x, y = torch.zeros(1), torch.ones(1)
    assert call_model(NoSignature(), (x, y)) == ((x, y), [])
    assert call_model(NoSignature(), {"kwargs": x, "args": y}) == ((), ["args", "kwargs"])


def test_the_signature_is_read_once_per_class_and_each_class_its_own():
    class A(nn.Module):
        def forward(self, x):
            return "A"

    class B(nn.Module):
        def forward(self, x, y):
            return "B"

    t = (torch.zeros(1), torch.ones(1))
    for _ in range(2):
        assert call_model(A(), t) == "A" and call_model(B(), t) == "B"


def test_plain_functions_each_have_their_own_signature():
    # two plain-function models: the cache once keyed on type(inner), so the second took the first's arity
    def one(x):
        return "one"

    def two(x, y):
        return "two"

    t = (torch.zeros(1), torch.ones(1))
    for _ in range(2):
        assert call_model(one, t) == "one" and call_model(two, t) == "two"


def test_the_signature_is_read_once_per_forward_function(monkeypatch):
    """call_model runs at every step: a forward's signature is read once, for every instance of its class
    and for a plain function, not at each call (the cache keys on the function, not the bound method)."""
    import inspect

    reads = []
    real = inspect.signature
    monkeypatch.setattr(inspect, "signature", lambda fn, *a, **k: reads.append(fn) or real(fn, *a, **k))

    class Net(nn.Module):
        def forward(self, x, y):
            return "net"

    def plain(x, y):
        return "plain"

    t = (torch.zeros(1), torch.ones(1))
    for _ in range(3):
        assert call_model(Net(), t) == "net" and call_model(plain, t) == "plain"
    assert len(reads) == 2, reads


def test_a_callable_that_cannot_be_weakly_referenced_is_read_each_time():
    """A forward the cache cannot hold (no __weakref__ slot, like a builtin): its signature is read at each
    call, and the call works."""
    class Slotted:
        __slots__ = ()

        def __call__(self, a, b):
            return ("both", a, b)

    x, y = torch.zeros(1), torch.ones(1)
    for _ in range(2):
        assert call_model(Slotted(), (x, y)) == ("both", x, y)


def test_an_empty_tuple_batch_has_no_target():
    with pytest.raises(ConfigError):
        SupervisedTask().targets(())
    with pytest.raises(ConfigError):
        SupervisedTask().targets([])


def test_inputs_before_a_named_target():
    x, y, z = torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)
    args, kwargs = SupervisedTask(target=1).inputs((x, y))
    assert len(args) == 1 and args[0] is x and kwargs == {}
    nested = (x, z)
    args, kwargs = SupervisedTask(target=2).inputs((nested, z, y))  # a nested first item, target at 2
    assert len(args) == 1 and args[0] is z and kwargs == {}
    args, kwargs = SupervisedTask(target=1).inputs((nested, y))  # nested inputs: call_model's rule
    assert args == (nested,) and kwargs is None


def test_an_xy_pair_calls_the_model_on_x_whatever_y_is():
    seen = []

    class Model(nn.Module):
        def forward(self, *a, **k):
            seen.append((a, k))
            return torch.zeros(1)

    x, model = torch.ones(2), Model()
    SupervisedTask().forward(model, (x, ["cat", "dog"]))  # labels that are no tensor: still model(x)
    assert len(seen[-1][0]) == 1 and seen[-1][0][0] is x and seen[-1][1] == {}
    SupervisedTask().forward(model, [x, ["cat", "dog"]])  # a list: inspected (its last tensor is x itself)
    assert seen[-1] == ((), {})


def test_regression_loss_is_in_the_outputs_precision():
    task = RegressionTask("mse")
    out = torch.tensor([1.5, 2.0], dtype=torch.float32)
    y = torch.tensor([1.0, 2.0], dtype=torch.float64)
    loss = task.loss(out, (None, y))
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(0.125)


def test_a_callable_metric_without_update_is_used_as_it_is():
    class Scorer:  # callable, no update: a function with state, wrapped as it is, never copied
        def __init__(self):
            self.calls = 0

        def __call__(self, preds, target):
            self.calls += 1
            return 1.0

    given = Scorer()
    metric = UserTask(lambda o, y: o.sum(), metrics={"s": given}).metrics()["s"]
    metric.update(torch.ones(2), torch.ones(2))
    assert given.calls == 1


def test_counts_stay_on_the_device_where_the_task_counts_there():
    y = torch.tensor([[1, -100, 2], [3, 4, -100]])
    n = unit_count(SequenceTask(), (None, y))
    assert isinstance(n, torch.Tensor) and int(n) == 4
    assert unit_count(SupervisedTask(), (None, y)) == 2


def test_count_units_is_used_only_where_it_is_as_derived_as_units():
    class Tokens(SupervisedTask):
        def units(self, batch):
            return 7

        def count_units(self, batch):
            return torch.tensor(7)

    class RedefinesUnits(Tokens):
        def units(self, batch):
            return 5

    class RedefinesCount(Tokens):
        def count_units(self, batch):
            return torch.tensor(9)

    class UnitsOnly(SupervisedTask):
        def units(self, batch):
            return 3

    assert isinstance(unit_count(Tokens(), None), torch.Tensor)
    assert unit_count(RedefinesUnits(), None) == 5
    assert int(unit_count(RedefinesCount(), None)) == 9
    assert unit_count(UnitsOnly(), None) == 3
    assert unit_counts(RedefinesUnits(), [None, None]) == [5, 5]


def test_unit_counts_reads_device_counts_as_numbers_in_their_places():
    task = ModelLossTask(tokens=True)
    labelled = {"labels": torch.tensor([[1, -100, 2]])}  # 2 tokens, a tensor count
    plain = {"x": torch.zeros(4, 1)}  # no labels: 4 samples, an int count
    counts = unit_counts(task, [labelled, plain, {"labels": torch.tensor([[5, 6, 7]])}])
    assert counts == [2, 4, 3] and all(type(c) is int for c in counts)
    assert unit_counts(task, [plain, plain]) == [4, 4]


def test_a_given_unit_count_scales_the_loss_not_the_batchs_own():
    task = UserTask(lambda out, y: torch.tensor(2.0))
    batch = (torch.zeros(4), torch.zeros(4))
    assert normalized_loss(task, None, batch, total_units=8).item() == pytest.approx(1.0)
    assert normalized_loss(task, None, batch, total_units=8, units=2).item() == pytest.approx(0.5)
    assert normalized_loss(task, None, batch, total_units=None, units=2).item() == 2.0


@pytest.mark.parametrize("base", [ClassificationTask, SequenceTask])
def test_an_xy_pairs_loss_takes_y_without_inspecting_the_batch(base):
    class Counted(base):  # the loop's plain step: an (x, y) pair is not inspected
        calls = 0

        def targets(self, batch):
            type(self).calls += 1
            return super().targets(batch)

    task = Counted()
    if base is SequenceTask:
        out, y = torch.zeros(1, 2, 3), torch.tensor([[0, 2]])
    else:
        out, y = torch.zeros(2, 3), torch.tensor([0, 2])
    assert task.loss(out, (None, y)).item() == pytest.approx(1.0986, abs=1e-4)
    assert Counted.calls == 0
    task.loss(out, [None, y])  # a list is inspected
    assert Counted.calls == 1
