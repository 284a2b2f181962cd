"""`ecotrain compare`: a baseline against a candidate, side by side, with a verdict for CI.

Each side is one run folder or several (seeds); several are compared by their medians and the table
shows each figure's range. The candidate passes when its accuracy dropped by at most
`max_accuracy_drop` (absolute) and the `by` figure fell by at least `min_cost_cut` (a fraction).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Sequence

from ecotrain.accounting.report import FIGURES, figure, missing_reason, num, read_ledger, table
from ecotrain.errors import ConfigError

BY = ("flops", "cpu_seconds", "wall_seconds", "energy", "co2e", "cost")


def load_run(run_dir: str) -> tuple[dict, dict]:
    """(summary.json, ledger.json) of a finished run folder; one line naming the file when one is missing."""
    folder = Path(run_dir)
    if not folder.is_dir():
        raise ConfigError(f"{run_dir}: not a run folder (no such folder)" if not folder.exists()
                          else f"{run_dir}: a file, not a run folder (looked for {run_dir}/summary.json)")
    path = folder / "summary.json"
    if not path.is_file():
        if not (folder / "config.yaml").is_file():
            raise ConfigError(f"{run_dir}: not a run folder (no summary.json, no config.yaml); "
                              "give the folders that `ecotrain fit` wrote")
        raise ConfigError(f"{run_dir}: no summary.json (the run did not finish)")
    try:
        summary = json.loads(path.read_text())
    except (ValueError, OSError) as exc:
        raise ConfigError(f"{path}: not readable JSON ({getattr(exc, 'strerror', None) or exc})") from None
    if not isinstance(summary, dict):
        raise ConfigError(f"{path}: not a JSON object")
    return summary, read_ledger(run_dir)


def _values(runs, get) -> list:
    return [get(s, L) for s, L in runs]


def _cell(vals: list) -> str:
    if any(v is None for v in vals):
        return "n/a"
    med = statistics.median(vals)
    return num(med) if len(vals) == 1 else f"{num(med)} [{num(min(vals))}..{num(max(vals))}]"


def compare(baseline: Sequence[str], candidate: Sequence[str], max_accuracy_drop: float = 0.01,
            min_cost_cut: float = 0.5, by: str = "co2e", metric: str = "test_accuracy") -> tuple[str, bool]:
    """(the report, whether the candidate meets the criteria)."""
    if by not in BY:
        raise ConfigError(f"--by: one of {', '.join(BY)} (got {by!r})")
    sides = {"baseline": [load_run(r) for r in baseline], "candidate": [load_run(r) for r in candidate]}
    for name, runs in sides.items():
        for r, (s, L) in zip(baseline if name == "baseline" else candidate, runs):
            if s.get(metric) is None:
                raise ConfigError(f"{r}: summary.json has no {metric!r} (choose another with --metric)")
            if figure(L, by) is None:
                raise ConfigError(f"--by {by}: {r} has no {FIGURES[by][0]} figure ({missing_reason(L, by)}); "
                                  "compare --by flops or cpu_seconds instead")
    rows_def = [(metric, lambda s, L: s.get(metric))] + [
        (label, lambda s, L, k=key: figure(L, k)) for key, (label, _) in FIGURES.items()]
    rows = []
    for label, get in rows_def:
        b, c = _values(sides["baseline"], get), _values(sides["candidate"], get)
        ratio = change = "n/a"
        if None not in b and None not in c and statistics.median(b):
            r = statistics.median(c) / statistics.median(b)
            ratio, change = f"{r:.3f}", f"{(r - 1) * 100:+.1f}%"
        if label == "cost":
            label = f"cost {sides['baseline'][0][1]['cost'].get('currency', '')}".strip()
        rows.append([label, _cell(b), _cell(c), ratio, change])
    nb, nc = len(baseline), len(candidate)
    head = ["", "baseline" + (f" (median of {nb})" if nb > 1 else ""),
            "candidate" + (f" (median of {nc})" if nc > 1 else ""), "ratio", "change"]

    higher_better = "loss" not in metric
    acc_b = statistics.median(_values(sides["baseline"], lambda s, L: s[metric]))
    acc_c = statistics.median(_values(sides["candidate"], lambda s, L: s[metric]))
    drop = (acc_b - acc_c) if higher_better else (acc_c - acc_b)
    cost_b = statistics.median(_values(sides["baseline"], lambda s, L: figure(L, by)))
    cost_c = statistics.median(_values(sides["candidate"], lambda s, L: figure(L, by)))
    cut = 1 - cost_c / cost_b if cost_b else 0.0
    acc_ok, cut_ok = drop <= max_accuracy_drop + 1e-12, cut >= min_cost_cut - 1e-12
    verdict = [
        f"{metric}: {acc_b:.4f} -> {acc_c:.4f}, drop {drop:+.4f} (allowed {max_accuracy_drop:g}): "
        + ("ok" if acc_ok else "FAIL"),
        f"{FIGURES[by][0]}: {num(cost_b)} -> {num(cost_c)}, cut {cut * 100:.1f}% (required {min_cost_cut * 100:g}%): "
        + ("ok" if cut_ok else "FAIL"),
    ]
    notes = sorted({L["energy"]["method"] for _, runs in sides.items() for _, L in runs if L["energy"]["method"]})
    if by in ("energy", "co2e") and notes != ["measured"]:
        verdict.append(f"note: energy figures are {' and '.join(notes)} (see each ledger.json energy.how)")
    verdict += teacher_notes(sides)
    ok = acc_ok and cut_ok
    verdict.append("verdict: PASS (the candidate meets the criteria)" if ok else "verdict: FAIL")
    return table(head, rows) + "\n\n" + "\n".join(verdict), ok


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
    from ecotrain.sweep import is_group_file, read_group

    return [r for item in items or () for p in item.split(",") if p
            for r in (read_group(p) if is_group_file(p) else [p])]
