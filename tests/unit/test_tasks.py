"""task.py and metrics.py: accumulation exactly one big batch, for every task and batch shape;
metrics exact over a split whatever the batch size; the task read off the data."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import accuracy_score, f1_score, mean_absolute_error, mean_squared_error, r2_score
from torch import nn

import ecotrain
from ecotrain.core.batch import split
from ecotrain.data import ArraySource
from ecotrain.core.distributed import Dist
from ecotrain.base.errors import ConfigError
from ecotrain.core.loop import backward_micro_batches, evaluate
from ecotrain.methods import Methods
from ecotrain.core.metrics import IGNORE, Accuracy, F1Score
from ecotrain.core.objective import Objective
from ecotrain.core.precision import Precision
from ecotrain.core.task import (
    ClassificationTask,
    LanguageModelTask,
    ModelLossTask,
    MultiLabelTask,
    RegressionTask,
    SequenceTask,
    UserTask,
    build_task,
    normalized_loss,
)

pytestmark = pytest.mark.unit

CPU = torch.device("cpu")
D = torch.float64


# -- small models -------------------------------------------------------------------------------
class TwoInputs(nn.Module):
    def __init__(self, d1=4, d2=3, classes=5):
        super().__init__()
        self.a, self.b = nn.Linear(d1, classes), nn.Linear(d2, classes)

    def forward(self, x1, x2):
        return self.a(x1) * torch.tanh(self.b(x2))


class Regressor(nn.Module):
    """One output per sample, [b, 1], against a target [b] (the task reshapes)."""

    def __init__(self, d=4):
        super().__init__()
        self.lin = nn.Linear(d, 1)

    def forward(self, x):
        return self.lin(x) ** 2 + self.lin(x)


class Tagger(nn.Module):
    def __init__(self, vocab=9, classes=4):
        super().__init__()
        self.emb, self.head = nn.Embedding(vocab, 6), nn.Linear(6, classes)

    def forward(self, tokens):
        return self.head(torch.tanh(self.emb(tokens)))


class TinyHF(nn.Module):
    """A Hugging Face model in miniature: `forward(input_ids, labels)` returns `.loss` and `.logits`;
    token labels [b, T] (-100 skipped) or one label per sequence [b]."""

    def __init__(self, vocab=9):
        super().__init__()
        self.emb, self.head = nn.Embedding(vocab, 6), nn.Linear(6, vocab)

    def forward(self, input_ids, labels):
        logits = self.head(torch.tanh(self.emb(input_ids)))
        if labels.ndim == 1:  # sequence classification on the mean of the positions
            logits = logits.mean(1)
            return SimpleNamespace(loss=F.cross_entropy(logits, labels), logits=logits)
        return SimpleNamespace(loss=F.cross_entropy(logits.flatten(0, 1), labels.reshape(-1)), logits=logits)


def _padded_tags(n, t, classes, gen, lengths):
    y = torch.randint(0, classes, (n, t), generator=gen)
    for i, k in enumerate(lengths):
        y[i, k:] = IGNORE
    return y


# -- accumulation: one big batch == the weighted micro-batches ------------------------------------
def _grads(model, backward):
    model.zero_grad(set_to_none=True)
    backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def _assert_accumulation_exact(task, model, batch, n_micro=3):
    pieces = split(batch, n_micro)
    assert len(pieces) == n_micro
    total = sum(task.units(p) for p in pieces)
    assert total == task.units(batch)  # units add up over the pieces
    big = _grads(model, lambda: task.loss(task.forward(model, batch), batch).backward())

    def accumulate():
        for p in pieces:
            normalized_loss(task, task.forward(model, p), p, total).backward()
    acc = _grads(model, accumulate)

    def unweighted():  # a mean of the micro-batch means: what the weighting must beat
        for p in pieces:
            (task.loss(task.forward(model, p), p) / len(pieces)).backward()
    naive = _grads(model, unweighted)
    assert big.abs().max() > 1e-3
    assert (big - acc).abs().max() < 1e-10
    assert (big - naive).abs().max() > 1e-6  # the pieces differ in units, so the test can tell


def test_accumulation_exact_classification_two_inputs():
    gen = torch.Generator().manual_seed(0)
    n = 11
    batch = (torch.randn(n, 4, generator=gen, dtype=D), torch.randn(n, 3, generator=gen, dtype=D),
             torch.randint(0, 5, (n,), generator=gen))
    torch.manual_seed(0)
    _assert_accumulation_exact(ClassificationTask(label_smoothing=0.1), TwoInputs().double(), batch)


@pytest.mark.parametrize("loss", ["mse", "huber"])
def test_accumulation_exact_regression_dict_batch(loss):
    gen = torch.Generator().manual_seed(1)
    n = 11
    batch = {"x": torch.randn(n, 4, generator=gen, dtype=D), "target": 2 * torch.randn(n, generator=gen, dtype=D),
             "ids": [f"row{i}" for i in range(n)]}
    torch.manual_seed(1)
    _assert_accumulation_exact(RegressionTask(loss, target="target"), Regressor().double(), batch)


def test_accumulation_exact_sequence_with_padding():
    gen = torch.Generator().manual_seed(2)
    n, t = 11, 6
    lengths = [6, 1, 2, 1, 5, 6, 6, 3, 0, 4, 2]  # the pieces hold 10, 20 and 6 tokens
    batch = (torch.randint(0, 9, (n, t), generator=gen), _padded_tags(n, t, 4, gen, lengths))
    torch.manual_seed(2)
    task = SequenceTask()
    assert task.units(batch) == sum(lengths)
    _assert_accumulation_exact(task, Tagger().double(), batch)


def test_accumulation_exact_multilabel():
    gen = torch.Generator().manual_seed(3)
    n = 10
    batch = (torch.randn(n, 4, generator=gen, dtype=D), (torch.rand(n, 3, generator=gen) > 0.5).to(D))
    torch.manual_seed(3)
    _assert_accumulation_exact(MultiLabelTask(), nn.Linear(4, 3).double(), batch)


@pytest.mark.parametrize("tokens", [True, False])
def test_accumulation_exact_model_loss(tokens):
    gen = torch.Generator().manual_seed(4)
    n, t = 11, 5
    ids = torch.randint(0, 9, (n, t), generator=gen)
    labels = (_padded_tags(n, t, 9, gen, [5, 1, 1, 2, 5, 4, 5, 5, 1, 3, 0]) if tokens
              else torch.randint(0, 9, (n,), generator=gen))
    torch.manual_seed(4)
    task = ModelLossTask(tokens=tokens)
    batch = {"input_ids": ids, "labels": labels}
    assert task.units(batch) == (int((labels != IGNORE).sum()) if tokens else n)
    _assert_accumulation_exact(task, TinyHF().double(), batch)


def test_micro_batch_of_padding_only_adds_nothing():
    """A micro-batch whose targets are all padding has a 0/0 mean; its share of the step is zero,
    and must not turn the step's loss into NaN (the divergence guard would stop the run)."""
    gen = torch.Generator().manual_seed(5)
    n, t = 6, 4
    batch = (torch.randint(0, 9, (n, t), generator=gen), _padded_tags(n, t, 4, gen, [4, 2, 3, 1, 0, 0]))
    torch.manual_seed(5)
    model, task = Tagger().double(), SequenceTask()
    pieces = split(batch, 3)
    total = sum(task.units(p) for p in pieces)
    assert task.units(pieces[2]) == 0
    losses = [normalized_loss(task, task.forward(model, p), p, total).item() for p in pieces]
    big = task.loss(task.forward(model, batch), batch).item()
    assert all(np.isfinite(losses)), losses
    assert abs(sum(losses) - big) < 1e-12


