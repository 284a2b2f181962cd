"""Drift of incoming data, seen through the current model: does it look like what the model knows?

The model's predictions on a reference set (the holdout) are compared with its predictions on the
incoming data:
- `label_shift`: total variation distance between the predicted-label distributions (0 to 1);
- `confidence_shift`: mean top-class probability, incoming minus reference;
- `ece`: expected calibration error on the incoming data (labels needed), and on the reference for
  comparison: 15 equal-width confidence bins, L1, as torchmetrics' `multiclass_calibration_error`
  computes it (equal to it to 1e-6 on random data). Not torchmetrics itself: importing it took twice
  torch's own import time here (12 s vs 6 s on a loaded 2-core machine), more than a small update's
  whole training, for ten lines of arithmetic;
- `cohort_error`: error rate per cohort key of the incoming data.
Past a threshold, an alert line names the figure; the lines go to the log and the version's meta.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class DriftThresholds:
    label_shift: float = 0.3  # total variation distance
    confidence_shift: float = 0.15  # absolute change of the mean top-class probability
    ece: float = 0.15
    cohort_error: float = 0.5  # error rate of any one cohort


def ece(probs: torch.Tensor, y: torch.Tensor, n_bins: int = 15) -> float:
    """sum over bins of |accuracy - mean confidence| x the bin's share of examples; bins (lo, hi]."""
    conf, pred = probs.float().max(-1)
    hit = (pred == y).float()
    bins = (torch.ceil(conf * n_bins).long() - 1).clamp(0, n_bins - 1)
    count = torch.bincount(bins, minlength=n_bins).float()
    gap = torch.bincount(bins, hit, n_bins) - torch.bincount(bins, conf, n_bins)  # per bin: sum(acc - conf)
    return float(gap.abs().sum() / count.sum().clamp(min=1))


def label_distribution(probs: torch.Tensor) -> torch.Tensor:
    return torch.bincount(probs.argmax(-1), minlength=probs.shape[1]).float() / max(len(probs), 1)


def drift_report(ref_probs: Optional[torch.Tensor], ref_y: Optional[torch.Tensor], new_probs: torch.Tensor,
                 new_y: Optional[torch.Tensor], cohort: Optional[torch.Tensor],
                 th: DriftThresholds = DriftThresholds()) -> dict:
    """The figures above and `alerts` (lines); reference-based figures are None without a reference."""
    out: dict = {"samples": len(new_probs), "confidence": round(float(new_probs.max(-1).values.mean()), 6)}
    alerts = []
    if ref_probs is not None and len(ref_probs):
        tv = 0.5 * float((label_distribution(ref_probs) - label_distribution(new_probs)).abs().sum())
        ref_conf = float(ref_probs.max(-1).values.mean())
        out.update(label_shift=round(tv, 6), reference_confidence=round(ref_conf, 6),
                   confidence_shift=round(out["confidence"] - ref_conf, 6))
        if tv > th.label_shift:
            alerts.append(f"drift alert: predicted-label distribution shifted by {tv:.3f} (total variation; "
                          f"threshold {th.label_shift})")
        if abs(out["confidence_shift"]) > th.confidence_shift:
            alerts.append(f"drift alert: mean confidence {ref_conf:.3f} -> {out['confidence']:.3f} "
                          f"(threshold {th.confidence_shift})")
        if ref_y is not None:
            out["reference_ece"] = round(ece(ref_probs, ref_y), 6)
    if new_y is not None:
        out["ece"] = round(ece(new_probs, new_y), 6)
        if out["ece"] > th.ece:
            alerts.append(f"drift alert: calibration error (ECE) {out['ece']:.3f} on the incoming data "
                          f"(threshold {th.ece})")
        if cohort is not None:
            wrong = (new_probs.argmax(-1) != new_y).float()
            out["cohort_error"] = {str(int(c)): round(float(wrong[cohort == c].mean()), 6) for c in torch.unique(cohort)}
            bad = {c: e for c, e in out["cohort_error"].items() if e > th.cohort_error}
            if bad:
                worst = max(bad, key=bad.get)
                alerts.append(f"drift alert: {len(bad)} cohort(s) with error above {th.cohort_error}, worst "
                              f"cohort {worst} at {bad[worst]:.3f}")
    out["alerts"] = alerts
    return out
