"""Replay: reservoir sampling (bounded, uniform, deterministic), balanced selection, the per-step
replay rows, the weighted loss term, and the buffer carried from one run to the next."""

import pytest
import torch
from safetensors.torch import load_file

from ecotrain import fit
from ecotrain.errors import ConfigError
from ecotrain.methods.replay import balanced, example_weights, load_buffer, reservoir


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