def test_backward_micro_batches_dict_batch_with_metadata():
    """The loop's own accumulation over a dict batch that carries per-sample strings."""
    gen = torch.Generator().manual_seed(6)
    n = 10
    batch = {"x": torch.randn(n, 4, generator=gen, dtype=D), "target": torch.randn(n, generator=gen, dtype=D),
             "ids": [f"r{i}" for i in range(n)]}
    torch.manual_seed(6)
    model, task = Regressor().double(), RegressionTask(target="target")
    state = SimpleNamespace(model=model, precision=Precision("fp32", CPU), dist=Dist(), task=task,
                            objective=Objective(task, Methods([])))
    results = []
    for n_micro in (1, 4):
        model.zero_grad(set_to_none=True)
        loss = backward_micro_batches(state, batch, n_micro)
        results.append((float(loss), torch.cat([p.grad.reshape(-1) for p in model.parameters()])))
    (loss1, g1), (loss4, g4) = results
    assert abs(loss1 - loss4) < 1e-10 and (g1 - g4).abs().max() < 1e-10 and g1.abs().max() > 1e-3


@pytest.mark.parametrize("task, out, batch", [
    (ClassificationTask(), torch.randn(4, 3, dtype=D), (torch.zeros(4, 2), torch.tensor([0, 1, 2, 1]))),
    (RegressionTask(), torch.randn(4, dtype=D), (torch.zeros(4, 2), torch.randn(4, dtype=D))),
    (MultiLabelTask(), torch.randn(4, 3, dtype=D), (torch.zeros(4, 2), torch.ones(4, 3, dtype=D))),
    (SequenceTask(), torch.randn(4, 2, 3, dtype=D), (torch.zeros(4, 2), torch.tensor([[0, 1]] * 4))),
], ids=["classification", "regression", "multilabel", "sequence"])
def test_float64_outputs_keep_a_float64_loss(task, out, batch):
    """The fp32 cast is for half-precision logits under autocast; a float64 model keeps float64."""
    assert task.loss(out, batch).dtype == torch.float64


