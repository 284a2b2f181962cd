"""ecotrain.speech: features, transcripts, the data source, CTC, WER, label checks, data generation,
and a speech run through `fit` that resumes exactly."""

import os
import random
import shutil
import signal

import pytest
import torch
from safetensors.torch import load_file

from ecotrain.base.errors import ConfigError, DataError
from ecotrain.speech import dataset as D
from ecotrain.speech.checks import contradiction_scores, flag_contradictions, frame_posteriors
from ecotrain.speech.ctc import CTCTask, greedy_decode, utterance_nll, word_error_rate
from ecotrain.speech.features import SAMPLE_RATE, log_mel, mel_filterbank
from ecotrain.assembly.speech_feedback import FeedbackSettings, Replay
from ecotrain.speech.transcripts import WORDS, corrupt, decode, encode, normalize_transcript
from ecotrain.speech.model import AcousticModel, out_lengths
from ecotrain.speech.synth import Speaker

needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng not installed (make speech)")


def tiny_spec(seed=0):
    return D.Spec({"base": D.Cohort([Speaker("en-us+m1", 160, 45), Speaker("en-gb+f2", 170, 60)], 6, 2),
                   "accent_de": D.Cohort([Speaker("de+m1", 160, 50)], 4, 2, noise_snr_db=15.0)}, seed=seed)


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng not installed (make speech)")
    folder = tmp_path_factory.mktemp("speech") / "digits"
    D.generate(folder, tiny_spec())
    return folder


def test_mel_filterbank_triangles_cover_the_band():
    fb = mel_filterbank(40, 512, SAMPLE_RATE)
    assert fb.shape == (257, 40) and fb.min() >= 0 and fb.max() <= 1 + 1e-6
    peaks = fb.argmax(0)
    assert torch.all(peaks[1:] > peaks[:-1])  # centres rise with the mel index
    assert torch.all(fb.sum(0) > 0)  # no empty filter


