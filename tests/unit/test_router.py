"""The learned cohort router (continual/router.py): fit, route with a confidence floor, stored as
tensors and names only, and the pooled features it reads."""

import numpy as np
import pytest
import torch
from torch import nn

from ecotrain.continual.router import CohortRouter, accuracy, pooled_features
from ecotrain.base.errors import ConfigError


def blobs(centers, n=60, seed=0):
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.normal(c, 0.3, size=(n, 2)) for c in centers])
    y = [str(k) for k in range(len(centers)) for _ in range(n)]
    return x, y


@pytest.mark.parametrize("centers", [[(0, 0), (3, 3)], [(0, 0), (3, 0), (0, 3)]])
def test_routes_separable_cohorts_and_matches_sklearn(centers):
    x, y = blobs(centers)
    r = CohortRouter(min_confidence=0.6).fit(x, y)
    assert accuracy(r.route(x), y) == 1.0
    from sklearn.linear_model import LogisticRegression  # the same model, predicted without sklearn

    xs = (x - x.mean(0)) / x.std(0)
    ref = LogisticRegression(max_iter=2000, random_state=0).fit(xs, y).predict_proba(xs)
    assert np.allclose(r.proba(x).numpy(), ref, atol=1e-9)


def test_unsure_examples_go_to_the_base_and_one_cohort_routes_nothing():
    x, y = blobs([(0, 0), (3, 3)])
    r = CohortRouter(min_confidence=0.9).fit(x, y)
    mid = np.array([[1.5, 1.5]])  # halfway: neither cohort is sure
    assert r.route(mid) == [None]
    assert r.route(np.array([[3.0, 3.0]])) == ["1"]
    solo = CohortRouter().fit(x[:60], y[:60])
    assert solo.route(x[:5]) == [None] * 5
    with pytest.raises(ConfigError, match="not fitted"):
        solo.proba(x[:5])


def test_state_round_trip_is_tensors_and_names():
    x, y = blobs([(0, 0), (3, 0), (0, 3)])
    r = CohortRouter(min_confidence=0.7, seed=3).fit(x, y)
    tensors, meta = r.state()
    assert all(isinstance(t, torch.Tensor) for t in tensors.values()) and meta["classes"] == ["0", "1", "2"]
    back = CohortRouter.from_state(tensors, meta)
    assert torch.equal(back.proba(x), r.proba(x)) and back.min_confidence == 0.7


def test_refusals_and_accuracy_base():
    with pytest.raises(ConfigError, match="min_confidence"):
        CohortRouter(min_confidence=1.5)
    with pytest.raises(ConfigError, match="3 feature rows but 2"):
        CohortRouter().fit(np.zeros((3, 2)), ["a", "b"])
    assert accuracy([None, "a", "b"], ["base", "a", "a"], base="base") == pytest.approx(2 / 3)


def test_pooled_features_read_the_last_linear_input_and_restore_mode():
    net = nn.Sequential(nn.Conv1d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8, 3))
    net.train()
    x = torch.randn(10, 1, 8)
    f = pooled_features(net, x, batch_size=3)
    assert f.shape == (10, 32) and net.training
    assert torch.allclose(f, net[:3](x).detach())

    class Seq(nn.Module):  # [B, T, H] into the head: averaged over time
        def __init__(self):
            super().__init__()
            self.rnn, self.head = nn.Linear(5, 6), nn.Linear(6, 2)

        def forward(self, x):
            return self.head(self.rnn(x))
    m = Seq()
    xs = torch.randn(4, 7, 5)
    assert torch.allclose(pooled_features(m, xs), m.rnn(xs).mean(1).detach(), atol=1e-6)
    with pytest.raises(ConfigError, match="no nn.Linear"):
        pooled_features(nn.Sequential(nn.ReLU()), x)


def test_speech_encoder_features_per_utterance():
    from ecotrain.speech.model import AcousticModel
    from ecotrain.speech.utterance_router import SpeechRouter, encoder_features

    class Src:
        def __init__(self, segs):
            self.segs = segs

        def __len__(self):
            return len(self.segs)
    torch.manual_seed(0)
    model = AcousticModel(channels=16, hidden=8).train()
    a, b = torch.randn(30, 40), torch.randn(55, 40) + 2.0
    f = encoder_features(model, Src([a, b]))
    assert f.shape == (2, 32) and model.training  # mean and spread of the head's 16 inputs; mode restored
    assert np.allclose(encoder_features(model, Src([b]))[0], f[1], atol=1e-6)  # no padding from a's length
    r = SpeechRouter(model, seed=0)
    r.add(Src([torch.randn(40, 40) for _ in range(20)]), "base")
    assert r.route(Src([a])) == [None]  # one cohort: nothing to tell apart
    r.add(Src([torch.randn(40, 40) * 3 + 4 for _ in range(20)]), "loud")
    assert r.route(Src([torch.randn(40, 40) * 3 + 4])) == ["loud"]
    trial = r.copy()
    assert trial.route(Src([torch.randn(40, 40) * 3 + 4])) == ["loud"] and trial.y == r.y and trial.y is not r.y