# -- metrics over a split -------------------------------------------------------------------------
def _regression_data(n=51):
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(n, 3, generator=gen)
    w = torch.tensor([1.5, -2.0, 0.5])
    y = x @ w + 0.4 * torch.randn(n, generator=gen) + 3.0
    torch.manual_seed(7)
    model = Regressor(3)
    with torch.no_grad():
        model.lin.weight.copy_(0.3 * w)
        model.lin.bias.fill_(1.0)
    return x, y, model


class DictSource:
    """A split whose batches are dicts carrying per-sample ids (evaluate reads `take_range`)."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def take_range(self, start, stop):
        return {"x": self.x[start:stop], "target": self.y[start:stop], "ids": list(range(start, stop))}


def test_regression_metrics_exact_whatever_the_batch_size():
    x, y, model = _regression_data()
    with torch.no_grad():
        preds = model(x).reshape(-1).double().numpy()
    truth = y.double().numpy()
    want = {"val_r2": r2_score(truth, preds), "val_mae": mean_absolute_error(truth, preds),
            "val_mse": mean_squared_error(truth, preds)}
    assert 0.1 < want["val_r2"] < 0.95
    records = [evaluate(model, ArraySource(x, y), RegressionTask(), bs, CPU) for bs in (7, 1000)]
    records.append(evaluate(model, DictSource(x, y), RegressionTask(target="target"), 7, CPU))
    for rec in records:
        assert set(rec) == {"val_loss", "val_mse", "val_mae", "val_r2"}
        for k, v in want.items():
            assert rec[k] == pytest.approx(v, rel=1e-6, abs=1e-9), k
        assert rec["val_loss"] == pytest.approx(want["val_mse"], rel=1e-6)  # mse loss: a mean per sample
    # what exactness rules out: R2 averaged over batches is not the split's R2
    batch_r2 = np.mean([r2_score(truth[i:i + 7], preds[i:i + 7]) for i in range(0, len(truth), 7)])
    assert abs(batch_r2 - want["val_r2"]) > 1e-3
    assert model.training  # evaluate restores the mode it found


def test_f1_and_accuracy_exact_over_a_split():
    gen = torch.Generator().manual_seed(8)
    n, classes = 53, 5
    x = torch.randn(n, 6, generator=gen)
    y = torch.randint(0, 4, (n,), generator=gen)  # class 4 never a target...
    torch.manual_seed(8)
    model = nn.Linear(6, classes)
    with torch.no_grad():
        model.bias[4] = -100.0  # ...nor predicted: macro F1 leaves it out, as sklearn does
    with torch.no_grad():
        logits = model(x)
    pred = logits.argmax(1).numpy()
    assert len(set(pred.tolist())) >= 3 and 4 not in pred
    want_f1 = f1_score(y.numpy(), pred, average="macro")
    want_acc = accuracy_score(y.numpy(), pred)
    for bs in (7, 1000):
        rec = evaluate(model, ArraySource(x, y), ClassificationTask(num_classes=classes), bs, CPU)
        assert rec["val_f1"] == pytest.approx(want_f1, abs=1e-12)
        assert rec["val_accuracy"] == pytest.approx(want_acc, abs=1e-12)
        assert rec["val_loss"] == pytest.approx(float(F.cross_entropy(logits, y)), rel=1e-5)
    batch_f1 = np.mean([f1_score(y.numpy()[i:i + 7], pred[i:i + 7], average="macro") for i in range(0, n, 7)])
    assert abs(batch_f1 - want_f1) > 1e-3


def test_f1_skips_padding():
    m = F1Score(3)
    m.update(torch.eye(3)[[0, 1, 2, 2]].unsqueeze(0), torch.tensor([[0, 1, 1, IGNORE]]))
    assert m.compute() == pytest.approx(f1_score([0, 1, 1], [0, 1, 2], average="macro"))


def test_accuracy_skips_padding_tokens():
    m = Accuracy()
    preds = torch.tensor([[[0.0, 1.0], [1.0, 0.0]], [[1.0, 0.0], [1.0, 0.0]]])  # argmax [[1, 0], [0, 0]]
    m.update(preds, torch.tensor([[1, IGNORE], [1, IGNORE]]))
    assert m.compute() == 0.5  # 1 right of the 2 real tokens (counting padding would give 0.25)
    m.reset()
    assert m.compute() != m.compute()  # nothing seen: NaN


def test_sequence_evaluate_counts_real_tokens_only():
    gen = torch.Generator().manual_seed(9)
    n, t = 13, 5
    x = torch.randint(0, 9, (n, t), generator=gen)
    lengths = torch.randint(0, t + 1, (n,), generator=gen).tolist()
    y = _padded_tags(n, t, 4, gen, lengths)
    torch.manual_seed(9)
    model = Tagger()
    with torch.no_grad():
        out = model(x)
    keep = y != IGNORE
    want_acc = ((out.argmax(-1) == y) & keep).sum().item() / keep.sum().item()
    want_loss = float(F.cross_entropy(out.flatten(0, 1), y.reshape(-1)))
    assert keep.sum() < keep.numel()
    for bs in (3, 1000):
        rec = evaluate(model, ArraySource(x, y), SequenceTask(), bs, CPU)
        assert rec["val_accuracy"] == pytest.approx(want_acc, abs=1e-12)
        assert rec["val_loss"] == pytest.approx(want_loss, rel=1e-6)


# -- user tasks ----------------------------------------------------------------------------------
class SumAbsError:
    """A stateful metric: the split's total absolute error (doubles if its state were shared)."""

    def __init__(self):
        self.reset()

    def update(self, preds, target):
        self.total += float((preds.reshape(-1) - target).abs().sum())
        self.seen += len(target)

    def compute(self):
        return self.total

    def reset(self):
        self.total, self.seen = 0.0, 0


