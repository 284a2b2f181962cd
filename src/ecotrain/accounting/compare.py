"""`ecotrain compare`: a baseline against a candidate, side by side, with a verdict for CI.

Each side is one run folder or a seed group (several). The table shows each figure's mean over a
side's runs with its 95% t-interval (`ecotrain.base.stats`, the one implementation; docs/evaluation.md is
the protocol). Two criteria:

- the metric: its drop (baseline - candidate; for a metric where lower is better, a loss or a
  perplexity, the rise: `report.lower_is_better`) is at most
  `max_accuracy_drop`. With two or more runs per side the drop's 95% interval decides
  (`stats.diff_ci`: paired by seed when both sides ran the same seeds, else Welch; `stats.verdict`):
  PASS when the whole interval is within the allowance, FAIL when it is wholly beyond it,
  INCONCLUSIVE when it straddles it. With one run on a side: the point drop, said so.
- the cost: the mean of the `by` figure falls by at least `min_cost_cut` (a fraction), a point check
  on the means. FLOPs are counted (the same work gives the same figure on any machine); time, energy,
  CO2e and money are measured and move with the machine's load; the verdict says which it used.
  When a run's ledger says it was measured under contention (ledger.json `contention.seen`: an
  over-loaded machine, accounting/contention.py), the load's variation is in the runs' spread, so the
  cut's 95% interval decides a measured criterion: PASS or FAIL when it lies wholly on one side of
  the required cut, INCONCLUSIVE when it straddles it or a side has one run (no interval).

Overall: PASS when both pass, INCONCLUSIVE when neither fails but one is inconclusive, else FAIL.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional, Sequence

import yaml

from ecotrain.base import safefile
from ecotrain.accounting.report import (contended, FIGURES, figure, lower_is_better, missing_reason, num, read_ledger,
                                       read_summary, table)
from ecotrain.base.errors import ConfigError
from ecotrain.base.stats import (Interval, diff_ci, look_alpha, mean_ci, seeds_to_decide, sequential_interval, spread,
                            verdict)
from ecotrain.base.runfiles import CONFIG, SUMMARY

BY = ("flops", "cpu_seconds", "wall_seconds", "energy", "co2e", "cost")
COUNTED = ("flops",)  # the rest are measured
TOL = 1e-12  # a drop equal to the allowance passes, whatever the last bit of the subtraction says


def load_run(run_dir: str) -> tuple[dict, dict]:
    """(summary.json, ledger.json) of a finished run folder; one line naming the file when one is missing."""
    folder = Path(run_dir)
    if not folder.is_dir():
        raise ConfigError(f"{run_dir}: not a run folder (no such folder)" if not folder.exists()
                          else f"{run_dir}: a file, not a run folder (looked for {run_dir}/summary.json)")
    path = folder / SUMMARY
    if not path.is_file():
        if not (folder / CONFIG).is_file():
            raise ConfigError(f"{run_dir}: not a run folder (no summary.json, no config.yaml); "
                              "give the folders that `ecotrain fit` wrote")
        raise ConfigError(f"{run_dir}: no summary.json (the run did not finish)")
    return read_summary(folder), read_ledger(run_dir)


def run_seed(run_dir: str, summary: dict) -> Optional[int]:
    """The seed a run trained with: summary.json's `seed`, else config.yaml's; None when neither says."""
    seed = summary.get("seed")
    if seed is None:
        try:
            cfg = yaml.safe_load(safefile.read_text(Path(run_dir) / CONFIG, "run config", 16 * safefile.MiB))
        except (OSError, ValueError, yaml.YAMLError, ConfigError):
            cfg = None
        seed = cfg.get("seed") if isinstance(cfg, dict) else None
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


LM_METRICS = ("perplexity", "bits_per_char", "bits_per_byte")  # LanguageModelTask's own (its accuracy is per token)
REGRESSION_METRICS = ("mse", "mae", "r2")


def run_task(run_dir: str, summary: dict) -> Optional[str]:
    """The task a run trained: config.yaml's `task.name`; for `auto` (or none), what its summary's
    metrics say: a language model's perplexity or bits, a regression's error; None when they do not
    tell (accuracy alone: classification, multilabel or sequence labelling)."""
    try:
        cfg = yaml.safe_load(safefile.read_text(Path(run_dir) / CONFIG, "run config", 16 * safefile.MiB))
    except (OSError, ValueError, yaml.YAMLError, ConfigError):
        cfg = None
    task = cfg.get("task") if isinstance(cfg, dict) else None
    name = task.get("name") if isinstance(task, dict) else None
    if isinstance(name, str) and name != "auto":
        return name
    metrics = {k.split("_", 1)[1] for k in summary if k.startswith(("test_", "val_", "train_"))}
    if metrics & set(LM_METRICS):
        return "language_model"
    if metrics & set(REGRESSION_METRICS):
        return "regression"
    return None


def one_task(names: dict, tasks: dict, metric: str) -> None:
    """Runs of one task: a classifier's accuracy and a language model's (per token) share a name, not a
    meaning, and the cost of one task's run says nothing of the other's. One line naming a run of each
    task, no verdict. A run whose task its files do not tell is not held against the others."""
    first: dict[str, tuple[str, str]] = {}
    for side in names:
        for run, task in zip(names[side], tasks[side]):
            if task is not None:
                first.setdefault(task, (side, run))
    if len(first) > 1:
        shown = "; ".join(f"{side} {run}: {task.replace('_', ' ')}" for task, (side, run) in list(first.items())[:3])
        raise ConfigError(f"compare: the runs are of different tasks ({shown}): {metric} and their costs do not "
                          "measure the same thing; compare runs of one task (no verdict)")


def distinct_runs(side: str, runs: Sequence[str], seeds: Sequence[Optional[int]]) -> None:
    """A side's runs are distinct runs: each its own folder and its own seed. The same run given twice,
    or copies of one seed's folder, would count as that many seeds and narrow the interval on no
    evidence; one line naming them, no verdict."""
    folders: dict[str, list[str]] = {}
    by_seed: dict[int, list[str]] = {}
    for run, seed in zip(runs, seeds):
        folders.setdefault(os.path.realpath(run), []).append(run)
        if seed is not None:
            by_seed.setdefault(seed, []).append(run)
    same = next((v for v in folders.values() if len(v) > 1), None)
    if same is not None:
        raise ConfigError(f"{side} runs {_some(same)} are one run folder given {len(same)} times; each run counts as "
                          "one seed, so give each once (no verdict)")
    seed, twice = next(((k, v) for k, v in by_seed.items() if len(v) > 1), (None, None))
    if twice is not None:
        raise ConfigError(f"{side} runs {_some(twice)} all trained seed {seed} (copies of one run?); a seed group "
                          "needs distinct seeds: give each seed once, or train more with `ecotrain fit --seeds 0-4` "
                          "(no verdict)")


def _some(runs: Sequence[str], shown: int = 3) -> str:
    more = len(runs) - shown
    return ", ".join(runs[:shown]) + (f" and {more} more" if more > 0 else "")


def pairing(base: Sequence[Optional[int]], cand: Sequence[Optional[int]]) -> Optional[list[int]]:
    """The candidate's runs in the baseline's seed order when both sides ran the same distinct seeds
    (two or more), else None (unpaired: Welch)."""
    if (len(base) < 2 or None in base or None in cand or len(set(base)) != len(base)
            or sorted(base) != sorted(cand)):
        return None
    return [list(cand).index(s) for s in base]


def _cell(vals: list, fmt) -> str:
    if any(v is None for v in vals):
        return "n/a"
    ci = mean_ci(vals)
    return fmt(ci.mean) if ci.n == 1 else f"{fmt(ci.mean)} [{fmt(ci.low)}, {fmt(ci.high)}]"


def _mean(vals: Sequence[float]) -> float:
    return sum(vals) / len(vals)


def _ci(iv: Interval, fmt) -> str:
    """'mean, 95% CI [low, high]': the level the interval has (a sequential look's is wider than 95%)."""
    return f"{fmt(iv.mean)}, {iv.level * 100:.4g}% CI [{fmt(iv.low)}, {fmt(iv.high)}]"


def _signed(x: float) -> str:
    return f"{x:+.4f}"


def judge(baseline: Sequence[str], candidate: Sequence[str], max_accuracy_drop: float = 0.01,
          min_cost_cut: float = 0.5, by: str = "co2e", metric: str = "test_accuracy",
          look: Optional[int] = None) -> tuple[str, str]:
    """(the report, the verdict: PASS, FAIL or INCONCLUSIVE). `look`: the k-th look of a comparison
    that adds seeds until it decides (sequential: the sides must be paired by seed)."""
    if by not in BY:
        raise ConfigError(f"--by: one of {', '.join(BY)} (got {by!r})")
    # a NaN threshold failed every comparison (a FAIL said of any runs), a cut above 1 asked for negative cost
    if not math.isfinite(max_accuracy_drop):
        raise ConfigError(f"--max-accuracy-drop {max_accuracy_drop}: give a finite number, e.g. 0.01")
    if not (math.isfinite(min_cost_cut) and min_cost_cut <= 1):
        raise ConfigError(f"--min-cost-cut {min_cost_cut}: give a fraction of the baseline's cost of at most 1, "
                          "e.g. 0.5")
    names = {"baseline": list(baseline), "candidate": list(candidate)}
    sides = {k: [load_run(r) for r in v] for k, v in names.items()}
    seeds = {k: [run_seed(r, s) for r, (s, _) in zip(names[k], sides[k])] for k in names}
    for side in names:
        distinct_runs(side, names[side], seeds[side])
    one_task(names, {k: [run_task(r, s) for r, (s, _) in zip(names[k], sides[k])] for k in names}, metric)
    for name, runs in sides.items():
        for r, (s, L) in zip(names[name], runs):
            if s.get(metric) is None:
                raise ConfigError(f"{r}: summary.json has no {metric!r} (choose another with --metric)")
            if figure(L, by) is None:
                raise ConfigError(f"--by {by}: {r} has no {FIGURES[by][0]} figure ({missing_reason(L, by)}); "
                                  "compare --by flops or cpu_seconds instead")
    order = pairing(seeds["baseline"], seeds["candidate"])
    if order is not None:  # seed by seed against the baseline
        sides["candidate"] = [sides["candidate"][i] for i in order]
    nb, nc = len(sides["baseline"]), len(sides["candidate"])

    rows = []
    for key, label, get, fmt in [(metric, metric, lambda s, L: s.get(metric), "{:.4f}".format)] + [
            (k, lab, lambda s, L, k=k: figure(L, k), num) for k, (lab, _) in FIGURES.items()]:
        b, c = ([get(s, L) for s, L in sides[k]] for k in ("baseline", "candidate"))
        ratio = change = "n/a"
        if None not in b and None not in c and _mean(b):
            q = _mean(c) / _mean(b)
            ratio, change = f"{q:.3f}", f"{(q - 1) * 100:+.1f}%"
        if key == "cost":
            label = f"cost {sides['baseline'][0][1]['cost'].get('currency', '')}".strip()
        if key in FIGURES:
            label += " (counted)" if key in COUNTED else " (measured)"
        rows.append([label, _cell(b, fmt), _cell(c, fmt), ratio, change])
    head = ["", "baseline" + (f" (mean of {nb} [95% CI])" if nb > 1 else ""),
            "candidate" + (f" (mean of {nc} [95% CI])" if nc > 1 else ""), "ratio", "change"]

    lines = [_seeds_line(seeds, order, nb, nc)]
    if look is not None and order is None:
        raise ConfigError("a sequential comparison (--until-decided) needs both sides to have run the same seeds")
    acc_line, acc_v = _metric_criterion(sides, metric, max_accuracy_drop, order is not None, look)
    busy = _contended_runs(names, sides) if by not in COUNTED else []
    cost_line, cost_v = _cost_criterion(sides, by, min_cost_cut, order is not None, bool(busy))
    lines += [acc_line, cost_line]
    lines += _contention_notes(busy, by, cost_v, order is not None)
    lines += _measured_notes(sides, by)
    lines += teacher_notes(sides)
    results = [acc_v, cost_v]
    overall = "PASS" if all(v == "PASS" for v in results) else "FAIL" if "FAIL" in results else "INCONCLUSIVE"
    kind = "counted" if by in COUNTED else "measured"
    said = f"{metric} {acc_v}, {FIGURES[by][0]} ({kind}) {cost_v}"
    lines.append({"PASS": f"verdict: PASS ({said}: the candidate meets the criteria)",
                  "FAIL": f"verdict: FAIL ({said})",
                  "INCONCLUSIVE": f"verdict: INCONCLUSIVE ({said}: run more seeds)"}[overall])
    return table(head, rows) + "\n\n" + "\n".join(lines), overall


def compare(baseline: Sequence[str], candidate: Sequence[str], max_accuracy_drop: float = 0.01,
            min_cost_cut: float = 0.5, by: str = "co2e", metric: str = "test_accuracy") -> tuple[str, bool]:
    """(the report, whether the candidate passes); INCONCLUSIVE is not a pass. `judge` names the verdict."""
    text, overall = judge(baseline, candidate, max_accuracy_drop, min_cost_cut, by, metric)
    return text, overall == "PASS"


def _seeds_line(seeds: dict, order: Optional[list], nb: int, nc: int) -> str:
    said = lambda xs: ",".join("?" if s is None else str(s) for s in xs)  # noqa: E731
    where = f"seeds: baseline {said(seeds['baseline'])}; candidate {said(seeds['candidate'])}"
    if order is not None:
        return f"{where}: paired by seed ({nb} per-seed differences)"
    if nb == 1 or nc == 1:
        return f"{where}: " + ("one run per side" if nb == nc == 1 else
                               f"the {'baseline' if nb == 1 else 'candidate'} has one run") + ": no interval"
    unknown = None in seeds["baseline"] + seeds["candidate"]
    return f"{where}: unpaired (Welch): " + ("a run's seed is not recorded" if unknown else "not the same seeds")


def _metric_criterion(sides: dict, metric: str, allowed: float, paired: bool,
                      look: Optional[int] = None) -> tuple[str, str]:
    b = [s[metric] for s, _ in sides["baseline"]]
    c = [s[metric] for s, _ in sides["candidate"]]
    hi, lo = (c, b) if lower_is_better(metric) else (b, c)  # drop = hi - lo
    head = f"{metric}: {_mean(b):.4f} -> {_mean(c):.4f}, drop "
    if len(b) < 2 or len(c) < 2:
        drop = _mean(hi) - _mean(lo)
        v = "PASS" if drop <= allowed + TOL else "FAIL"
        one = "one seed" if len(b) == len(c) == 1 else "one seed on a side"
        return f"{head}{drop:+.4f} (allowed {allowed:g}): {v} (on {one}: no interval)", v
    if look is not None:  # a sequential comparison's look: an interval valid at every look (stats.py)
        iv = sequential_interval([h - w for h, w in zip(hi, lo)], look)
        how = f"paired, n={iv.n}, sequential look {look}: {(1 - look_alpha(look)) * 100:.6g}% interval"
    else:
        iv = diff_ci(hi, lo, paired)
        how = f"paired, n={iv.n}" if paired else f"Welch, {len(b)} vs {len(c)} runs"
    v = verdict(iv, allowed)
    line = f"{head}{_ci(iv, _signed)} ({how}; allowed {allowed:g}): {v}"
    if v == "INCONCLUSIVE":
        need = seeds_to_decide(iv.mean, spread(hi, lo, paired), allowed, at=None if look is None else (look, iv.n))
        line += (f" (the interval straddles the allowance: at this mean and spread about {need} seeds per side "
                 + ("would decide with the interval valid at every look" if look is not None else
                    "would decide; `--until-decided` adds them with an interval valid at every look") + ")"
                 if need else
                 " (the interval straddles the allowance, and the mean sits at it: no number of seeds is "
                 "likely to decide)")
    if paired and len(b) > 2:  # what pairing saved: the unpaired interval of the same runs
        welch = diff_ci(hi, lo, False)
        ratio = (iv.half / welch.half) ** 2 if look is None and welch.half > 0 else None
        if ratio is not None:
            line += (f"; pairing by seed: half-width {iv.half:.4f} against {welch.half:.4f} unpaired, "
                     f"{ratio * 100:.0f}% of the unpaired variance")
    return line, v


def _cost_criterion(sides: dict, by: str, min_cut: float, paired: bool, busy: bool = False) -> tuple[str, str]:
    """The cut of the means against `min_cut`: a point check; measured under contention, the interval
    of the cut decides instead (the load's variation is in the runs' spread, so in that interval)."""
    b = [figure(L, by) for _, L in sides["baseline"]]
    c = [figure(L, by) for _, L in sides["candidate"]]
    mb, mc = _mean(b), _mean(c)
    cut = 1 - mc / mb if mb else 0.0
    v = "PASS" if cut >= min_cut - TOL else "FAIL"
    kind = "counted" if by in COUNTED else "measured"
    line = f"{FIGURES[by][0]} ({kind}): {num(mb)} -> {num(mc)}, cut {cut * 100:.1f}% (required {min_cut * 100:g}%"
    several = len(b) > 1 and len(c) > 1
    if several:
        line += f"; baseline - candidate {_ci(diff_ci(b, c, paired), num)}"
    if not busy:
        return f"{line}): {v} (a point check{' on the means' if len(b) + len(c) > 2 else ''})", v
    if not several or not mb:
        return (f"{line}): {v} (a point check); measured under contention, one run on a side: no interval to hold "
                "the load's share, so INCONCLUSIVE"), "INCONCLUSIVE"
    low, high = cut_interval(b, c, min_cut, paired)
    v = "PASS" if low >= min_cut - TOL else "FAIL" if high < min_cut - TOL else "INCONCLUSIVE"
    where = {"PASS": "wholly at or above the required cut", "FAIL": "wholly below the required cut",
             "INCONCLUSIVE": "straddles the required cut"}[v]
    return (f"{line}; the cut's 95% CI [{low * 100:.1f}%, {high * 100:.1f}%]): {v} (measured under contention: "
            f"the interval, {where}, decides)"), v


def cut_interval(base: Sequence[float], cand: Sequence[float], min_cut: float, paired: bool) -> tuple[float, float]:
    """95% interval of the cut 1 - mean(cand) / mean(base), from the interval of mean((1 - min_cut) base - cand):
    that difference is >= 0 exactly when the cut reaches `min_cut`, so the verdict is the sign of an
    ordinary (paired or Welch) interval; divided by mean(base), as a cut."""
    iv = diff_ci([(1 - min_cut) * x for x in base], cand, paired)
    mb = _mean(base)
    return min_cut + iv.low / mb, min_cut + iv.high / mb


def _measured_notes(sides: dict, by: str) -> list[str]:
    if by in COUNTED:
        return []
    out = [f"note: {FIGURES[by][0]} is measured: it moves with the machine's load (the ledger marks an "
           "over-loaded machine, ledger.json `contention`); --by flops is counted"]
    methods = sorted({L["energy"]["method"] for runs in sides.values() for _, L in runs if L["energy"]["method"]})
    if by in ("energy", "co2e") and methods != ["measured"]:
        out.append(f"note: energy figures are {' and '.join(methods)} (see each ledger.json energy.how)")
    return out


def _contended_runs(names: dict, sides: dict) -> list[tuple[str, str, dict]]:
    """(side, run, its contention record) of each run measured on an over-loaded machine."""
    return [(side, run, L["contention"]) for side in names for run, (_, L) in zip(names[side], sides[side])
            if contended(L)]


def _contention_notes(busy: list, by: str, verdict: str, paired: bool) -> list[str]:
    if not busy:
        return []
    runs = "; ".join(f"{side} {run}: load {c.get('load')} on {c.get('cpus')} CPUs, steps up to "
                     f"{c.get('slowdown')}x slower" for side, run, c in busy[:3])
    if len(busy) > 3:  # a long seed group: the worst figures, not every run
        most = lambda key: max((c.get(key) for _, _, c in busy if isinstance(c.get(key), (int, float))),  # noqa: E731
                               default="?")
        runs += f"; and {len(busy) - 3} more runs, load up to {most('load')}, steps up to {most('slowdown')}x slower"
    if verdict == "INCONCLUSIVE":
        return [f"note: the {FIGURES[by][0]} verdict is unreliable: measured under contention ({runs}); rerun on a "
                "quiet machine, run the sides in turn (A, B, A, B) on more seeds, or compare --by flops (counted)"]
    how = ("paired by seed, a load both runs of a seed shared cancels in their difference and the rest widens the "
           "interval" if paired else "unpaired, the load's variation widens each side's spread")
    return [f"note: measured under contention ({runs}); the load entered the {FIGURES[by][0]} interval as spread "
            f"({how}); the verdict stands because the whole interval lies on one side of the required cut. A load "
            "that fell on one side only would shift it instead: train the sides in turn (A, B, A, B; "
            "`fit --baseline` does)"]


def teacher_notes(sides: dict) -> list[str]:
    """Whether a distilled side's figures include its teacher's training (summary.json
    `methods.distill.teacher_cost_included`): the verdict must say so."""
    out = []
    for name, runs in sides.items():
        flags = [s.get("methods", {}).get("distill", {}).get("teacher_cost_included") for s, _ in runs]
        flags = [f for f in flags if f is not None]
        if flags:
            how = "included" if all(flags) else "NOT included" if not any(flags) else "included in some runs only"
            out.append(f"note: the {name} is distilled from a teacher; the teacher's training FLOPs are {how} in its "
                       "FLOPs; its forward passes are counted; its CPU time and energy are not (see its ledger.json)")
    return out


def split_runs(items: Sequence[str] | None) -> list[str]:
    """`["a,b", "c"]` -> `["a", "b", "c"]`: run folders given as several arguments or comma lists;
    a group file (`fit --seeds` writes RUN-group.json) stands for the runs it lists."""
    from ecotrain.base.groupfile import is_group_file, read_group

    return [r for item in items or () for p in item.split(",") if p
            for r in (read_group(p) if is_group_file(p) else [p])]
