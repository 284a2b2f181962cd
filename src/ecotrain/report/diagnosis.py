"""Over- or underfitting, in plain words, from a run's learning curves (docs/report.md "Diagnosis").

Inputs, all read from the run folder: the validation evaluations of metrics.jsonl (`val_loss`, and
`val_accuracy` when the task has it), the training loss of its log records (the mean over each log
interval, in training mode), and summary.json's final figures (`train_accuracy` and
`val_accuracy` measured on the final weights in eval mode, `best_step`, `stopped_because`).

The rules, in order (the thresholds are the constants below):

1. **Overfitting, from the curves**: at least `MIN_EVALS` evaluations, the lowest validation loss
   is followed by at least two more, the last two are both `RISE` (10%) or more above that minimum,
   and the training loss at the end is `TRAIN_FALL` (10%) or more below its value at the minimum:
   "validation loss rises from step S while training loss falls".
2. **Overfitting, from the gap**: final training accuracy minus validation accuracy >= `GAP` (0.10).
3. **Underfitting**: the train/val accuracy gap is under `GAP` and either
   - the model is still learning: the best evaluation is one of the last two, and the validation
     loss fell over the last half of the evaluations by at least `STILL_SHARE` (20%) of its whole
     fall since the first evaluation and by at least `STILL_MIN` (0.5%) of its value; or
   - training accuracy is below `LOW_ACCURACY` (0.5): the model does not fit its own training set.
   (The same rise without the training loss falling is called **unstable** training, not overfitting.)
4. Otherwise **a good fit**: validation loss is flat near its minimum and the gap is small (a gap
   of `MODERATE_GAP` (0.05) or more is named).

Early stopping is named when it ended the run, with the step whose weights were restored; without
it, the step whose weights were kept (the best evaluation) is named when it is not the last.

**Language models** (`diagnose_lm`: a run whose evaluations hold `val_perplexity`) are read on
perplexity curves instead, token accuracy left aside (an LM's is low whatever its fit):

1. **Overfitting, from the curves**: rule 1 above on the validation perplexity and the training
   perplexity (exp of the log intervals' task loss): "validation perplexity rises from step S while
   training perplexity falls".
2. **Overfitting, from the gap**: the final validation perplexity `PPL_GAP` (25%) or more above the
   final training perplexity (both on the final weights in eval mode).
3. **Underfitting**, the gap under `PPL_GAP` and either the validation perplexity still falling at
   the end (rule 3 above, on perplexity) or both curves high and flat: the training perplexity fell
   less than `FLAT_FALL` (10%) from its first log interval to its last.
4. Otherwise **a good fit**.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

MIN_EVALS = 3
RISE = 0.10
TRAIN_FALL = 0.10
GAP = 0.10
MODERATE_GAP = 0.05
STILL_SHARE = 0.20
STILL_MIN = 0.005
LOW_ACCURACY = 0.5
PPL_GAP = 0.25
FLAT_FALL = 0.10


@dataclass
class Diagnosis:
    verdict: str  # overfitting | underfitting | good fit | unstable | not enough data
    text: str  # one paragraph, plain words
    evidence: list[str] = field(default_factory=list)  # the figures each rule looked at
    rises_from: Optional[int] = None  # overfitting from the curves: the step of the validation minimum


def _steps(n: int) -> str:
    return f"{n:,}"


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%"


def _nearest_before(points: Sequence[tuple[int, float]], step: int) -> Optional[float]:
    """The value of the last point at or before `step` (else the first point)."""
    best = None
    for s, v in points:
        if s <= step or best is None:
            best = v
        if s > step:
            break
    return best


def _tail_mean(points: Sequence[tuple[int, float]], k: int = 2) -> Optional[float]:
    vals = [v for _, v in points[-k:]]
    return sum(vals) / len(vals) if vals else None


def diagnose(evals: Sequence[tuple[int, float]], train: Sequence[tuple[int, float]], summary: dict,
             early_stopping: Optional[dict] = None) -> Diagnosis:
    """`evals`: (step, val_loss) per evaluation; `train`: (step, training loss) per log record;
    `summary`: summary.json; `early_stopping`: the config's early_stopping section."""
    evals = [(s, v) for s, v in evals if v is not None and math.isfinite(v)]
    train = [(s, v) for s, v in train if v is not None and math.isfinite(v)]
    evidence: list[str] = []
    acc_t, acc_v = summary.get("train_accuracy"), summary.get("val_accuracy")
    gap = acc_t - acc_v if isinstance(acc_t, (int, float)) and isinstance(acc_v, (int, float)) else None
    if gap is not None:
        evidence.append(f"final train accuracy {acc_t:.3f}, validation {acc_v:.3f}: gap {gap:+.3f} "
                        f"(overfitting at >= {GAP:g})")
    n = len(evals)
    after = _after_note(summary, early_stopping, evals)

    # 1. overfitting from the curves
    rises_from = None
    if n >= MIN_EVALS:
        i_min = min(range(n), key=lambda i: evals[i][1])
        s_min, v_min = evals[i_min]
        last_two = [v for _, v in evals[-2:]]
        if i_min <= n - 3 and v_min > 0:
            rise = min(last_two) / v_min - 1
            t_at, t_end = _nearest_before(train, s_min), _tail_mean(train)
            evidence.append(f"validation loss: minimum {v_min:.4g} at step {_steps(s_min)}, last two evaluations "
                            f"{', '.join(f'{v:.4g}' for v in last_two)} ({rise:+.1%}; overfitting at >= +{_pct(RISE)})")
            if t_at is not None and t_end is not None:
                evidence.append(f"training loss: {t_at:.4g} at step {_steps(s_min)}, {t_end:.4g} at the end")
            train_falls = t_at is not None and t_end is not None and t_end <= t_at * (1 - TRAIN_FALL)
            if rise >= RISE and train_falls:
                rises_from = s_min
                text = (f"Validation loss rises from step {_steps(s_min)} ({v_min:.3g} to {evals[-1][1]:.3g}, "
                        f"+{_pct(evals[-1][1] / v_min - 1)}) while training loss falls ({t_at:.3g} to {t_end:.3g}): "
                        "overfitting. The model memorises its training set; more data, augmentation, weight "
                        "decay, dropout or a smaller model would help, and early stopping keeps the best weights.")
                return Diagnosis("overfitting", _join(text, after), evidence, rises_from)
            if rise >= RISE:
                unstable = (f"Validation loss ends {_pct(evals[-1][1] / v_min - 1)} above its minimum (step "
                            f"{_steps(s_min)}) while training loss did not fall: unstable training rather than "
                            "overfitting; a lower learning rate or a decaying schedule may help.")
                return Diagnosis("unstable", _join(unstable, after), evidence)
        else:
            evidence.append(f"validation loss: best at step {_steps(s_min)}, "
                            f"{'the last' if i_min == n - 1 else 'one of the last two'} evaluation(s)")

    # 2. overfitting from the gap
    if gap is not None and gap >= GAP:
        text = (f"Training accuracy is {acc_t:.3f} but validation accuracy only {acc_v:.3f}, a gap of "
                f"{gap * 100:.0f} points: overfitting. The model fits its training set far better than unseen "
                "data; more data, augmentation, weight decay or dropout would help.")
        return Diagnosis("overfitting", _join(text, after), evidence)

    # 3. underfitting
    still, how = _still_learning(evals)
    if how:
        evidence.append(how)
    low = isinstance(acc_t, (int, float)) and acc_t < LOW_ACCURACY
    if isinstance(acc_t, (int, float)):
        evidence.append(f"final train accuracy {acc_t:.3f} (low below {LOW_ACCURACY:g})")
    if still or low:
        if low and still:
            what = (f"Training and validation accuracy are both low ({acc_t:.3f} and {acc_v:.3f}) and still "
                    "rising at the end")
        elif low:
            what = (f"Training accuracy is only {acc_t:.3f}" + (f" (validation {acc_v:.3f})" if acc_v is not None
                                                                  else "") + ": the model does not fit even its "
                    "training data")
        else:
            what = f"Validation loss was still falling at the end ({how})"
        text = (f"{what}: underfitting. Train longer (more steps), raise the learning rate, or use a bigger "
                "model.")
        return Diagnosis("underfitting", _join(text, after), evidence)

    # 4. a good fit
    if n < MIN_EVALS and gap is None:
        return Diagnosis("not enough data", _join(f"Only {n} evaluation(s) and no final train/validation "
                                                  "accuracy: too little to judge the fit (set loop.eval_every "
                                                  "for more evaluations).", after), evidence)
    parts = []
    if n >= 2:
        i_min = min(range(n), key=lambda i: evals[i][1])
        s_min, v_min = evals[i_min]
        if i_min == n - 1:
            parts.append("validation loss is lowest at the last evaluation but has flattened"
                         + (f" ({how})" if how else ""))
        else:
            parts.append(f"validation loss ends within {_pct(evals[-1][1] / v_min - 1) if v_min > 0 else '0%'} of "
                         f"its minimum (step {_steps(s_min)})")
    if gap is not None:
        parts.append(f"the train/validation accuracy gap is {gap:.3f}")
    text = "A good fit: " + " and ".join(parts) + "." if parts else "A good fit."
    if gap is not None and gap >= MODERATE_GAP:
        text += (f" The gap is moderate (>= {MODERATE_GAP:g}); weight decay, dropout or augmentation may "
                 "narrow it.")
    if n < MIN_EVALS:
        text += f" Only {n} evaluation(s): the trend is not judged."
    return Diagnosis("good fit", _join(text, after), evidence)