def _mae(out, y):
    return (out.reshape(-1) - y).abs().mean()


def test_user_task_function_and_stateful_metrics():
    x, y, model = _regression_data()
    with torch.no_grad():
        preds = model(x).reshape(-1)
    stateful = SumAbsError()
    task = UserTask(lambda out, t: ((out.reshape(-1) - t) ** 2).mean(), {"mae": _mae, "sae": stateful})
    first = evaluate(model, ArraySource(x, y), task, 7, CPU)
    second = evaluate(model, ArraySource(x, y), task, 7, CPU)
    assert first == second
    assert first["val_sae"] == pytest.approx(float((preds - y).abs().sum()), rel=1e-6)
    assert first["val_mae"] == pytest.approx(mean_absolute_error(y.numpy(), preds.numpy()), rel=1e-6)
    assert first["val_loss"] == pytest.approx(mean_squared_error(y.numpy(), preds.numpy()), rel=1e-6)
    assert stateful.seen == 0  # each evaluation works on its own copy
    whole = evaluate(model, ArraySource(x, y), task, 1000, CPU)
    assert whole["val_mae"] == pytest.approx(first["val_mae"], rel=1e-6)


# -- the task read off the data ---------------------------------------------------------------------
def _cfg(**task):
    return ecotrain.Config.model_validate({"task": task}) if task else ecotrain.Config()


