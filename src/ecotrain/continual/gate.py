"""The evaluation gate: is a candidate version better than its base?

Both models are evaluated (eval mode) on the same slices: the fixed holdout (the test data of every
task the base has seen) and the recent slice (the new data's test split). The candidate is promoted
only when it improves the recent slice by more than `min_gain` and loses no more than `tolerance` of
average accuracy on the holdout; with `cap` set (kappa), also no more than kappa on any one holdout
slice or cohort: max(0, before - after) <= kappa for each (NVIDIA's "Damage Control" selection rule,
on accuracy or on 1 - WER), so one old cohort cannot pay for another's gain.

Metrics (van de Ven et al.; Lopez-Paz & Ranzato's GEM for backward transfer):
- average accuracy: the mean over tasks (slices) of the accuracy on each;
- forgetting of task i: the best accuracy any earlier version in the lineage had on it minus now;
- backward transfer: mean over old tasks of (accuracy now - accuracy right after the task was learnt);
- per-cohort accuracy: over every slice's examples, grouped by their `cohort` key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn


@dataclass
class GatePolicy:
    tolerance: float = 0.02  # largest allowed drop of the holdout's average accuracy (absolute)
    min_gain: float = 0.0  # the recent slice must improve by more than this (absolute)
    cap: Optional[float] = None  # kappa: largest drop allowed on each holdout slice or cohort on its own


@torch.inference_mode()
def predict_proba(model: nn.Module, x: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
    """Class probabilities (float32, CPU) of `model` in eval mode."""
    was = model.training
    model.eval()
    dev = next(model.parameters()).device
    out = [torch.softmax(model(x[i:i + batch_size].to(dev)).float(), -1).cpu() for i in range(0, len(x), batch_size)]
    model.train(was)
    return torch.cat(out)


def accuracy(probs: torch.Tensor, y: torch.Tensor) -> float:
    return float((probs.argmax(-1) == y).float().mean()) if len(y) else float("nan")


def slice_metrics(model: nn.Module, slices: list) -> dict:
    """{"tasks": {slice name: accuracy}, "average_accuracy", "cohorts": {cohort: accuracy}}."""
    tasks, hits, cohorts = {}, [], []
    for s in slices:
        p = predict_proba(model, s.x)
        tasks[s.name] = round(accuracy(p, s.y), 6)
        if s.cohort is not None:
            hits.append((p.argmax(-1) == s.y).float())
            cohorts.append(s.cohort)
    out = {"tasks": tasks, "average_accuracy": mean_or_none(tasks.values())}
    if cohorts:
        hit, coh = torch.cat(hits), torch.cat(cohorts)
        out["cohorts"] = {str(int(c)): round(float(hit[coh == c].mean()), 6) for c in torch.unique(coh)}
    return out


def lineage_metrics(now: dict, history: list[dict], learnt_at: dict) -> dict:
    """Forgetting and backward transfer of `now` (task -> accuracy), given the per-task accuracies of the
    earlier versions in the lineage (`history`) and the accuracy each task had when it was learnt."""
    forgetting = {}
    for task, acc in now.items():
        earlier = [h[task] for h in history if task in h]
        if earlier:
            forgetting[task] = round(max(earlier) - acc, 6)
    old = [t for t in now if t in learnt_at]
    bwt = mean_or_none(now[t] - learnt_at[t] for t in old) if old else None
    return {"forgetting": forgetting, "average_forgetting": mean_or_none(forgetting.values()) if forgetting else None,
            "backward_transfer": bwt}


def decide(base: dict, cand: dict, holdout: list[str], recent: str, policy: GatePolicy) -> tuple[bool, str]:
    """(promote?, reason) from the two models' per-task accuracies."""
    gain = cand[recent] - base[recent]
    if holdout:
        b_old, c_old = mean_or_none(base[t] for t in holdout), mean_or_none(cand[t] for t in holdout)
        drop = b_old - c_old
        old_txt = f"holdout {b_old:.4f} -> {c_old:.4f} (drop {drop:+.4f}, tolerance {policy.tolerance})"
    else:
        drop, old_txt = 0.0, "no holdout yet"
    new_txt = f"recent '{recent}' {base[recent]:.4f} -> {cand[recent]:.4f} (gain {gain:+.4f}, min {policy.min_gain})"
    if gain <= policy.min_gain + 1e-12:  # the same float margin as the tolerance: 0.55 - 0.50 is 0.05000000000000004
        return False, f"rejected: the recent slice did not improve: {new_txt}; {old_txt}"
    if drop > policy.tolerance + 1e-12:
        return False, f"rejected: forgets the holdout: {old_txt}; {new_txt}"
    if policy.cap is not None:
        worst = max(holdout, key=lambda t: base[t] - cand[t], default=None)
        if worst is not None:
            hit = base[worst] - cand[worst]
            cap_txt = f"'{worst}' {base[worst]:.4f} -> {cand[worst]:.4f} (drop {hit:+.4f}, cap {policy.cap})"
            if hit > policy.cap + 1e-12:
                return False, f"rejected: damages one old slice beyond the cap: {cap_txt}; {new_txt}; {old_txt}"
            old_txt += f"; largest single drop {cap_txt}"
    return True, f"promoted: {new_txt}; {old_txt}"


