"""A speech model updated from user feedback (issue 15): a base version and 3 feedback rounds, per
round and strategy (naive fine-tune, ecotrain's protected update, per-cohort adapters): WER on the
original voices, WER on the new voices, and whether the gate promoted the version.

    .venv/bin/python bench/speech_feedback.py [--out runs/bench-speech] [--quick] [overrides]

Goals: the protected update cuts the new voices' WER by at least a quarter of the base model's,
the original voices' WER rises by at most 2 points, and >= 90% of the injected wrong transcripts
are caught by the label checks or the gate. Needs espeak-ng (`make speech`). One thread: on a
shared 2-core machine the small GRU's steps are faster without intra-op threads.
Ends with `RESULT strategy=<s> old_wer_rise=<f> new_wer_cut=<f> bad_labels_caught=<int>/<int> ...`
(`result_line` says how the headline strategy is chosen).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from ecotrain.config import load_config
from ecotrain.log import setup_cli_logging
from ecotrain.speech.commands import data_folder
from ecotrain.speech.feedback import FeedbackSettings
from ecotrain.speech.rounds import run, summary_figures, table

QUICK = ["data.kwargs.scale=0.3", "data.kwargs.feedback.base_steps=40", "data.kwargs.feedback.update_steps=10",
         "data.kwargs.feedback.check_steps=5", "data.kwargs.feedback.rounds=[accent_de]"]


def result_line(results: dict, tolerance: float) -> str:
    """The headline strategy is chosen by a rule, not by hand: of ecotrain's two protections, the one
    with the larger new-voice WER cut among those whose original-voice WER rose by at most the
    gate's tolerance (protected when neither qualifies). Both strategies' figures are on the line."""
    figs = {k: summary_figures(results, k) for k in ("protected", "adapters")}
    figs = {k: v for k, v in figs.items() if v}
    ok = [k for k, v in figs.items() if v["old_wer_rise"] <= tolerance + 1e-9]
    best = max(ok, key=lambda k: figs[k]["new_wer_cut"]) if ok else "protected"
    f = figs[best]
    line = (f"RESULT strategy={best} old_wer_rise={f['old_wer_rise']:.4f} new_wer_cut={f['new_wer_cut']:.4f} "
            f"bad_labels_caught={f['bad_caught']}/{f['bad_total']} "
            f"bad_labels_caught_by_checks={f['bad_by_checks']}/{f['bad_total']}")
    for k, v in figs.items():
        if k != best:
            line += f" {k}_old_wer_rise={v['old_wer_rise']:.4f} {k}_new_wer_cut={v['new_wer_cut']:.4f}"
    return line


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/bench-speech")
    p.add_argument("--data", default="runs/speech-digits", help="the dataset folder (made once, then a cache)")
    p.add_argument("--quick", action="store_true", help="tiny: the mechanics only (make test), not the figures")
    p.add_argument("overrides", nargs="*", help="dotted overrides of the recipe, e.g. data.kwargs.feedback.update_lr=0.0003")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    setup_cli_logging()  # the rounds' progress lines on stderr
    overrides = [f"data.kwargs.folder={args.data}"] + (QUICK if args.quick else []) + args.overrides
    cfg = load_config(Path("recipes/speech_feedback.yaml"), overrides)
    t = time.perf_counter()
    data = data_folder(cfg)
    made = time.perf_counter() - t
    results = run(cfg, data, FeedbackSettings.parse(cfg.data.kwargs.get("feedback")), Path(args.out))
    print(table(results))
    for rec in results["rounds"]:
        lab, drift = rec["labels"], rec["drift"]
        print(f"round {rec['round']} ({rec['cohort']}): wrong transcripts {lab['wrong']}, caught by the check "
              f"{lab['wrong_caught']}, correct ones flagged {lab['false_flags']}, formatting variants "
              f"{lab['format']} (normalised {lab['format_normalised']}); drift alerts {len(drift['alerts'])}")
    print(f"data {made:.1f} s, experiment {time.perf_counter() - t - made:.1f} s")
    print(result_line(results, cfg.data.kwargs.get("feedback", {}).get("tolerance", 0.02)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
