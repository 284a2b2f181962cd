"""Data methods' mechanics: dedup's keys and counts, curriculum's easy-to-hard order, selective
backprop's selection, its honest FLOPs and exact accumulation."""

import numpy as np
import pytest
import torch
from torch import nn

from ecotrain.config import CurriculumConfig, DedupConfig, SelectiveBackpropConfig
from ecotrain.data import ArraySource, EpochSampler
from ecotrain.base.errors import CheckpointError, ConfigError, DataError
from ecotrain.methods.curriculum import Curriculum, CurriculumSampler, easy_to_hard
from ecotrain.methods.dedup import Dedup, find_duplicates
from ecotrain.methods.sampling import generator
from ecotrain.methods.selective import SelectiveBackprop, top_fraction
from ecotrain.core.task import ClassificationTask


def _signals(n=40, length=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, length, generator=g), torch.randint(0, 3, (n,), generator=g)


def test_dedup_drops_exact_and_near_copies_and_counts_label_conflicts():
    x, y = _signals()
    x = torch.cat([x, x[3:4], x[5:6] * 2.0 + 1.0, x[7:8] + 1e-4 * torch.randn(1, 32), x[9:10]])  # exact, rescaled, noisy, exact
    y = torch.cat([y, y[3:4], y[5:6], y[7:8], (y[9:10] + 1) % 3])  # the last copy carries another label
    keep, counts = find_duplicates(ArraySource(x, y), near=True, points=16, step=0.25)
    assert keep.tolist() == list(range(40))  # the first of each group is kept
    assert counts == {"samples": 44, "kept": 40, "exact_dropped": 2, "near_dropped": 2, "label_conflicts": 1}
    _, exact_only = find_duplicates(ArraySource(x, y), near=False, points=16, step=0.25)
    assert exact_only["kept"] == 42 and exact_only["near_dropped"] == 0


def test_dedup_method_subsets_source_and_sampler_and_checks_its_digest_on_resume():
    x, y = _signals()
    src = ArraySource(torch.cat([x, x[:5]]), torch.cat([y, y[:5]]))
    m = Dedup(DedupConfig(name="dedup"))
    source, sampler = m.data(src, EpochSampler(45, 8, seed=3))
    assert len(source) == 40 and sampler.n == 40 and m.summary()["exact_dropped"] == 5
    assert torch.equal(source.take(torch.arange(40))[0], x)
    sd = m.state_dict()
    m.load_state_dict(sd)  # the same data: accepted
    with pytest.raises(CheckpointError, match="dedup"):
        m.load_state_dict({**sd, "digest": "0" * 16})


def _curriculum(scores, epochs=1, window=1):
    cfg = CurriculumConfig(name="curriculum", score="file", path="x.npy", epochs=epochs, window=window)
    m = Curriculum(cfg)
    m.scores = torch.as_tensor(scores, dtype=torch.float64)
    return m


def test_curriculum_orders_easy_to_hard_then_plain_and_resumes_at_a_batch_index():
    n, bs = 64, 8
    scores = torch.rand(n, generator=torch.Generator().manual_seed(1))
    m = _curriculum(scores, epochs=1, window=1)
    base = EpochSampler(n, bs, seed=5)
    s = CurriculumSampler(base, m)
    batches = list(s.batches(0))
    means = [float(scores[b].mean()) for b in batches]
    assert means == sorted(means) and len(batches) == len(base)  # window 1: batch by batch, easy to hard
    assert sorted(torch.cat(batches).tolist()) == list(range(n))  # every sample once
    assert [b.tolist() for b in s.batches(0, 3)] == [b.tolist() for b in batches[3:]]  # resume: no replay
    assert [b.tolist() for b in s.batches(1)] == [b.tolist() for b in base.batches(1)]  # after `epochs`: plain
    again = CurriculumSampler(base, _curriculum(scores, window=1))
    assert torch.equal(torch.cat(list(again.batches(0))), torch.cat(batches))  # a function of seed, epoch, scores


def test_curriculum_window_mixes_neighbouring_batches_and_ties_are_seeded():
    scores = torch.zeros(32)  # all tied: the order is the seeded permutation, different per epoch
    a = easy_to_hard(scores, 4, 2, generator(0, 0, 7))
    b = easy_to_hard(scores, 4, 2, generator(0, 1, 7))
    assert sorted(a.tolist()) == list(range(32)) and not torch.equal(a, b)
    ranked = torch.arange(32, dtype=torch.float64)
    o = easy_to_hard(ranked, 4, 2, generator(0, 0, 7))
    for w in range(0, 32, 8):  # window of 2 batches: the right samples, shuffled inside
        assert sorted(o[w:w + 8].tolist()) == list(range(w, w + 8))


