"""Replay: reservoir sampling (bounded, uniform, deterministic), balanced selection, the per-step
replay rows, the weighted loss term, and the buffer carried from one run to the next."""

import pytest
import torch
from safetensors.torch import load_file

from ecotrain import fit
from ecotrain.base.errors import ConfigError
from ecotrain.methods.replay import balanced, example_weights, load_buffer, reservoir
from tests.helpers.steps import step_grads


def _stream(n_old, seen, new, size, seed):
    slots, picks = reservoir(n_old, seen, new, size, torch.Generator().manual_seed(seed))
    return slots, picks


def test_reservoir_keeps_the_bound_and_is_uniform_and_deterministic():
    size, first, second = 30, 60, 240  # two versions: 60 examples, then 240 more
    counts = torch.zeros(first + second)
    for seed in range(300):
        slots, picks = _stream(0, 0, first, size, seed)
        held = torch.full((size,), -1)
        held[slots] = picks
        assert len(slots) == size and held.min() >= 0
        slots, picks = _stream(size, first, second, size, 10_000 + seed)
        assert len(slots) <= size and slots.max() < size  # never past the bound
        held[slots] = picks + first
        counts[held] += 1
    freq = counts / 300  # every example of the whole stream: kept with probability 30/300
    assert freq.mean() == pytest.approx(0.1, abs=1e-6)
    assert freq[:first].mean() == pytest.approx(0.1, abs=0.02) and freq[first:].mean() == pytest.approx(0.1, abs=0.02)
    assert freq.min() > 0.02 and freq.max() < 0.22  # no example favoured or starved
    assert torch.equal(_stream(0, 0, 100, 10, 5)[1], _stream(0, 0, 100, 10, 5)[1])
    assert not torch.equal(_stream(10, 100, 100, 10, 5)[1], _stream(10, 100, 100, 10, 6)[1])


def test_balanced_selection_equal_per_class_and_water_filling():
    keys = torch.tensor([0] * 300 + [1] * 300 + [2] * 20 + [3] * 300)
    idx = balanced(keys, 200, torch.Generator().manual_seed(0))
    per = torch.bincount(keys[idx], minlength=4).tolist()
    assert len(idx) == 200 and len(set(idx.tolist())) == 200
    assert per[2] == 20 and per[0] == per[1] == per[3] == 60  # the small class's leftover goes to the others
    assert torch.equal(idx, balanced(keys, 200, torch.Generator().manual_seed(0)))
    assert len(balanced(keys[:10], 200, torch.Generator().manual_seed(0))) == 10  # fewer than size: all kept


def test_example_weights_hard_and_rare():
    y = torch.tensor([0] * 8 + [1] * 8 + [2] * 2)
    wrong = torch.zeros(18, dtype=torch.bool)
    wrong[0] = True
    w = example_weights(y, wrong, 3.0, rare=True)
    assert w[0] == 3.0 and w[1] == 1.0 and w[-1] == 4.0  # median 8 / count 2
    assert torch.equal(example_weights(y, wrong, 1.0, rare=False), torch.ones(18))


def _cfg(tiny_cfg, methods):
    return tiny_cfg(**{"methods": methods, "data.num_classes": 10, "loop.max_steps": 12, "loop.eval_every": 6,
                       "ledger.enabled": False})


def test_buffer_is_exported_bounded_and_replayed_by_the_next_run(tiny_cfg, tmp_path):
    r0 = fit(_cfg(tiny_cfg, [{"name": "replay", "size": 40, "hard_weight": 2.0}]), run_dir=tmp_path / "v0", quiet=True)
    exported = load_file(tmp_path / "v0" / "export.safetensors")
    assert exported["replay/x"].shape == (40, 64) and exported["replay/seen"].item() == r0.summary["methods"]["replay"]["seen"]
    per_class = torch.bincount(exported["replay/y"], minlength=10)
    assert per_class.max() - per_class.min() <= 1  # class-balanced
    assert set(exported["replay/weight"].tolist()) <= {1.0, 2.0}
    buf = load_buffer(tmp_path / "v0")
    assert len(buf) == 40
    r1 = fit(_cfg(tiny_cfg, [{"name": "replay", "size": 40, "from": str(tmp_path / "v0")}]), run_dir=tmp_path / "v1",
             quiet=True)
    import json
    logs = [json.loads(x) for x in (tmp_path / "v1" / "metrics.jsonl").read_text().splitlines()]
    assert all(x["loss_replay"] > 0 for x in logs if "loss" in x)
    assert r1.summary["methods"]["replay"]["rows_per_step"] == 8  # batch 32, ratio 0.2: 32 * 0.25
    assert load_buffer(tmp_path / "v1").seen == 2 * buf.seen


