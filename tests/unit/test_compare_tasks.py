"""`compare` of runs of different tasks gives no verdict: a classifier's test_accuracy and a language
model's (per token) share a name, not a meaning. The task is config.yaml's `task.name`, or for `auto`
what the summary's metrics say."""

import json
from pathlib import Path

import pytest

from ecotrain.accounting.compare import compare, judge, run_task
from ecotrain.base.errors import ConfigError
from ecotrain.cli import main
from tests.unit.test_accounting_compare import make_run


def _as(run, task=None, **summary):
    """`run` made a run of `task` (config.yaml task.name; None: auto) with these summary figures added."""
    run = Path(run)
    if task is not None:
        (run / "config.yaml").write_text((run / "config.yaml").read_text() + f"task:\n  name: {task}\n")
    data = json.loads((run / "summary.json").read_text())
    data.update(summary)
    (run / "summary.json").write_text(json.dumps(data))
    return str(run)


def test_a_classifier_against_a_language_model_is_refused_in_one_line(tmp_path):
    clf = _as(make_run(tmp_path / "clf", 0.90, 1.0), "classification")
    lm = _as(make_run(tmp_path / "lm", 0.91, 0.4), "language_model", test_perplexity=12.0)
    with pytest.raises(ConfigError) as err:
        judge([clf], [lm])
    line = str(err.value)
    assert "\n" not in line
    assert line == (f"compare: the runs are of different tasks (baseline {clf}: classification; candidate {lm}: "
                    "language model): test_accuracy and their costs do not measure the same thing; compare runs "
                    "of one task (no verdict)")


def test_auto_runs_are_told_apart_by_their_metrics(tmp_path):
    """No task in config.yaml (auto): a perplexity says language model, accuracy alone says nothing."""
    clf = _as(make_run(tmp_path / "clf", 0.90, 1.0), "classification")
    lm = _as(make_run(tmp_path / "lm", 0.91, 0.4), test_perplexity=12.0, test_bits_per_char=3.6)
    reg = _as(make_run(tmp_path / "reg", 0.91, 0.4), test_mse=0.2)
    plain = make_run(tmp_path / "plain", 0.89, 0.4)
    assert [run_task(r, json.loads((Path(r) / "summary.json").read_text())) for r in (clf, lm, reg, plain)] == \
        ["classification", "language_model", "regression", None]
    for other in (lm, reg):
        with pytest.raises(ConfigError, match="the runs are of different tasks"):
            judge([clf], [other])
    assert compare([clf], [plain])[1]  # a task the files do not tell is not held against the other


def test_one_task_on_both_sides_still_gets_its_verdict(tmp_path):
    base = _as(make_run(tmp_path / "a", 0.90, 1.0), "classification")
    cand = _as(make_run(tmp_path / "b", 0.895, 0.4), "classification")
    report, ok = compare([base], [cand])
    assert ok and "verdict: PASS" in report
    lms = [_as(make_run(tmp_path / f"lm{i}", 0.5, 1.0 - i * 0.6), test_perplexity=10.0 + i) for i in range(2)]
    text, ok = compare([lms[0]], [lms[1]], max_accuracy_drop=2.0, metric="test_perplexity")
    assert ok and "verdict: PASS" in text


def test_a_mixed_side_is_refused_too(tmp_path):
    base = [_as(make_run(tmp_path / f"c{i}", 0.9, 1.0, seed=i), "classification") for i in range(2)]
    cand = [_as(make_run(tmp_path / "c2", 0.9, 0.4, seed=0), "classification"),
            _as(make_run(tmp_path / "s3", 0.9, 0.4, seed=1), "sequence")]
    with pytest.raises(ConfigError, match=r"classification; candidate .*s3: sequence\)"):
        judge(base, cand)


def test_the_cli_says_it_in_one_line_and_no_verdict(tmp_path, capsys):
    clf = _as(make_run(tmp_path / "clf", 0.90, 1.0), "classification")
    lm = _as(make_run(tmp_path / "lm", 0.91, 0.4), "language_model", test_perplexity=12.0)
    code = main(["compare", "--baseline", clf, "--candidate", lm])
    captured = capsys.readouterr()
    assert code != 0 and "verdict" not in captured.out
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and "different tasks" in err and "Traceback" not in err
