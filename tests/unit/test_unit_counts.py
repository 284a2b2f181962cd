"""Token counts leave the device once per step (task.unit_counts), not once per micro-batch, and
evaluation reads its unit count with the loss; accumulation stays exactly one big batch.

A host read is counted as a call of `item`, `tolist` or a Python number conversion of a tensor,
seen through torch's public `TorchFunctionMode` (on CPU there is no sync to time)."""

from types import SimpleNamespace

import pytest
import torch
from torch.overrides import TorchFunctionMode

from ecotrain.data.sources import ArraySource
from ecotrain.data.text import IGNORE
from ecotrain.core.distributed import Dist
from ecotrain.core.loop import backward_micro_batches, evaluate
from ecotrain.methods import Method, Methods
from ecotrain.models.charlm import CharLM
from ecotrain.core.objective import Objective
from ecotrain.core.precision import Precision
from ecotrain.core.task import LanguageModelTask, ModelLossTask, SequenceTask, unit_count, unit_counts

READS = {"item", "tolist", "numpy", "__int__", "__float__", "__bool__", "__index__"}


class HostReads(TorchFunctionMode):
    """Counts the tensor -> Python reads made while it is active (a device->host sync on a GPU)."""

    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in READS:
            self.reads.append(name)
        return func(*args, **(kwargs or {}))


class CountingLM(LanguageModelTask):
    """A real language-model task that counts which unit call the loop makes."""

    def __init__(self):
        super().__init__()
        self.calls = {"units": 0, "count_units": 0}

    def units(self, batch) -> int:
        self.calls["units"] += 1
        return super().units(batch)

    def count_units(self, batch):
        self.calls["count_units"] += 1
        return super().count_units(batch)


class Penalty(Method):
    """A loss term (a mean over the tokens that count), so the Objective scales it by the piece's share."""

    name = "penalty"

    def loss_terms(self, batch, outputs, state):
        return {"out_l2": (outputs ** 2).mean(-1)[batch[1] != IGNORE].mean() * 0.01}


def _lm_batch(n=10, t=12):
    torch.manual_seed(0)
    x, y = torch.randint(0, 40, (n, t)), torch.randint(0, 40, (n, t))
    y[0, 3:] = IGNORE
    y[3, 1:] = IGNORE
    y[7, 5:] = IGNORE  # uneven real lengths, so the pieces' counts differ
    return x, y


def _step(task, batch, accumulate, terms=False):
    torch.manual_seed(1)
    model = CharLM(vocab=40, max_len=12, d_model=16, n_layers=1, n_heads=2).double()
    state = SimpleNamespace(model=model, precision=Precision("fp32", torch.device("cpu")), dist=Dist(),
                            objective=Objective(task, Methods([Penalty()] if terms else [])), task=task,
                            device=torch.device("cpu"))
    with HostReads() as mode:
        loss = backward_micro_batches(state, batch, accumulate)
    return [p.grad.clone() for p in model.parameters()], loss, state.loss_parts, mode.reads


@pytest.mark.parametrize("terms", [False, True])
def test_one_host_read_per_step_for_all_token_counts(terms):
    task = CountingLM()
    _, _, _, reads = _step(task, _lm_batch(), 4, terms)
    assert reads == ["tolist"]  # before: an int() per piece in the total, again per piece in the loss (and share)
    assert task.calls == {"units": 0, "count_units": 4}


@pytest.mark.parametrize("terms", [False, True])
def test_accumulation_still_one_big_batch(terms):
    batch = _lm_batch()
    big, big_loss, big_parts, _ = _step(LanguageModelTask(), batch, 1, terms)
    acc, acc_loss, acc_parts, _ = _step(LanguageModelTask(), batch, 4, terms)
    for a, b in zip(big, acc):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)
    assert torch.allclose(big_loss, acc_loss, rtol=1e-10)
    if terms:
        for k in big_parts:
            assert torch.allclose(big_parts[k], acc_parts[k], rtol=1e-10), k


class UnitsOnly:
    """A user's task with `units` alone (no count_units): the protocol as it was."""

    name = "units_only"

    def __init__(self):
        self.inner, self.units_calls = SequenceTask(), 0

    def forward(self, model, batch):
        return model(batch[0])

    def loss(self, outputs, batch, reduction="mean"):
        return self.inner.loss(outputs, batch, reduction)

    def units(self, batch) -> int:
        self.units_calls += 1
        return int((batch[1] != IGNORE).sum())

    def metrics(self):
        return {}


def test_a_task_with_units_alone_accumulates_exactly():
    batch = _lm_batch()
    big, big_loss, _, _ = _step(UnitsOnly(), batch, 1)
    task = UnitsOnly()
    acc, acc_loss, _, _ = _step(task, batch, 4)
    assert task.units_calls == 4  # once per piece, for the total; the pieces reuse it
    for a, b in zip(big, acc):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)
    assert torch.allclose(big_loss, acc_loss, rtol=1e-10)


def test_a_subclass_redefining_units_alone_is_counted_by_its_units():
    class PerSequence(LanguageModelTask):  # an inherited count_units would disagree with this
        def units(self, batch) -> int:
            return len(batch[1])

    x, y = _lm_batch()
    pieces = [(x[:4], y[:4]), (x[4:], y[4:])]
    assert unit_counts(PerSequence(), pieces) == [4, 6]
    counts = unit_counts(LanguageModelTask(), pieces)
    assert counts == [LanguageModelTask().units(p) for p in pieces] and all(type(n) is int for n in counts)
    assert isinstance(unit_count(LanguageModelTask(), pieces[0]), torch.Tensor)


def test_model_loss_counts_tokens_on_device_and_samples_as_ints():
    labels = torch.tensor([[1, IGNORE, 2], [IGNORE, IGNORE, 3]])
    batch = {"input_ids": torch.zeros(2, 3, dtype=torch.long), "labels": labels}
    assert unit_counts(ModelLossTask(tokens=True), [batch, batch]) == [3, 3]
    assert unit_counts(ModelLossTask(), [batch, batch]) == [2, 2]
    loss = torch.tensor(0.5)
    assert ModelLossTask(tokens=True).loss({"loss": loss}, batch, "sum").item() == 1.5


def _eval_reads(n_batches):
    torch.manual_seed(1)
    model = CharLM(vocab=40, max_len=12, d_model=16, n_layers=1, n_heads=2)
    x, y = _lm_batch(n=4 * n_batches)
    with HostReads() as mode:
        record = evaluate(model, ArraySource(x, y), LanguageModelTask(), 4, torch.device("cpu"))
    return record, mode.reads


def test_evaluation_reads_its_units_once_whatever_the_number_of_batches():
    small, reads_small = _eval_reads(2)
    big, reads_big = _eval_reads(5)
    assert len(reads_small) == len(reads_big)  # before: one more int() per batch
    x, y = _lm_batch(n=20)
    torch.manual_seed(1)
    model = CharLM(vocab=40, max_len=12, d_model=16, n_layers=1, n_heads=2).eval()
    with torch.no_grad():
        expected = LanguageModelTask().loss(model(x), (x, y)).item()  # one big batch's mean per token
    assert big["val_loss"] == pytest.approx(expected, rel=1e-5)