def mean_or_none(values) -> Optional[float]:
    vals = list(values)
    return round(sum(vals) / len(vals), 6) if vals else None


def decide_perplexity(base: dict, cand: dict, holdout: list[str], recent: str, policy: GatePolicy
                      ) -> tuple[bool, str]:
    """(promote?, reason) from the two models' per-slice perplexities, lower is better: the recent
    slice must fall by more than `min_gain` (relative: 0.05 = 5% lower), the holdout's average
    perplexity may rise by `tolerance` at most (relative: 0.02 = 2% higher; its ratio after/before is
    the update's forgetting_ppl_ratio), and with `cap` no holdout slice alone by more than `cap`."""
    fall = 1 - cand[recent] / base[recent]
    new_txt = (f"recent '{recent}' perplexity {base[recent]:.4g} -> {cand[recent]:.4g} (fall {fall:+.2%}, min "
               f"{policy.min_gain:.2%})")
    if holdout:
        b_old, c_old = mean_or_none(base[t] for t in holdout), mean_or_none(cand[t] for t in holdout)
        rise = c_old / b_old - 1
        old_txt = (f"holdout perplexity {b_old:.4g} -> {c_old:.4g} (rise {rise:+.2%}, tolerance "
                   f"{policy.tolerance:.2%})")
    else:
        rise, old_txt = 0.0, "no holdout yet"
    if fall <= policy.min_gain + 1e-12:
        return False, f"rejected: the recent slice did not improve: {new_txt}; {old_txt}"
    if rise > policy.tolerance + 1e-12:
        return False, f"rejected: forgets the holdout: {old_txt}; {new_txt}"
    if policy.cap is not None and holdout:
        worst = max(holdout, key=lambda t: cand[t] / base[t])
        hit = cand[worst] / base[worst] - 1
        cap_txt = (f"'{worst}' perplexity {base[worst]:.4g} -> {cand[worst]:.4g} (rise {hit:+.2%}, cap "
                   f"{policy.cap:.2%})")
        if hit > policy.cap + 1e-12:
            return False, f"rejected: damages one old slice beyond the cap: {cap_txt}; {new_txt}; {old_txt}"
        old_txt += f"; largest single rise {cap_txt}"
    return True, f"promoted: {new_txt}; {old_txt}"


def choose_average(base_model: nn.Module, cand: nn.Module, before: dict, holdout: list, recent, alphas, policy,
                   measure: Callable, judge: Callable) -> tuple[nn.Module, dict]:
    """Weight averaging (methods/average.py) with alpha chosen on the gate's slices, for any task kind:
    the candidate averaged with the base, alphas tried from the largest (most of the new model) down; the
    first the gate takes wins, else the smallest is what the gate will reject. `measure(model, slices)` ->
    {slice: figure} (accuracy: `slice_metrics`; perplexity: update_lm's), `judge(before, after, holdout,
    recent, policy)` -> (ok, reason) (`decide`, `decide_perplexity`); `before`: the base's figures."""
    from ecotrain.base.log import log
    from ecotrain.methods.average import averaged_model

    tried = []  # in the order tried (a list: meta.json's keys are sorted)
    for alpha in sorted(set(alphas), reverse=True):
        m = averaged_model(cand, base_model, alpha, "--average")
        after = measure(m, [*holdout, recent])
        ok, _ = judge(before, after, [s.name for s in holdout], recent.name, policy)
        tried.append({"alpha": alpha, "promote": ok, "tasks": after})
        if ok:
            break
    log.info(f"average: alpha {alpha} chosen on the gate's slices (tried: {tried})")
    return m, {"alpha": alpha, "tried": tried}
