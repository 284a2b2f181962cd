"""The canary: a candidate served beside the current version on recorded requests before it is promoted.

    ecotrain update current new.npz --hold          # the gate passes it: a candidate, held for the canary
    ecotrain canary v0003 requests.npz --max-drop 0.01 --max-latency-ratio 1.25

The gate (gate.py) reads fixed slices. The canary reads what the deployment is asked: recorded
requests with the labels (feedback) they later got. Two ways to serve them:
- `shadow` (default): both versions answer every request, one request at a time as live traffic
  comes, in alternating order; the candidate's answer is only recorded. Paired: each request's outcome
  on both sides, so the interval is narrow.
- `split`: a share of the requests (`--share`, seeded) goes to the candidate, the rest to current;
  each request is answered once, as an A/B test on live traffic would. Unpaired: wider intervals.

Figures, each with a 95% bootstrap interval over requests (seeded, resampled in pairs in shadow mode):
the metric's drop (current's minus the candidate's; accuracy for a classifier, 1 - WER for speech,
where errors and reference words are summed over requests before dividing), and the ratio of the
median latency per request (candidate over current).

The rule the user sets, read on the intervals:
- promote: the drop's upper end <= --max-drop and the latency ratio's upper end <= --max-latency-ratio;
- reject: the drop's lower end > --max-drop, or the latency ratio's lower end > --max-latency-ratio
  (worse beyond the interval's doubt): the candidate is rejected and current keeps serving, which is the
  rollback of a version that was never promoted;
- hold: neither (too few requests to tell): it stays a candidate; the line says about how many requests
  the interval needs.
Every decision and its figures go into the registry (the candidate's entry `canary`, the history), so
MLflow's aliases follow (registry_mlflow.py: champion is `current`).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from ecotrain.base.errors import ConfigError, DataError

MODES = ("shadow", "split")
BOOT = 2000  # bootstrap resamples: the interval's ends move by ~0.1 of their width between seeds


@dataclass(frozen=True)
class CanaryRule:
    max_drop: float = 0.01  # the metric's largest allowed drop (accuracy or 1 - WER, absolute)
    max_latency_ratio: float = 1.25  # the candidate's median latency over current's
    mode: str = "shadow"
    share: float = 0.2  # split: the requests' share the candidate answers
    seed: int = 0  # the split's draw and the bootstrap's
    level: float = 0.95

    def check(self) -> "CanaryRule":
        for name, v, lo, hi in (("--max-drop", self.max_drop, 0.0, 1.0), ("--share", self.share, 0.0, 1.0),
                                ("--max-latency-ratio", self.max_latency_ratio, 1.0, 1e6)):
            if not (isinstance(v, (int, float)) and math.isfinite(v) and lo <= v <= hi):
                raise ConfigError(f"{name} {v}: must be a number from {lo:g} to {hi:g}")
        if self.mode not in MODES:
            raise ConfigError(f"--mode {self.mode}: must be one of {', '.join(MODES)}")
        if self.mode == "split" and not 0 < self.share < 1:
            raise ConfigError(f"--share {self.share}: a split needs a share strictly between 0 and 1 (0.2: a fifth "
                              "of the requests go to the candidate)")
        if not 0 <= self.seed < 2 ** 32:
            raise ConfigError(f"--seed {self.seed}: must be from 0 to 2**32 - 1")
        return self


@dataclass
class Answers:
    """One side's outcome on the requests it answered: per request its errors, its weight (1 for a
    classifier; a speech request's reference words) and its latency in seconds."""

    index: np.ndarray  # which requests (positions in the recorded file)
    errors: np.ndarray
    weight: np.ndarray
    latency: np.ndarray

    def metric(self, pick: Optional[np.ndarray] = None) -> float:
        e, w = (self.errors, self.weight) if pick is None else (self.errors[pick], self.weight[pick])
        return 1.0 - float(e.sum()) / max(float(w.sum()), 1e-12)


def assign(n: int, rule: CanaryRule) -> np.ndarray:
    """Per request: True where the candidate answers it (shadow: every request, both sides)."""
    if rule.mode == "shadow":
        return np.ones(n, dtype=bool)
    return np.random.default_rng(rule.seed).random(n) < rule.share


