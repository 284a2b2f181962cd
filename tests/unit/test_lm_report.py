"""The report's fit diagnosis of a language model, on hand-made perplexity curves (report/diagnosis.py
`diagnose_lm`), and a run folder read as an LM's (report/rundata.py)."""

import json
import math

from ecotrain.report import diagnose_run
from ecotrain.report.diagnosis import diagnose_lm
from ecotrain.report.rundata import read_run

STEPS = [100, 200, 300, 400, 500, 600]


def pts(values):
    return list(zip(STEPS, values))


def test_validation_perplexity_rising_while_training_falls_is_overfitting():
    d = diagnose_lm(pts([40, 20, 12, 14, 16, 18]), pts([45, 20, 10, 6, 4, 3]),
                    {"train_perplexity": 3.1, "val_perplexity": 12.0, "best_step": 300, "steps": 600})
    assert d.verdict == "overfitting" and d.rises_from == 300
    assert d.text.startswith("Validation perplexity rises from step 300 (12 to 18, +50%) while training perplexity "
                             "falls (10 to 3.5)")


def test_both_high_and_flat_is_underfitting_and_a_small_gap_with_flat_validation_is_a_good_fit():
    flat = diagnose_lm(pts([250, 248, 247, 247, 246, 246]), pts([255, 250, 249, 248, 247, 247]),
                       {"train_perplexity": 245.0, "val_perplexity": 246.0})
    assert flat.verdict == "underfitting" and "both high and flat" in flat.text
    good = diagnose_lm(pts([40, 20, 12, 11.5, 11.4, 11.45]), pts([45, 20, 12, 11, 10.5, 10.4]),
                       {"train_perplexity": 10.2, "val_perplexity": 11.4})
    assert good.verdict == "good fit", good.text
    gap = diagnose_lm(pts([40, 20, 12, 11.5, 11.4, 11.45]), pts([45, 20, 12, 11, 10.5, 10.4]),
                      {"train_perplexity": 8.0, "val_perplexity": 11.4})
    assert gap.verdict == "overfitting" and "43% higher" in gap.text  # the gap rule: >= 25%


def test_a_run_folder_with_perplexity_is_diagnosed_on_it(tmp_path):
    (tmp_path / "config.yaml").write_text("name: lm\n")
    logs = [{"step": s, "loss": math.log(v), "loss_task": math.log(v), "loss_replay": 1.0}
            for s, v in pts([45, 20, 10, 6, 4, 3])]
    evals = [{"step": s, "val_loss": math.log(v), "val_perplexity": v, "val_accuracy": 0.1}
             for s, v in pts([40, 20, 12, 14, 16, 18])]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in logs + evals))
    run = read_run(tmp_path)
    assert run.is_lm and run.metric == "val_perplexity"
    assert [round(v, 6) for _, v in run.train_perplexity()] == [45, 20, 10, 6, 4, 3]  # exp(loss_task)
    assert diagnose_run(run).verdict == "overfitting"  # token accuracy (0.1) is not read as underfitting