@pytest.mark.parametrize("sample, kind", [
    ({"input_ids": torch.zeros(2, 8, dtype=torch.long), "labels": torch.zeros(2, 8, dtype=torch.long)}, ModelLossTask),
    ({"input_ids": torch.zeros(2, 8, dtype=torch.long), "attention_mask": torch.ones(2, 8)}, ModelLossTask),
    ((torch.zeros(4, 3), torch.randn(4)), RegressionTask),
    ((torch.zeros(4, 3), torch.randn(4, 2)), RegressionTask),
    ([torch.zeros(4, 3), torch.tensor([0, 1, 2, 1])], ClassificationTask),
    ((torch.zeros(4, 3), torch.zeros(4, 3), torch.tensor([0, 1, 2, 1]), ["a"] * 4), ClassificationTask),
    ((torch.zeros(4, 7, dtype=torch.long), torch.zeros(4, 7, dtype=torch.long)), SequenceTask),
    ({"x": torch.zeros(4, 3), "y": torch.tensor([0, 1, 0, 1])}, ClassificationTask),
    (None, ClassificationTask),
], ids=["hf-labels", "hf-no-labels", "float-y", "float-y-2d", "int-y-list", "two-inputs-meta", "int-bT",
        "dict-y", "no-sample"])
def test_build_task_auto(sample, kind):
    task = build_task(_cfg(), sample)
    assert type(task) is kind


def test_build_task_auto_with_a_named_target():
    sample = {"x": torch.zeros(4, 3), "target": torch.randn(4), "ids": ["a"] * 4}
    task = build_task(_cfg(target="target"), sample)
    assert type(task) is RegressionTask and task.target == "target" and task.kind == "mse"
    assert task.targets(sample) is sample["target"]
    assert type(build_task(_cfg(), sample, lm=True)) is LanguageModelTask


def test_build_task_explicit_names_win_over_the_data():
    float_pair = (torch.zeros(4, 3), torch.rand(4, 2))
    hf = {"input_ids": torch.zeros(2, 8, dtype=torch.long), "labels": torch.zeros(2, dtype=torch.long)}
    ml = build_task(_cfg(name="multilabel", threshold=0.3), float_pair)
    assert type(ml) is MultiLabelTask and ml.threshold == 0.3
    reg = build_task(_cfg(name="regression", loss="huber"), (torch.zeros(4, 3), torch.tensor([0, 1, 2, 3])))
    assert type(reg) is RegressionTask and reg.kind == "huber"
    cls = build_task(ecotrain.Config.model_validate({"task": {"name": "classification", "target": "labels"},
                                                      "loop": {"label_smoothing": 0.1}}), hf, num_classes=3)
    assert type(cls) is ClassificationTask and cls.label_smoothing == 0.1 and cls.target == "labels"
    assert set(cls.metrics()) == {"accuracy", "f1"}
    seq = build_task(_cfg(name="sequence", target="tags"), {"tokens": torch.zeros(2, 3, dtype=torch.long)})
    assert type(seq) is SequenceTask and seq.target == "tags"
    assert type(build_task(_cfg(name="model_loss"), float_pair)) is ModelLossTask
    assert type(build_task(_cfg(name="language_model"), float_pair)) is LanguageModelTask