def test_replay_rows_follow_seed_and_epoch_and_cover_the_buffer(tiny_cfg):
    from ecotrain.methods.replay import Buffer, Replay

    cfg = _cfg(tiny_cfg, [{"name": "replay", "size": 10}])
    m = Replay(cfg.methods[0], cfg)
    m.buffer, m.rows = Buffer(torch.randn(10, 4), torch.arange(10), torch.ones(10)), 5
    epoch0 = torch.cat([m.replay_indices(0, 0), m.replay_indices(0, 1)])
    assert sorted(epoch0.tolist()) == list(range(10))  # each example once per pass
    assert torch.equal(m.replay_indices(0, 1), m.replay_indices(0, 1))
    assert not torch.equal(m.replay_indices(0, 0), m.replay_indices(1, 0))


def test_bad_from_is_one_line(tiny_cfg, tmp_path):
    with pytest.raises(ConfigError, match="methods.replay.from: .* not found"):
        fit(_cfg(tiny_cfg, [{"name": "replay", "from": str(tmp_path / "nope")}]), run_dir=tmp_path / "r")


@pytest.mark.parametrize("accumulate", [1, 2])
def test_replay_term_trains_the_model_not_only_the_log(tiny_cfg, accumulate):
    """The step's gradient is that of CE(batch) + weight * weighted CE(replay rows), once per step
    however it is accumulated: a replay term detached from the graph (logged, not trained) fails here."""
    import torch.nn.functional as F
    from torch import nn

    from ecotrain.methods.replay import Buffer, Replay

    torch.manual_seed(0)
    cfg = _cfg(tiny_cfg, [{"name": "replay", "size": 12, "weight": 0.5}])
    m = Replay(cfg.methods[0], cfg)
    m.buffer = Buffer(torch.randn(12, 4, dtype=torch.double) * 3, torch.arange(12) % 3,
                      torch.tensor([1.0, 2.0, 1.0, 3.0] * 3))  # unequal weights: the weighted mean counts
    m.rows = 6
    model = nn.Linear(4, 3).double()
    x, y = torch.randn(8, 4, dtype=torch.double), torch.randint(0, 3, (8,))
    got, parts = step_grads(model, m, (x, y), accumulate, epoch=1, batch_in_epoch=1)

    idx = m.replay_indices(1, 1)
    rx, ry, rw = m.buffer.x[idx], m.buffer.y[idx], m.buffer.weight[idx].double()
    replay = 0.5 * (F.cross_entropy(model(rx), ry, reduction="none") * rw).sum() / rw.sum()
    task_only = torch.autograd.grad(F.cross_entropy(model(x), y), list(model.parameters()))
    from_replay = torch.autograd.grad(replay, list(model.parameters()))
    assert all(g.abs().max() > 1e-3 for g in from_replay)  # the term does pull on every parameter
    for g, t, r in zip(got, task_only, from_replay):
        torch.testing.assert_close(g, t + r, rtol=1e-6, atol=1e-9)
    assert parts["replay"].item() == pytest.approx(replay.item(), rel=1e-5)  # and what is logged is what trained


# ---- what the mutation run (tests/mutants.py) found untested ---------------------------------
def test_reservoir_replaces_with_the_exact_probability_and_returns_indices():
    """Algorithm R: the (seen+1)-th example replaces a full buffer of one with probability 1/(seen+1)."""
    kept = [len(reservoir(1, 1, 1, 1, torch.Generator().manual_seed(s))[0]) for s in range(800)]
    assert sum(kept) / 800 == pytest.approx(0.5, abs=0.06)  # 1/2, not 1/3 nor always
    kept = [len(reservoir(3, 3, 1, 3, torch.Generator().manual_seed(s))[0]) for s in range(800)]
    assert sum(kept) / 800 == pytest.approx(0.75, abs=0.06)
    slots, picks = reservoir(2, 2, 0, 5, torch.Generator().manual_seed(0))  # nothing new: empty index tensors
    assert slots.dtype == picks.dtype == torch.long and len(slots) == len(picks) == 0


