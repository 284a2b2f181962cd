"""`ecotrain lr-find`: the range test's curve and suggestion, its files, and no run folder left behind."""

import json
import math

import pytest

from ecotrain.cli import main
from ecotrain.assembly.lrfind import smoothed, suggest

TINY = """name: tiny
data: {name: digits, batch_size: 32, val_split: 0.15}
model: {name: mlp, kwargs: {hidden: [16]}}
optim: {lr: 0.003}
schedule: {name: cosine, warmup: 50}
loop: {max_steps: 100, max_epochs: null}
"""


def test_smoothing_is_bias_corrected_and_suggestion_sits_on_the_descent():
    assert smoothed([2.0, 2.0, 2.0], 0.9) == pytest.approx([2.0, 2.0, 2.0])  # not pulled towards 0
    lrs = [10 ** (-4 + 4 * i / 99) for i in range(100)]
    # flat, a steep descent centred at 1e-2, a minimum at ~0.3, then a blow-up
    loss = [2 - 1.5 / (1 + math.exp(-6 * (math.log10(lr) + 2))) + max(0.0, math.log10(lr) + 0.5) * 8 for lr in lrs]
    s = suggest(lrs, loss)
    assert 5e-3 < s["steepest"] < 2e-2
    assert 0.1 < s["min_loss_lr"] < 0.5
    assert s["lr"] == s["steepest"] and s["cautious"] == pytest.approx(s["min_loss_lr"] / 10)


def test_lr_find_writes_a_plot_and_a_curve_not_a_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.yaml").write_text(TINY)
    assert main(["lr-find", "tiny.yaml", "--steps", "40", "--start", "1e-4", "--end", "10"]) == 0
    out = capsys.readouterr().out
    assert "suggested lr:" in out
    curve = json.loads((tmp_path / "runs" / "tiny-lrfind.json").read_text())
    lrs = curve["lrs"]
    assert lrs[0] == pytest.approx(1e-4) and all(b > a for a, b in zip(lrs, lrs[1:]))
    assert len(curve["losses"]) == len(lrs) <= 40 and all(math.isfinite(v) for v in curve["losses"])
    assert min(curve["smoothed"]) < curve["smoothed"][0]  # it trained: the loss fell somewhere on the sweep
    assert 1e-4 <= curve["suggestion"]["lr"] <= 10
    png = tmp_path / "runs" / "tiny-lrfind.png"
    assert "plot: skipped" in out or png.read_bytes()[:4] == b"\x89PNG"
    # only the two files: nothing that looks like a run (config.yaml, metrics.jsonl, checkpoints)
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["tiny-lrfind.json", "tiny-lrfind.png"]


def test_lr_find_bad_options_are_one_line(tmp_path, capsys):
    (tmp_path / "tiny.yaml").write_text(TINY)
    for opts, msg in ((["--steps", "3"], "at least 10 steps"), (["--start", "1", "--end", "0.1"], "need 0 < start"),
                      (["--out", str(tmp_path)], "is a folder")):
        assert main(["lr-find", str(tmp_path / "tiny.yaml"), *opts]) != 0
        err = capsys.readouterr().err
        assert msg in err and len(err.strip().splitlines()) == 1
