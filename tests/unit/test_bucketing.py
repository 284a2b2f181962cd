"""The bucketing sampler: deterministic, resumable by (epoch, batch index), every sample once, less padding."""

import pytest
import torch

from ecotrain import fit
from ecotrain.config import load_config
from ecotrain.data.bucketing import BucketSampler, build_sampler, padding_ratio
from ecotrain.data.sampler import EpochSampler
from ecotrain.base.errors import ConfigError


def _lengths(n=1000):
    g = torch.Generator().manual_seed(0)
    return (torch.rand(n, generator=g) ** 3 * 500).long() + 1  # skewed, like real text


def test_deterministic_and_resumable():
    lengths = _lengths()
    a, b = BucketSampler(lengths, 32, seed=3), BucketSampler(lengths, 32, seed=3)
    e1 = list(a.batches(1))
    assert [t.tolist() for t in e1] == [t.tolist() for t in b.batches(1)]
    assert [t.tolist() for t in a.batches(1, start=7)] == [t.tolist() for t in e1[7:]]
    assert [t.tolist() for t in a.batches(2)] != [t.tolist() for t in e1]
    assert [t.tolist() for t in BucketSampler(lengths, 32, seed=4).batches(1)] != [t.tolist() for t in e1]


@pytest.mark.parametrize("n, bs", [(1000, 32), (1001, 32), (5, 8), (64 * 32 + 3, 32)])
def test_every_sample_once_and_len_like_epoch_sampler(n, bs):
    s = BucketSampler(_lengths(n), bs, seed=0)
    batches = list(s.batches(0))
    assert len(s) == len(batches) == len(EpochSampler(n, bs, 0))
    assert sorted(torch.cat(batches).tolist()) == list(range(n))
    assert sum(len(b) < bs for b in batches) <= 1


def test_bucketing_cuts_padding():
    lengths = _lengths()
    rand = padding_ratio(EpochSampler(len(lengths), 32, 0).batches(0), lengths)
    buck = padding_ratio(BucketSampler(lengths, 32, 0).batches(0), lengths)
    assert buck < rand / 3
    assert padding_ratio([torch.tensor([0, 1])], torch.tensor([2, 4])) == pytest.approx(2 / 8)


def test_bucketing_needs_lengths():
    assert isinstance(build_sampler(10, None, 4, 0, False), EpochSampler)
    with pytest.raises(ConfigError, match="data.bucketing"):
        build_sampler(10, None, 4, 0, True)


def test_fit_reports_padding_ratio(tmp_path):
    base = ["data.name=text", "data.kwargs={seq_len: 128, max_bytes: 30000, mode: paragraphs}", "data.batch_size=16",
            "model.name=charlm", "model.kwargs={d_model: 16, n_layers: 1, n_heads: 2}", "loop.max_steps=3",
            "loop.max_epochs=null", "logging.progress='off'"]
    plain = fit(load_config(None, base), run_dir=tmp_path / "a").summary
    bucketed = fit(load_config(None, [*base, "data.bucketing=true"]), run_dir=tmp_path / "b").summary
    assert bucketed["padding_ratio"] < plain["padding_ratio"] / 3