def test_log_mel_frames_and_normalisation():
    t = torch.arange(SAMPLE_RATE) / SAMPLE_RATE
    tone = torch.sin(2 * torch.pi * 1000 * t) + 0.01 * torch.randn(SAMPLE_RATE, generator=torch.Generator().manual_seed(0))
    f = log_mel(tone)
    assert f.shape == (SAMPLE_RATE // 220 + 1, 40)
    assert torch.allclose(f.mean(0), torch.zeros(40), atol=1e-4)
    hot = log_mel(tone * 5)  # per-utterance normalisation: loudness drops out
    assert torch.allclose(f, hot, atol=1e-3)


@pytest.mark.parametrize("text,words", [
    ("seven three", ["seven", "three"]), ("73", ["seven", "three"]), ("Seven, THREE.", ["seven", "three"]),
    ("7 three!", ["seven", "three"]), ("oh nine", ["zero", "nine"]), ("  ", None), ("seven cats", None),
    ("٣", None),  # a non-ASCII digit is not a transcript we know
])
def test_normalize_transcript(text, words):
    assert normalize_transcript(text) == words


def test_corrupt_kinds_and_normalisation_recovers_formatting():
    rng = random.Random(0)
    kinds = {"clean": 0, "format": 0, "wrong": 0}
    for _ in range(400):
        truth = [rng.choice(WORDS) for _ in range(rng.randint(1, 5))]
        text, kind = corrupt(truth, rng, 0.2, 0.3)
        kinds[kind] += 1
        if kind == "wrong":
            assert normalize_transcript(text) != truth
        else:
            assert normalize_transcript(text) == truth
    assert 50 < kinds["wrong"] < 110 and 90 < kinds["format"] < 150


def test_source_pads_and_packs_lengths_and_labels():
    segs = [torch.ones(7, 40), torch.ones(3, 40) * 2]
    src = D.SpeechSource(segs, [encode(["one", "two"]), encode(["nine"])], ["a", "b"])
    x, y = src.take(torch.tensor([1, 0]))
    assert x.shape == (2, 7, 40) and torch.all(x[0, 3:] == 0) and torch.all(x[0, :3] == 2)
    assert y.tolist() == [[3, 1, 10, 0], [7, 2, 2, 3]]
    assert len(src + src) == 4 and src.subset([1]).cohorts == ["b"]


def test_ctc_loss_learns_and_greedy_decodes():
    torch.manual_seed(0)
    model = AcousticModel(channels=16, hidden=16, dropout=0.0)
    # two fixed "utterances": different random frames, different transcripts
    g = torch.Generator().manual_seed(1)
    src = D.SpeechSource([torch.randn(40, 40, generator=g), torch.randn(32, 40, generator=g)],
                         [encode(["one", "two"]), encode(["nine"])], ["a", "a"])
    x, y = src.take(torch.arange(2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = None
    for _ in range(150):
        loss = CTCTask()(model(x), y)
        first = first if first is not None else float(loss.detach())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss.detach()) < 0.2 * first
    model.eval()
    out = model(x)
    assert out.shape[1] == int(out_lengths(torch.tensor(40)))
    assert [decode(h) for h in greedy_decode(out, y[:, 0])] == ["one two", "nine"]
    assert utterance_nll(out, y).shape == (2,)


def test_word_error_rate_counts_edits_over_reference_words():
    assert word_error_rate(["one two", "nine"], ["one three", "nine"]) == pytest.approx(1 / 3)
    assert word_error_rate(["one"], ["one two"]) == pytest.approx(0.5)


def test_contradiction_flags_only_the_contradicted():
    scores = torch.tensor([0.5, 6.0, 6.0])
    flags = flag_contradictions(scores, [[1], [2], [3]], [[1], [5], [3]], 4.0)
    assert flags == [False, True, False]  # the third: high score but the model reads the same words


def test_feedback_settings_one_line_errors():
    assert FeedbackSettings.parse(None).rounds == ["accent_de", "accent_es", "fast_noisy"]
    with pytest.raises(ConfigError, match="feedback.bogus"):
        FeedbackSettings.parse({"bogus": 1})
    with pytest.raises(ConfigError, match="wrong_fraction"):
        FeedbackSettings.parse({"wrong_fraction": 1.5})
    with pytest.raises(ConfigError, match="strategies"):
        FeedbackSettings.parse({"strategies": ["magic"]})


def test_missing_espeak_is_one_line(monkeypatch):
    from ecotrain.speech import synth

    monkeypatch.setattr(synth.shutil, "which", lambda name: None)
    with pytest.raises(DataError, match="espeak-ng: not found.*apt-get install espeak-ng"):
        synth.espeak_binary()


@needs_espeak
def test_generation_is_deterministic_and_cached(tiny_data, tmp_path):
    data = D.load(tiny_data)
    assert len(data.rows) == 2 * 8 + 6 and {r["cohort"] for r in data.rows} == {"base", "accent_de"}
    again = D.generate(tmp_path / "again", tiny_spec())
    assert [r["sha256"] for r in D.load(again).rows] == [r["sha256"] for r in data.rows]
    stamp = (again / "features.safetensors").stat().st_mtime_ns
    D.generate(again, tiny_spec())  # cached: nothing rewritten
    assert (again / "features.safetensors").stat().st_mtime_ns == stamp
    other = D.load(D.generate(tmp_path / "seed1", tiny_spec(seed=1)))
    assert [r["transcript"] for r in other.rows] != [r["transcript"] for r in data.rows]


@needs_espeak
def test_damaged_dataset_is_one_line(tiny_data, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_data, bad)
    (bad / "features.safetensors").write_bytes(b"garbage")
    with pytest.raises(DataError, match="damaged"):
        D.load(bad)
    with pytest.raises(DataError, match="ecotrain data speech-digits"):
        D.load(tmp_path / "none")


@needs_espeak
def test_speech_fit_resumes_exactly(tiny_data, tmp_path):
    from ecotrain.callbacks import Callback
    from ecotrain.config import Config
    from ecotrain.assembly.trainer import fit

    data = D.load(tiny_data)
    src = data.source(data.select(cohort="base"))
    cfg = Config.model_validate({
        "device": "cpu", "data": {"batch_size": 4, "bucketing": True},
        "model": {"name": "ecotrain.speech.model:AcousticModel", "kwargs": {"channels": 16, "hidden": 16}},
        "loop": {"max_steps": 12, "max_epochs": None, "grad_clip": 1.0, "log_every": 4},
        "checkpoint": {"every_n_steps": 6}, "ledger": {"energy": "off"}})
    full = fit(cfg, data=D.bundle(src), loss_fn=CTCTask(), run_dir=tmp_path / "full", quiet=True)
    assert full.summary["padding_ratio"] < 0.5  # bucketing sorted the lengths

    class SigtermAt(Callback):  # the real handler: a checkpoint at the end of this step, then stop
        def on_step_start(self, state):
            if state.step == 7:
                os.kill(os.getpid(), signal.SIGTERM)

    cut = fit(cfg, data=D.bundle(src), loss_fn=CTCTask(), run_dir=tmp_path / "cut", quiet=True, callbacks=[SigtermAt()])
    assert cut.summary["stopped_because"] == "preempted" and cut.state.step == 8
    fit(cfg, data=D.bundle(src), loss_fn=CTCTask(), run_dir=tmp_path / "cut", quiet=True,
        resume=cut.state.last_checkpoint)
    a, b = load_file(tmp_path / "full" / "model.safetensors"), load_file(tmp_path / "cut" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


@needs_espeak
def test_replay_buffer_is_bounded_and_cohort_balanced(tiny_data):
    data = D.load(tiny_data)
    rep = Replay(size=6, seed=0)
    base = data.select(cohort="base", split="train")
    rep.add(data, base, [data.rows[i]["transcript"].split() for i in base])
    de = data.select(cohort="accent_de", split="train")
    rep.add(data, de, [data.rows[i]["transcript"].split() for i in de])
    cohorts = [c for _, _, c in rep.items]
    assert len(cohorts) == 6 and cohorts.count("accent_de") == 3
    assert len(rep.sample(data, 4, seed=0)) == 4


@needs_espeak
def test_checks_run_on_real_utterances(tiny_data):
    data = D.load(tiny_data)
    src = data.source(data.select(cohort="accent_de"))
    torch.manual_seed(0)
    model = AcousticModel(channels=16, hidden=16)
    scores, hyps = contradiction_scores(model, src)
    assert scores.shape == (len(src),) and len(hyps) == len(src) and torch.isfinite(scores).all()
    post = frame_posteriors(model, src)
    assert post.shape[1] == 11 and torch.allclose(post.sum(1), torch.ones(len(post)), atol=1e-5)
    assert len(post) == int(out_lengths(src.lengths).sum())