def serve(n: int, rule: CanaryRule, answer_current: Callable[[int], tuple[float, float]],
          answer_candidate: Callable[[int], tuple[float, float]]) -> tuple[Answers, Answers]:
    """Each request answered as live traffic is, one at a time: `answer_*(i)` -> (errors, weight) of
    request i, timed here. Shadow: both sides, the first of the pair alternating (neither side always
    meets a cold cache); split: the side `assign` drew."""
    if n < 2:
        raise DataError(f"{n} recorded requests: a canary needs at least 2 (and hundreds to decide)")
    to_cand = assign(n, rule)
    got: dict[str, list] = {"current": [], "candidate": []}
    for i in range(n):
        sides = ["current", "candidate"] if rule.mode == "shadow" else ["candidate" if to_cand[i] else "current"]
        if rule.mode == "shadow" and i % 2:
            sides.reverse()
        for side in sides:
            fn = answer_candidate if side == "candidate" else answer_current
            t0 = time.perf_counter()
            err, w = fn(i)
            got[side].append((i, float(err), float(w), time.perf_counter() - t0))
    out = []
    for side in ("current", "candidate"):
        rows = got[side]
        if len(rows) < 2:
            raise DataError(f"the split gave the {side} version {len(rows)} of {n} requests; raise --share toward "
                            "the side that got too few, or record more requests")
        a = np.array(rows, dtype=np.float64)
        out.append(Answers(a[:, 0].astype(np.int64), a[:, 1], a[:, 2], a[:, 3]))
    return out[0], out[1]