def test_balanced_fills_every_slot_across_rounds_and_handles_no_rows():
    keys = torch.tensor([0] * 12 + [1] * 100 + [2] * 3)  # class 0 runs out in the second round
    idx = balanced(keys, 30, torch.Generator().manual_seed(0))
    assert torch.bincount(keys[idx], minlength=3).tolist() == [12, 15, 3] and len(set(idx.tolist())) == 30
    keys = torch.tensor([0] * 10 + [1] * 10)
    assert torch.bincount(keys[balanced(keys, 7, torch.Generator())]).tolist() == [4, 3]  # the last slot too
    keys = torch.tensor([0] * 10 + [1] * 10 + [2] * 10)
    assert sorted(torch.bincount(keys[balanced(keys, 4, torch.Generator())]).tolist()) == [1, 1, 2]
    empty = balanced(torch.zeros(0, dtype=torch.long), 5, torch.Generator())
    assert empty.dtype == torch.long and len(empty) == 0


def test_example_weights_default_hard_weight_and_rare_bounds():
    y = torch.tensor([0] * 30 + [1] * 20 + [2] * 20 + [3])  # median count 20
    wrong = torch.zeros(len(y), dtype=torch.bool)
    wrong[-2] = True
    w = example_weights(y, wrong, 2.0, rare=False)
    assert w[-2] == 2.0 and w.sum() == len(y) + 1  # hard_weight 2 (the default) is applied too
    w = example_weights(y, torch.zeros(len(y), dtype=torch.bool), 1.0, rare=True)
    assert w[0] == 1.0  # a class above the median is not down-weighted
    assert w[30] == 1.0 and w[-1] == 10.0  # median / 1 = 20, capped at 10


def test_wrong_marks_the_misclassified_rows_in_chunks():
    from ecotrain.methods.replay import Replay

    model = torch.nn.Linear(1, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0], [-1.0]]))  # class 0 for x > 0, else 1
    x = torch.linspace(-1, 1, 300).unsqueeze(1)  # more rows than one 256-row chunk
    y = torch.zeros(300, dtype=torch.long)
    model.train()
    wrong = Replay._wrong(model, x, y)
    assert torch.equal(wrong, x[:, 0] <= 0) and model.training


def _export(path, **tensors):
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return path


def test_load_buffer_refuses_damaged_files_in_one_line(tmp_path):
    from ecotrain.base.errors import CheckpointError

    ok = {"replay/x": torch.zeros(4, 2), "replay/y": torch.zeros(4, dtype=torch.long), "replay/weight": torch.ones(4),
          "replay/seen": torch.tensor([9])}
    assert load_buffer(_export(tmp_path / "ok.safetensors", **ok)).seen == 9
    no_weight = {k: v for k, v in ok.items() if k != "replay/weight"}
    with pytest.raises(CheckpointError, match=r"^methods.replay.from: .*nw.safetensors has no replay/weight; it is not"):
        load_buffer(_export(tmp_path / "nw.safetensors", **no_weight))
    with pytest.raises(CheckpointError, match=r"x, y and weight have different lengths \(4, 4, 3\); the file is damaged"):
        load_buffer(_export(tmp_path / "len.safetensors", **{**ok, "replay/weight": torch.ones(3)}))
    with pytest.raises(CheckpointError, match=r"^methods.replay.from: .* holds nothing under 'replay/' \(keys: \['ewc/a'\]\); was the previous "
                                              r"run trained with methods.replay\?"):
        load_buffer(_export(tmp_path / "other.safetensors", **{"ewc/a": torch.zeros(1)}))
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="junk.safetensors is not a readable safetensors file"):
        load_buffer(tmp_path / "junk.safetensors")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("{}")
    with pytest.raises(ConfigError, match=r"^methods.replay.from: .*run is a run folder without export.safetensors; "
                                          r"was it trained with methods.replay\? Give a run"):
        load_buffer(tmp_path / "run")