def test_curriculum_score_file_is_checked(tmp_path):
    p = tmp_path / "s.npy"
    np.save(p, np.arange(10.0))
    m = Curriculum(CurriculumConfig(name="curriculum", score="file", path=str(p)))
    with pytest.raises(DataError, match="expected 12 finite numbers"):
        m.data(ArraySource(*_signals(12)), EpochSampler(12, 4, 0))
    with pytest.raises(ConfigError, match="before batch_ramp"):
        m.data(ArraySource(*_signals(10)), object())


def test_curriculum_scores_with_a_reference_run_and_charges_its_flops(tmp_path, tiny_cfg):
    from ecotrain import fit
    from ecotrain.methods import build_methods

    ref = tmp_path / "ref"
    fit(tiny_cfg(**{"loop.max_steps": 3, "ledger.energy": "off"}), run_dir=ref)
    cfg = tiny_cfg(**{"loop.max_steps": 2, "ledger.energy": "off", "methods": [
        {"name": "curriculum", "reference": str(ref), "epochs": 1}]})
    out = tmp_path / "run"
    fit(cfg, run_dir=out)
    import json
    ledger = json.loads((out / "ledger.json").read_text())
    extra = ledger["flops"]["extra"]
    ref_total = json.loads((ref / "ledger.json").read_text())["flops"]["total"]
    assert extra["curriculum_reference_training"] == ref_total
    assert extra["curriculum_scoring"] > 0
    summary = json.loads((out / "summary.json").read_text())["methods"]["curriculum"]
    assert summary["scoring_flops"] == extra["curriculum_scoring"]
    assert build_methods(cfg).methods[0].key == "curriculum"


def test_top_fraction_keeps_the_highest_losses_in_batch_order():
    losses = torch.tensor([0.1, 0.9, 0.5, 0.9, 0.2])
    assert top_fraction(losses, 0.4).tolist() == [1, 3]
    assert top_fraction(losses, 0.5).tolist() == [1, 2, 3]  # ceil
    assert top_fraction(losses, 1.0).tolist() == [0, 1, 2, 3, 4]


def _state(model, step=5, accumulate=1):
    from types import SimpleNamespace

    from ecotrain.core.distributed import Dist
    from ecotrain.methods import Methods
    from ecotrain.core.objective import Objective
    from ecotrain.core.precision import Precision
    sel = SelectiveBackprop(SelectiveBackpropConfig(name="selective_backprop", keep=0.25, start_step=2))
    methods = Methods([sel])
    return SimpleNamespace(model=model, precision=Precision("fp32", torch.device("cpu")), dist=Dist(), step=step,
                           objective=Objective(ClassificationTask(), methods), task=ClassificationTask(),
                           methods=methods), sel


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.0), nn.Linear(16, 3)).double()


def test_selective_backprop_is_exact_under_accumulation_and_starts_late():
    from ecotrain.core.loop import backward_micro_batches

    x = torch.randn(24, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    y = torch.randint(0, 3, (24,), generator=torch.Generator().manual_seed(3))
    grads = []
    for acc in (1, 3):
        model = _model()
        state, sel = _state(model)
        xs, ys = state.objective.prepare(state, (x, y))
        assert len(ys) == 6 and model.training
        backward_micro_batches(state, (xs, ys), acc)
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    # the kept samples are the highest-loss ones of the whole batch
    with torch.no_grad():
        losses = nn.functional.cross_entropy(_model()(x), y, reduction="none")
    assert torch.equal(xs, x[torch.sort(torch.topk(losses, 6).indices).values])
    state, _ = _state(_model(), step=1)  # before start_step: the whole batch
    assert len(state.objective.prepare(state, (x, y))[1]) == 24
    assert sel.state_dict() == {"samples": 24, "kept": 6}


def test_selective_backprop_step_flops_are_forward_all_plus_forward_backward_kept():
    from ecotrain.accounting.flops import count_flops
    from ecotrain.core.loop import backward_micro_batches

    x = torch.randn(32, 6, dtype=torch.float64)
    y = torch.randint(0, 3, (32,))
    model = _model()
    state, _ = _state(model)

    def step():
        xs, ys = state.objective.prepare(state, (x, y))
        backward_micro_batches(state, (xs, ys), 1)

    measured = count_flops(model, step, 32)
    fwd_all = count_flops(model, lambda: model(x), 32).total
    full_kept = count_flops(model, lambda: nn.functional.cross_entropy(model(x[:8]), y[:8]).backward(), 8)
    assert measured.total == fwd_all + full_kept.total
    assert measured.forward == full_kept.forward  # the scoring pass is training cost, not an eval's forward