def _still_learning(evals) -> tuple[bool, str]:
    n = len(evals)
    if n < MIN_EVALS:
        return False, ""
    h = (n - 1) // 2  # the last half of the evaluations starts here
    first, half, last = evals[0][1], evals[h][1], evals[-1][1]
    i_min = min(range(n), key=lambda i: evals[i][1])
    total, recent = first - last, half - last
    if total <= 0 or half <= 0:
        return False, "validation loss did not fall overall"
    how = (f"validation loss fell {recent / half:.1%} over the last {n - h} evaluations, "
           f"{max(recent, 0) / total:.0%} of its whole fall")
    still = i_min >= n - 2 and recent >= STILL_SHARE * total and recent >= STILL_MIN * half
    return still, how


def _after_note(summary: dict, early_stopping: Optional[dict], evals) -> str:
    best, stopped = summary.get("best_step"), summary.get("stopped_because")
    es = early_stopping or {}
    if stopped == "early_stopping":
        if es.get("restore_best", True) and best is not None:
            return (f"Early stopping ended the run at step {_steps(summary.get('steps', 0))} and restored step "
                    f"{_steps(best)}'s weights (the best {summary.get('monitor', 'val_loss')}).")
        return f"Early stopping ended the run at step {_steps(summary.get('steps', 0))}; the last weights were kept."
    if best is not None and evals and best != evals[-1][0] and not es.get("enabled"):
        return (f"The saved and tested model is step {_steps(best)}'s (the best {summary.get('monitor', 'val_loss')}), "
                "not the last step's.")
    return ""