def test_resume_refuses_a_from_file_that_changed(tiny_cfg, tmp_path):
    """The checkpoint pins the buffer file's sha256: a resume against another file is one line."""
    import hashlib

    from ecotrain.base.errors import CheckpointError
    from ecotrain.methods.replay import Replay, file_digest

    ok = {"replay/x": torch.zeros(4, 2), "replay/y": torch.zeros(4, dtype=torch.long), "replay/weight": torch.ones(4),
          "replay/seen": torch.tensor([4])}
    f = _export(tmp_path / "buf.safetensors", **ok)
    assert file_digest(f) == hashlib.sha256(f.read_bytes()).hexdigest()
    cfg = _cfg(tiny_cfg, [{"name": "replay", "from": str(f)}])
    m = Replay(cfg.methods[0], cfg)
    sd = m.state_dict()
    assert sd == {"from_digest": file_digest(f)}
    m.load_state_dict(sd)  # the same file: fine
    _export(f, **{**ok, "replay/seen": torch.tensor([5])})
    with pytest.raises(CheckpointError, match=r"^methods.replay.from: .*buf.safetensors changed since the run started; "
                                              "resume with the buffer it started from"):
        Replay(cfg.methods[0], cfg).load_state_dict(sd)
    assert Replay(cfg.methods[0], cfg).summary() == {"buffer": 4, "rows_per_step": 0}
    none = Replay(_cfg(tiny_cfg, [{"name": "replay"}]).methods[0], cfg)
    assert none.summary() == {} and none.export(None) is None


def test_rows_per_step_and_refusals_at_data_time(tiny_cfg):
    from types import SimpleNamespace

    from ecotrain.data import ArraySource
    from ecotrain.base.errors import CheckpointError
    from ecotrain.methods.replay import Buffer, Replay

    cfg = _cfg(tiny_cfg, [{"name": "replay", "ratio": 0.2}])
    m = Replay(cfg.methods[0], cfg)
    m.buffer = Buffer(torch.zeros(5, 3), torch.zeros(5, dtype=torch.long), torch.ones(5))
    src = ArraySource(torch.zeros(10, 3), torch.zeros(10, dtype=torch.long))
    m.data(src, SimpleNamespace(batch_size=2))
    assert m.rows == 1  # round(2 * 0.25) = 0: at least one row
    m.data(src, SimpleNamespace(batch_size=100))
    assert m.rows == 5  # 25 wanted, the buffer has 5
    with pytest.raises(ConfigError, match="^methods.replay: the sampler has no batch_size; replay needs fixed-size batches$"):
        m.data(src, object())
    with pytest.raises(CheckpointError, match=r"the buffer's examples have shape \(3,\) but this data's \(4,\)"):
        m.data(ArraySource(torch.zeros(10, 4), torch.zeros(10, dtype=torch.long)), SimpleNamespace(batch_size=8))
    with pytest.raises(ConfigError, match=r"^methods.replay: one process only for now \(its replay rows .* use distributed.strategy=none$"):
        Replay(cfg.methods[0], tiny_cfg(**{"distributed.strategy": "ddp"}))


def test_replay_logits_are_computed_once_per_micro_batch(tiny_cfg):
    from types import SimpleNamespace

    from ecotrain.methods.replay import Buffer, Replay

    cfg = _cfg(tiny_cfg, [{"name": "replay"}])
    m = Replay(cfg.methods[0], cfg)
    m.buffer, m.rows = Buffer(torch.randn(6, 3), torch.zeros(6, dtype=torch.long), torch.ones(6)), 2
    calls = []
    model = torch.nn.Linear(3, 2)
    model.register_forward_hook(lambda *a: calls.append(1))
    state = SimpleNamespace(model=model, device=torch.device("cpu"), epoch=0, batch_in_epoch=0)
    out = torch.zeros(1)
    first = m.replay_logits(state, out)
    assert m.replay_logits(state, out) is first and len(calls) == 1  # LwF reuses them: no second forward
    assert m.replay_logits(state, torch.zeros(1)) is not first and len(calls) == 2


@pytest.mark.parametrize("old_n,seen,new_n", [(0, 0, 50), (7, 7, 30), (20, 90, 40)])
def test_reservoir_vectorised_allocates_what_the_stream_holds_not_the_size(old_n, seen, new_n):
    """A size far above the stream (an update's replay size of 1e11) gives what a size just large
    enough gives, without allocating `size` slots; a size below it is untouched."""
    from ecotrain.methods.replay import reservoir_vectorised

    for size in (max(old_n, 1) + 5, 10 ** 11):
        a = reservoir_vectorised(old_n, seen, new_n, size, torch.Generator().manual_seed(3))
        b = reservoir_vectorised(old_n, seen, new_n, min(size, seen + new_n), torch.Generator().manual_seed(3))
        assert all(torch.equal(u, v) for u, v in zip(a, b))
