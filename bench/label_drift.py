"""Label drift over rounds, measured: how often `continual.label_drift.LabelDrift` flags an annotator whose
labels change convention or quality, and how often it flags one who did not change.

    .venv/bin/python bench/label_drift.py [--trials 40] [--seed 1000] [--out runs/bench-label-drift] [--quick]

A witness model is trained with `ecotrain fit` on MNIST-1D (the demo's CNN, real training); the labelling is
simulated on the held-out pool it never trained on: per trial, 5 annotators label 200 random pool examples
each per round over 6 rounds, each with an honest error rate drawn from 2-5% (a wrong class at random).
One annotator drifts from a random round >= 2 on, alternately:
- `convention`: every example of one class c is labelled d (a renamed class, a new guideline misread);
- `quality`: its error rate rises to 20%.
Detected: an alarm for that annotator in its first drifted round. False alarms: alarms for annotators
(or rounds) that did not drift, over all such annotator-rounds tested. alpha = 0.01 per round
(Bonferroni over the round's tests), min_labels 30. Designed on trial seed 0; reported on trial seeds
from --seed (default 1000) on, which no design step read.

Ends with `RESULT label_drift_detected=K/N label_drift_detected_convention=K/N
label_drift_detected_quality=K/N label_drift_false_alarms=F/M label_drift_false_alarm_rate=...`.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch

from ecotrain import Config, fit
from ecotrain.continual.label_drift import LabelDrift
from ecotrain.continual.scenario import write_tasks

ANNOTATORS, ROUNDS, PER_ROUND, DRIFTED_ERROR = 5, 6, 200, 0.20


def witness(out: Path, steps: int = 3000) -> tuple[np.ndarray, np.ndarray]:
    """(the model's predictions, the true labels) on a pool it never trained on."""
    tasks = write_tasks(out / "tasks", num_samples=8000, tasks=5, seed=0)
    all_npz = tasks[0].parent / "all.npz"
    cfg = Config.model_validate({
        "name": "witness", "seed": 0, "threads": 1,
        "data": {"name": "npz", "path": str(all_npz), "num_classes": 10, "batch_size": 64},
        "model": {"name": "cnn"}, "optim": {"name": "adamw", "lr": 0.01},
        "loop": {"max_steps": steps, "max_epochs": None, "log_every": 500},
        "logging": {"progress": "off"}, "ledger": {"enabled": False}})
    result = fit(cfg, run_dir=out / "witness", quiet=True, overwrite=True)
    z = np.load(all_npz)
    model = result.model.eval()
    with torch.inference_mode():
        pred = model(torch.as_tensor(z["x_test"], dtype=torch.float32)).argmax(-1).numpy()
    return pred, z["y_test"]


def trial(seed: int, pred: np.ndarray, truth: np.ndarray, kind: str) -> tuple[bool, int, int]:
    """(detected at onset, false alarms, honest annotator-rounds tested)."""
    rng = np.random.default_rng(seed)
    honest = rng.uniform(0.02, 0.05, ANNOTATORS)
    who_drifts, onset = int(rng.integers(ANNOTATORS)), int(rng.integers(2, ROUNDS))
    c, d = rng.choice(10, 2, replace=False)
    det = LabelDrift(alpha=0.01, min_labels=30)
    detected, false, tested = False, 0, 0
    for r in range(ROUNDS):
        preds, labels, who = [], [], []
        for a in range(ANNOTATORS):
            idx = rng.integers(0, len(truth), PER_ROUND)
            y = truth[idx].copy()
            drifting = a == who_drifts and r >= onset
            err = DRIFTED_ERROR if drifting and kind == "quality" else honest[a]
            wrong = rng.random(PER_ROUND) < err
            y[wrong] = (y[wrong] + rng.integers(1, 10, int(wrong.sum()))) % 10
            if drifting and kind == "convention":
                y[truth[idx] == c] = d
            preds.append(pred[idx])
            labels.append(y)
            who += [f"a{a}"] * PER_ROUND
        alarms = {al.annotator for al in det.observe(np.concatenate(preds), np.concatenate(labels), np.array(who))}
        if r == 0:
            continue  # no history yet: nothing is tested
        for a in range(ANNOTATORS):
            drifting = a == who_drifts and r >= onset
            if drifting:
                if r == onset:
                    detected = f"a{a}" in alarms
            else:
                tested += 1
                false += f"a{a}" in alarms
    return detected, false, tested


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1000, help="the first trial seed (design used 0)")
    ap.add_argument("--out", default="runs/bench-label-drift")
    ap.add_argument("--quick", action="store_true", help="a short witness and 4 trials: the plumbing, not a figure")
    args = ap.parse_args()
    if args.quick:
        args.trials, args.out = 4, str(Path(tempfile.mkdtemp()) / "label-drift")
    pred, truth = witness(Path(args.out), 300 if args.quick else 3000)
    print(f"witness model: accuracy {float((pred == truth).mean()):.4f} on {len(truth)} pool examples")
    got = {"convention": [], "quality": []}
    false = tested = 0
    for t in range(args.trials):
        kind = ("convention", "quality")[t % 2]
        hit, f, n = trial(args.seed + t, pred, truth, kind)
        got[kind].append(hit)
        false, tested = false + f, tested + n
    det = sum(sum(v) for v in got.values())
    n = sum(len(v) for v in got.values())
    print(f"RESULT label_drift_detected={det}/{n} label_drift_detected_convention={sum(got['convention'])}/"
          f"{len(got['convention'])} label_drift_detected_quality={sum(got['quality'])}/{len(got['quality'])} "
          f"label_drift_false_alarms={false}/{tested} label_drift_false_alarm_rate={false / max(tested, 1):.4f} "
          f"trial_seeds={args.seed}-{args.seed + args.trials - 1}")


if __name__ == "__main__":
    main()