def _interval(samples: np.ndarray, level: float) -> tuple[float, float]:
    lo, hi = np.quantile(samples, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def figures(cur: Answers, cand: Answers, rule: CanaryRule) -> dict:
    """The drop and the latency ratio, each with its bootstrap interval; paired when both sides answered
    the same requests (shadow)."""
    rng = np.random.default_rng(rule.seed + 1)
    paired = rule.mode == "shadow"
    drops, ratios = np.empty(BOOT), np.empty(BOOT)
    for b in range(BOOT):
        pc = rng.integers(0, len(cur.errors), len(cur.errors))
        pk = pc if paired else rng.integers(0, len(cand.errors), len(cand.errors))
        drops[b] = cur.metric(pc) - cand.metric(pk)
        ratios[b] = np.median(cand.latency[pk]) / max(np.median(cur.latency[pc]), 1e-12)
    drop = cur.metric() - cand.metric()
    ratio = float(np.median(cand.latency) / max(np.median(cur.latency), 1e-12))
    return {"mode": rule.mode, "requests": {"current": int(len(cur.errors)), "candidate": int(len(cand.errors))},
            "metric": {"current": round(cur.metric(), 6), "candidate": round(cand.metric(), 6)},
            "drop": round(drop, 6), "drop_interval": [round(v, 6) for v in _interval(drops, rule.level)],
            "latency_ms": {"current": round(1e3 * float(np.median(cur.latency)), 4),
                           "candidate": round(1e3 * float(np.median(cand.latency)), 4)},
            "latency_ratio": round(ratio, 4), "latency_ratio_interval": [round(v, 4) for v in _interval(ratios, rule.level)],
            "level": rule.level, "rule": asdict(rule)}


def decide(fig: dict, rule: CanaryRule) -> tuple[str, str]:
    """(promote | reject | hold, the reason in one line with the figures)."""
    (d_lo, d_hi), (l_lo, l_hi) = fig["drop_interval"], fig["latency_ratio_interval"]
    pct = f"{100 * rule.level:g}%"
    said = (f"metric drop {fig['drop']:+.4f} [{d_lo:+.4f}, {d_hi:+.4f}] against {rule.max_drop:g}, median latency "
            f"x{fig['latency_ratio']:.3f} [{l_lo:.3f}, {l_hi:.3f}] against x{rule.max_latency_ratio:g} ({pct} "
            f"intervals, {fig['mode']}, {fig['requests']['candidate']} requests to the candidate)")
    if d_lo > rule.max_drop or l_lo > rule.max_latency_ratio:
        worse = "metric" if d_lo > rule.max_drop else "latency"
        return "reject", f"canary: rejected, its {worse} is worse than the rule allows: {said}"
    if d_hi <= rule.max_drop and l_hi <= rule.max_latency_ratio:
        return "promote", f"canary: promoted: {said}"
    width = max(d_hi - d_lo, 1e-12)
    margin = max(rule.max_drop - fig["drop"], 1e-12)  # how far the estimate sits inside the rule
    more = math.ceil(fig["requests"]["candidate"] * (width / (2 * margin)) ** 2) if fig["drop"] < rule.max_drop else None
    need = f"; about {more} requests to the candidate would decide the metric" if more and d_hi > rule.max_drop else ""
    return "hold", f"canary: held as a candidate, the intervals do not decide yet{need}: {said}"


def settle(reg, name: str, current: str, decision: str, reason: str, fig: dict) -> str:
    """Under the registry's lock: the figures in the candidate's entry and the history; promote (only if
    `current` is still the version the canary served beside it), reject, or hold. Returns the line."""
    from ecotrain.continual.registry import now

    with reg.locked():
        idx = reg.index()
        entry = idx["versions"].get(name)
        if entry is None:
            raise ConfigError(f"{reg.where}: {name} left the registry while the canary ran; nothing was changed")
        entry["canary"] = {k: fig[k] for k in ("mode", "requests", "metric", "drop", "drop_interval", "latency_ms",
                                                "latency_ratio", "latency_ratio_interval")} | {
            "decision": decision, "against": current, "time": now()}
        if decision == "promote" and idx["current"] != current:
            decision, reason = "hold", (f"canary: held: it passed beside {current}, but `current` moved to "
                                        f"{idx['current']} meanwhile; run the canary again ({reason})")
            entry["canary"]["decision"] = decision
        if decision == "promote":
            reg.make_current(idx, name, reason)
        else:
            reg.set_status(idx, name, "rejected" if decision == "reject" else "candidate", reason)
            idx["history"].append({"current": idx["current"], "time": now(), "reason": reason[:300],
                                   "canary": name})
        reg.write_index(idx)
    return f"{name}: {reason}"


# -- a registry's classifier versions ---------------------------------------------------------------
def run_canary(registry, name: str, requests: str, rule: CanaryRule, cohort: Optional[str] = None,
               out: Optional[str] = None) -> tuple[str, str, dict]:
    """`ecotrain canary`: the candidate `name` (a full-weights version made on `current`, or a cohort's
    version) served beside the current deployment on the recorded `requests` (.npz: x, y[, cohort]).
    Returns (decision, line, figures); the figures also go to `out` (JSON) when given."""
    import json

    import torch

    from ecotrain.continual.registry_mlflow import open_registry
    from ecotrain.continual.serve import Deployment, stored_router_sample, read_requests
    from ecotrain.continual.versions import load_version_model
    from ecotrain.export.inference import writable, write_out

    rule.check()
    path = writable(Path(out), "--out", [requests]) if out else None
    reg = open_registry(registry)
    idx = reg.existing_index()
    name, current = reg.resolve(name), reg.resolve("current")
    entry = idx["versions"][name]
    if name == current:
        raise ConfigError(f"{name} is current already; a canary serves a candidate beside current (after a bad "
                          "promotion: `ecotrain rollback`)")
    if entry.get("status") != "candidate":
        raise ConfigError(f"{name} is {entry.get('status')} ({entry.get('reason', '')}); the canary serves a "
                          f"candidate: `ecotrain update ... --hold` makes one")
    meta = reg.read_meta(name)
    if meta.get("task") == "language_model":
        raise ConfigError(f"{name} is a language model; the canary serves classifiers' versions")
    if meta.get("parent") != current:
        raise ConfigError(f"{name} was made on {meta.get('parent')}, but current is {current}; make the candidate "
                          f"again on current (`ecotrain update current ...`)")
    before = Deployment.load(reg, current)
    vcohort = entry.get("cohort")
    if vcohort is None:
        # promoted, it serves alone: cohorts' versions made on the old base are not served on a new one
        after = Deployment(name, load_version_model(reg, name), {}, {}, None)
    else:
        after = Deployment.load(reg, current, candidate=(vcohort, load_version_model(reg, name),
                                                         stored_router_sample(reg, name)))
    x, y, given = read_requests(Path(requests), reg.read_meta(current), cohort)
    if y is None:
        raise DataError(f"{requests}: no 'y' array; the canary compares answers with the labels the requests got "
                        "(feedback), so it needs them")

    def answer(dep) -> Callable[[int], tuple[float, float]]:
        def one(i: int) -> tuple[float, float]:
            xi = x[i:i + 1]
            routes = dep.routes(xi, given[i:i + 1] if given else None)
            return float(int(dep.proba(xi, routes).argmax(1)[0]) != int(y[i])), 1.0
        return one

    with torch.inference_mode():
        cur, cand = serve(len(x), rule, answer(before), answer(after))
    fig = figures(cur, cand, rule)
    decision, reason = decide(fig, rule)
    line = settle(reg, name, current, decision, reason, fig)
    fig.update(decision=decision, version=name, current=current, requests_file=str(requests))
    if path is not None:
        write_out(path, (json.dumps(fig, indent=2, sort_keys=True) + "\n").encode(), "--out")
    return decision, line, fig


def exit_code(decision: str) -> int:
    """0: promoted; 1: rejected or held (as `update` exits 1 when nothing was promoted)."""
    return 0 if decision == "promote" else 1