# -- model_loss errors -----------------------------------------------------------------------------
def test_model_loss_reductions():
    task = ModelLossTask()
    batch = {"input_ids": torch.zeros(3, 4, dtype=torch.long), "labels": torch.zeros(3, dtype=torch.long)}
    out = SimpleNamespace(loss=torch.tensor(0.25), logits=torch.zeros(3, 2))
    assert float(task.loss(out, batch)) == 0.25
    assert float(task.loss(out, batch, "sum")) == 0.75  # the mean times the batch's samples
    with pytest.raises(ConfigError) as err:
        task.loss(out, batch, "none")
    msg = str(err.value)
    assert "\n" not in msg and "model_loss" in msg and msg == msg.strip()
    with pytest.raises(ConfigError) as err:
        task.loss(SimpleNamespace(logits=torch.zeros(3, 2)), batch)
    assert "\n" not in str(err.value) and "without a loss" in str(err.value)


# -- what the mutation run (tests/mutants.py) found untested ----------------------------------------
def test_logits_of_every_output_shape_and_the_one_line_refusal():
    from ecotrain.core.task import logits_of

    t = torch.randn(2, 3)
    assert logits_of(t) is t
    assert logits_of({"logits": t, "loss": torch.tensor(1.0)}) is t  # a dict ModelOutput
    assert logits_of(SimpleNamespace(logits=t, loss=None)) is t  # an attribute ModelOutput
    assert logits_of((t, torch.zeros(1))) is t and logits_of([t]) is t  # the first of a tuple
    for bad in ({"scores": t}, SimpleNamespace(logits=None), (), ("text",)):
        with pytest.raises(ConfigError, match=rf"^task: the model returned {type(bad).__name__}, not a tensor of "
                                              r"predictions \(nor anything with .logits\); return a tensor, or use "
                                              "task.name=model_loss$"):
            logits_of(bad)
    y = torch.tensor([0, 2])
    want = F.cross_entropy(t, y)
    assert ClassificationTask().loss(SimpleNamespace(logits=t), (None, y)).item() == pytest.approx(want.item())


def test_model_loss_reads_a_dict_an_attribute_or_a_scalar():
    task = ModelLossTask()
    batch = {"x": torch.zeros(4, 2), "labels": torch.tensor([1, IGNORE, 2, IGNORE])}
    assert task.loss({"loss": torch.tensor(0.5)}, batch).item() == 0.5
    assert task.loss(torch.tensor(0.75), batch).item() == 0.75
    assert task.units(batch) == 4 and ModelLossTask(tokens=True).units(batch) == 2  # tokens: labels not -100
    assert task.targets(batch) is batch["labels"] and task.targets((torch.zeros(2),)) is None
    with pytest.raises(ConfigError, match=r"^task=model_loss: the model returned Tensor without a loss; pass the labels "
                                          r"in the batch \(Hugging Face: 'labels'\), or pick another task.name$"):
        task.loss(torch.zeros(3), batch)  # a tensor that is not a scalar is not a loss
    with pytest.raises(ConfigError, match=r"^task=model_loss: per-sample losses are not available \(the model reduces "
                                          r"its own loss\); this method needs a task whose loss ecotrain computes$"):
        task.loss(torch.tensor(0.5), batch, "none")
    assert task.forward(lambda **kw: sorted(kw), batch) == ["labels", "x"]  # model(**batch)


# -- the survivors of `make mutants MUTANTS=task`, each pinned by a test ------------------------------
def test_language_model_metrics_are_accuracy_and_bits_per_char_over_real_tokens():
    from ecotrain.core.loop import evaluate
    from ecotrain.data import ArraySource
    from ecotrain.core.task import LanguageModelTask

    torch.manual_seed(0)
    x = torch.randint(0, 7, (6, 5))
    y = torch.randint(0, 7, (6, 5))
    y[0, 2:] = -100
    y[4, 1:] = -100
    model = torch.nn.Sequential(torch.nn.Embedding(7, 7))
    got = evaluate(model, ArraySource(x, y), LanguageModelTask(), 4, torch.device("cpu"))
    out = model(x).float()
    keep = y != -100
    nats = torch.nn.functional.cross_entropy(out[keep], y[keep], reduction="sum")
    assert set(got) == {"val_loss", "val_accuracy", "val_bits_per_char", "val_perplexity"}
    assert got["val_bits_per_char"] == pytest.approx(float(nats) / math.log(2) / int(keep.sum()), rel=1e-6)
    assert got["val_accuracy"] == pytest.approx(float((out.argmax(-1)[keep] == y[keep]).float().mean()), rel=1e-6)