def _join(text: str, after: str) -> str:
    return f"{text} {after}".strip()


def diagnose_lm(evals: Sequence[tuple[int, float]], train: Sequence[tuple[int, float]], summary: dict,
                early_stopping: Optional[dict] = None) -> Diagnosis:
    """A language model's fit from perplexity curves: `evals` (step, val_perplexity) per evaluation,
    `train` (step, training perplexity) per log record; `summary`: summary.json (its final
    `train_perplexity` and `val_perplexity`)."""
    evals = [(s, v) for s, v in evals if v is not None and math.isfinite(v) and v > 0]
    train = [(s, v) for s, v in train if v is not None and math.isfinite(v) and v > 0]
    evidence: list[str] = []
    p_t, p_v = summary.get("train_perplexity"), summary.get("val_perplexity")
    gap = p_v / p_t - 1 if isinstance(p_t, (int, float)) and isinstance(p_v, (int, float)) and p_t > 0 else None
    if gap is not None:
        evidence.append(f"final perplexity: train {p_t:.4g}, validation {p_v:.4g}: validation {gap:+.1%} "
                        f"(overfitting at >= +{_pct(PPL_GAP)})")
    n = len(evals)
    after = _after_note(summary, early_stopping, evals)

    # 1. overfitting from the curves
    if n >= MIN_EVALS:
        i_min = min(range(n), key=lambda i: evals[i][1])
        s_min, v_min = evals[i_min]
        if i_min <= n - 3:
            last_two = [v for _, v in evals[-2:]]
            rise = min(last_two) / v_min - 1
            t_at, t_end = _nearest_before(train, s_min), _tail_mean(train)
            evidence.append(f"validation perplexity: minimum {v_min:.4g} at step {_steps(s_min)}, last two "
                            f"evaluations {', '.join(f'{v:.4g}' for v in last_two)} ({rise:+.1%}; overfitting at "
                            f">= +{_pct(RISE)})")
            if t_at is not None and t_end is not None:
                evidence.append(f"training perplexity: {t_at:.4g} at step {_steps(s_min)}, {t_end:.4g} at the end")
            falls = t_at is not None and t_end is not None and t_end <= t_at * (1 - TRAIN_FALL)
            if rise >= RISE and falls:
                text = (f"Validation perplexity rises from step {_steps(s_min)} ({v_min:.4g} to {evals[-1][1]:.4g}, "
                        f"+{_pct(evals[-1][1] / v_min - 1)}) while training perplexity falls ({t_at:.4g} to "
                        f"{t_end:.4g}): overfitting. The model memorises its training text; more text (or fewer "
                        "passes over it), dropout, weight decay or a smaller model would help, and early stopping "
                        "on val_perplexity keeps the best weights.")
                return Diagnosis("overfitting", _join(text, after), evidence, s_min)
            if rise >= RISE:
                text = (f"Validation perplexity ends {_pct(evals[-1][1] / v_min - 1)} above its minimum (step "
                        f"{_steps(s_min)}) while training perplexity did not fall: unstable training rather than "
                        "overfitting; a lower learning rate or a decaying schedule may help.")
                return Diagnosis("unstable", _join(text, after), evidence)

    # 2. overfitting from the gap
    if gap is not None and gap >= PPL_GAP:
        text = (f"Validation perplexity is {p_v:.4g} against {p_t:.4g} on the training text, {_pct(gap)} higher: "
                "overfitting. The model predicts its training text far better than unseen text; more text, "
                "dropout or weight decay would help.")
        return Diagnosis("overfitting", _join(text, after), evidence)

    # 3. underfitting: still falling, or high and flat
    still, how = _still_learning(evals)
    if how:
        evidence.append(how.replace("loss", "perplexity"))
    flat = None
    if len(train) >= 2:
        fall = 1 - train[-1][1] / train[0][1]
        flat = fall < FLAT_FALL
        evidence.append(f"training perplexity {train[0][1]:.4g} (step {_steps(train[0][0])}) to {train[-1][1]:.4g} "
                        f"(step {_steps(train[-1][0])}): fell {fall:.1%} (flat below {_pct(FLAT_FALL)})")
    if still or flat:
        if flat:
            what = (f"Training and validation perplexity are both high and flat (training {train[0][1]:.4g} to "
                    f"{train[-1][1]:.4g}" + (f", validation {p_v:.4g}" if isinstance(p_v, (int, float)) else "")
                    + "): the model hardly learns")
        else:
            what = f"Validation perplexity was still falling at the end ({how.replace('loss', 'perplexity')})"
        text = (f"{what}: underfitting. Train longer (more tokens), raise the learning rate, or use a bigger "
                "model.")
        return Diagnosis("underfitting", _join(text, after), evidence)

    # 4. a good fit
    if n < MIN_EVALS and gap is None:
        return Diagnosis("not enough data", _join(f"Only {n} evaluation(s) and no final train/validation "
                                                  "perplexity: too little to judge the fit (set loop.eval_every "
                                                  "for more evaluations).", after), evidence)
    parts = []
    if n >= 2:
        i_min = min(range(n), key=lambda i: evals[i][1])
        s_min, v_min = evals[i_min]
        parts.append("validation perplexity is lowest at the last evaluation but has flattened" if i_min == n - 1
                     else f"validation perplexity ends within {_pct(evals[-1][1] / v_min - 1)} of its minimum "
                          f"(step {_steps(s_min)})")
    if gap is not None:
        parts.append(f"validation perplexity is {abs(gap):.1%} {'above' if gap >= 0 else 'below'} the training one")
    text = "A good fit: " + " and ".join(parts) + "." if parts else "A good fit."
    if n < MIN_EVALS:
        text += f" Only {n} evaluation(s): the trend is not judged."
    return Diagnosis("good fit", _join(text, after), evidence)
