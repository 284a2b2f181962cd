"""The report's fit diagnosis on hand-made curves: each rule and its threshold (report/diagnosis.py)."""

from ecotrain.report import diagnosis as D
from ecotrain.report.diagnosis import diagnose


def curve(steps, values):
    return list(zip(steps, values))


STEPS = [100, 200, 300, 400, 500, 600, 700, 800]


def test_overfitting_from_the_curves_names_the_step_it_rises_from():
    val = curve(STEPS, [1.0, 0.6, 0.45, 0.40, 0.44, 0.48, 0.52, 0.55])
    train = curve(STEPS, [1.0, 0.5, 0.3, 0.2, 0.1, 0.05, 0.03, 0.02])
    d = diagnose(val, train, {"train_accuracy": 0.99, "val_accuracy": 0.93, "best_step": 400, "steps": 800,
                              "stopped_because": "max_steps"})
    assert d.verdict == "overfitting" and d.rises_from == 400
    assert d.text.startswith("Validation loss rises from step 400 (0.4 to 0.55, +38%) while training loss falls")
    assert "The saved and tested model is step 400's" in d.text


def test_a_rise_below_the_threshold_or_with_flat_training_loss_is_not_overfitting():
    train = curve(STEPS, [1.0, 0.5, 0.3, 0.2, 0.1, 0.05, 0.03, 0.02])
    small = curve(STEPS, [1.0, 0.6, 0.45, 0.40, 0.41, 0.42, 0.43, 0.43])  # +7.5% < RISE
    assert diagnose(small, train, {"train_accuracy": 0.97, "val_accuracy": 0.95}).verdict == "good fit"
    flat_train = curve(STEPS, [1.0, 0.5, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3])
    rising = curve(STEPS, [1.0, 0.6, 0.45, 0.40, 0.44, 0.48, 0.52, 0.55])
    unstable = diagnose(rising, flat_train, {})  # the rise without memorisation
    assert unstable.verdict == "unstable" and "unstable training rather than overfitting" in unstable.text
    one_spike = curve(STEPS, [1.0, 0.6, 0.45, 0.40, 0.41, 0.42, 0.60, 0.42])  # only the last but one is high
    assert diagnose(one_spike, train, {"train_accuracy": 0.97, "val_accuracy": 0.95}).verdict == "good fit"


def test_early_stopping_restored_step_is_named():
    val = curve(STEPS[:6], [1.0, 0.6, 0.45, 0.40, 0.46, 0.50])
    train = curve(STEPS[:6], [1.0, 0.5, 0.3, 0.2, 0.1, 0.05])
    s = {"best_step": 400, "steps": 600, "stopped_because": "early_stopping", "monitor": "val_loss"}
    d = diagnose(val, train, s, {"enabled": True, "restore_best": True})
    assert d.verdict == "overfitting"
    assert "Early stopping ended the run at step 600 and restored step 400's weights (the best val_loss)" in d.text
    kept = diagnose(val, train, s, {"enabled": True, "restore_best": False})
    assert "the last weights were kept" in kept.text


def test_overfitting_from_the_accuracy_gap():
    val = curve(STEPS[:4], [1.0, 0.8, 0.7, 0.69])
    d = diagnose(val, val, {"train_accuracy": 1.0, "val_accuracy": 0.85})
    assert d.verdict == "overfitting" and "a gap of 15 points" in d.text
    assert diagnose(val, val, {"train_accuracy": 1.0, "val_accuracy": 1.0 - D.GAP + 0.001}).verdict != "overfitting"


def test_underfitting_low_and_still_rising():
    val = curve([10, 20, 30, 40], [2.317, 2.305, 2.293, 2.281])
    d = diagnose(val, val, {"train_accuracy": 0.15, "val_accuracy": 0.125, "best_step": 40})
    assert d.verdict == "underfitting"
    assert d.text.startswith("Training and validation accuracy are both low (0.150 and 0.125) and still rising")
    assert "Train longer" in d.text


def test_underfitting_still_learning_without_accuracy():
    val = curve(STEPS, [3.0, 2.6, 2.3, 2.1, 1.95, 1.8, 1.7, 1.6])  # a language model's loss, still falling
    d = diagnose(val, val, {})
    assert d.verdict == "underfitting" and "still falling at the end" in d.text


def test_a_converged_curve_is_a_good_fit_and_a_moderate_gap_is_named():
    val = curve(STEPS, [1.0, 0.5, 0.3, 0.22, 0.2, 0.195, 0.193, 0.192])  # flattened: the last half adds little
    d = diagnose(val, val, {"train_accuracy": 0.99, "val_accuracy": 0.97})
    assert d.verdict == "good fit" and d.text.startswith("A good fit")
    moderate = diagnose(val, val, {"train_accuracy": 0.99, "val_accuracy": 0.92})
    assert moderate.verdict == "good fit" and "moderate" in moderate.text


def test_too_few_evaluations():
    d = diagnose([(100, 1.0)], [(50, 1.2)], {})
    assert d.verdict == "not enough data" and "loop.eval_every" in d.text
    assert diagnose([], [], {"train_accuracy": 0.98, "val_accuracy": 0.97}).verdict == "good fit"
    assert diagnose([(1, float("nan")), (2, float("inf"))], [], {}).verdict == "not enough data"


def test_report_of_an_unfinished_and_damaged_run(tmp_path):
    """The report reads the run folder's files only: no summary (still running), a broken
    environment.json and a garbage metrics line are notes, not failures."""
    import json

    from ecotrain.report import build_report

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("name: half\nearly_stopping: {enabled: false}\n")
    lines = [{"step": s, "epoch": 0, "loss": 2.0 - s / 100, "lr": 1e-3} for s in (10, 20, 30, 40)]
    lines += [{"step": s, "epoch": 0, "val_loss": 2.1 - s / 100, "val_accuracy": 0.1 + s / 200} for s in (20, 40)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + "{garbage\n")
    (run / "environment.json").write_text("{broken")
    page = build_report([[str(run)]]).read_text()
    assert page.startswith("<!doctype html>") and "ecotrain report: half" in page
    for note in ("no summary.json: the run did not finish", "environment.json: not readable JSON",
                 "metrics.jsonl: 1 unreadable line(s) skipped", "No ledger.json"):
        assert note in page
    assert 'class="diagnosis-text">Only 2 evaluation(s)' in page and page.count("<img ") == 1