def test_model_loss_task_forwards_the_batch_and_reports_accuracy():
    from ecotrain.core.task import ModelLossTask

    class M(torch.nn.Module):
        def forward(self, input_ids, labels):
            logits = torch.nn.functional.one_hot(input_ids, 3).float()
            return {"loss": logits.sum() * 0 + 1.5, "logits": logits}

    task = ModelLossTask()
    batch = {"input_ids": torch.tensor([0, 1, 2, 1]), "labels": torch.tensor([0, 1, 1, 1])}
    out = task.forward(M(), batch)
    assert task.loss(out, batch) == pytest.approx(1.5) and task.loss(out, batch, "sum") == pytest.approx(6.0)
    assert task.forward(lambda *a: a, (1, 2)) == (1, 2)
    metrics = task.metrics()
    assert list(metrics) == ["accuracy"]
    metrics["accuracy"].update(task.predictions(out), task.targets(batch))
    assert metrics["accuracy"].compute() == pytest.approx(0.75)


def test_user_task_loss_reductions_and_target_position():
    from ecotrain.core.task import UserTask

    task = UserTask(lambda out, y: (out - y).abs().mean(), target=1)
    batch = (torch.zeros(4), torch.tensor([1.0, 2.0, 3.0, 6.0]), torch.tensor([9.0, 9.0, 9.0, 9.0]))
    out = torch.zeros(4)
    assert task.loss(out, batch) == pytest.approx(3.0)  # the target is batch[1], not the last tensor
    assert task.loss(out, batch, "sum") == pytest.approx(12.0)


def test_user_task_copies_a_stateful_metric_per_evaluation_but_not_a_function():
    from ecotrain.core.task import UserTask

    class Count:
        def __init__(self):
            self.n = 0

        def update(self, preds, target):
            self.n += len(target)

        def compute(self):
            return self.n

        def reset(self):
            self.n = 0

    shared = Count()
    fn = lambda preds, target: (preds == target).float().mean()  # noqa: E731
    task = UserTask(lambda o, y: o.sum(), {"count": shared, "fn": fn})
    first, second = task.metrics(), task.metrics()
    assert first["count"] is not shared and first["count"] is not second["count"]
    first["count"].update(None, [1, 2, 3])
    assert shared.n == 0 and second["count"].n == 0
    assert first["fn"].fn is fn  # a function is wrapped, not copied


def test_an_all_padding_piece_is_exactly_zero_and_a_whole_batch_is_unscaled():
    from ecotrain.core.task import SequenceTask, normalized_loss

    task = SequenceTask()
    out = torch.randn(2, 3, 4, requires_grad=True)
    pad = (torch.zeros(2, 3), torch.full((2, 3), -100))
    zero = normalized_loss(task, out, pad, 10)
    assert zero.item() == 0.0 and zero.requires_grad
    y = torch.randint(0, 4, (2, 3))
    full = normalized_loss(task, out, (None, y), 6)
    assert full.item() == pytest.approx(task.loss(out, (None, y)).item())
    half = normalized_loss(task, out, (None, y), 12)
    assert half.item() == pytest.approx(task.loss(out, (None, y)).item() / 2)


def test_build_task_passes_the_target_and_threshold_through():
    from ecotrain import Config
    from ecotrain.core.task import build_task

    cfg = Config.model_validate({"task": {"name": "multilabel", "target": "tags", "threshold": 0.7}})
    task = build_task(cfg)
    assert task.target == "tags" and task.threshold == 0.7
    auto = Config.model_validate({"task": {"target": "y"}})
    assert build_task(auto, {"x": torch.zeros(2, 3), "y": torch.tensor([0.5, 1.5])}).name == "regression"
    assert build_task(Config(), {"input_ids": torch.zeros(2, 3), "label": torch.tensor([0, 1])}).name == "classification"
    assert build_task(Config(), {"input_ids": torch.zeros(2, 3), "labels": torch.tensor([0, 1])}).name == "model_loss"
    assert build_task(Config(), ("not", "tensors")).name == "classification"
