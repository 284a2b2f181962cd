"""What `ecotrain green` leaves in OUT: green.yaml (a recipe `ecotrain fit` runs), trials.csv and
trials.json (every trial, pruned and skipped ones too), verdict.txt (compare's report) and green.html
(the Pareto front of cost against validation metric, in report.html's style: one self-contained page)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Optional

from ecotrain.accounting.report import lower_is_better, table as text_table
from ecotrain.config import load_config
from ecotrain.report.page import e, fmt, img, page, table
from ecotrain.report.plots import COLORS, figure, png
from ecotrain.base.rundir import atomic_write, config_yaml, write_json
from ecotrain.base.stats import pareto_front

COLUMNS = ["trial", "state", "cost_ratio", "val", "deficit", "feasible", "check_deficit", "overrides", "note"]


def write_recipe(path: Path, recipe: str, overrides: list[str], search, tolerance: float, by: str) -> None:
    """The chosen trial as one recipe: the baseline's config with the trial's overrides merged in (the
    seed left at the recipe's), headed by the command that runs it."""
    row = search.chosen
    keep = [o for o in overrides if not o.startswith("seed=")]
    cfg = load_config(recipe, [*keep, *row.overrides]).to_dict()
    cfg["name"] = f"{cfg['name']}_green"
    head = (f"# ecotrain fit {path}\n"
            f"# Found by `ecotrain green {recipe} --tolerance {tolerance:g} --by {by}`: trial {row.number}, "
            f"{row.ratio:.3f}x the baseline's {by} on the design seed,\n"
            f"# validation deficit {row.deficit:+.4f}"
            + (f" ({row.check_deficit:+.4f} over all design seeds)" if row.check_deficit is not None else "")
            + " (chosen on validation only; see verdict.txt for the fresh seeds).\n"
            f"# Overrides of {recipe}: {' '.join(row.overrides)}\n")
    atomic_write(path, (head + config_yaml(cfg)).encode())


def rows_of(search) -> list[dict]:
    out = []
    for r in search.rows:
        out.append({"trial": r.number, "state": r.state, "cost_ratio": r.ratio, "val": r.val, "deficit": r.deficit,
                    "feasible": r.feasible, "check_deficit": r.check_deficit, "check_se": r.check_se, "overrides": " ".join(r.overrides),
                    "note": r.why,
                    "params": r.params, "cost": r.cost, "flops": r.flops, "run_dir": r.run_dir,
                    "predicted_ratio": r.predicted})
    return out


def write_trials(out: Path, search) -> None:
    rows = rows_of(search)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    atomic_write(out / "trials.csv", buf.getvalue().encode())
    write_json(out / "trials.json", {"baseline": search.baseline, "trials": rows,
                                     "chosen": search.chosen.number if search.chosen else None,
                                     "levers": [lv.name for lv in search.levers], "not_applied": search.not_applied})


def trials_table(search) -> str:
    def f(x, spec):
        return "-" if x is None else format(x, spec)

    body = [[str(r.number), r.state + (" *" if search.chosen is r else ""), f(r.ratio, ".3f"), f(r.val, ".4f"),
             f(r.deficit, "+.4f"), f(r.check_deficit, "+.4f"), " ".join(r.overrides) if r.state != "skipped" else r.why]
            for r in search.rows]
    return text_table(["trial", "state", "cost x", "val", "deficit", "all seeds", "overrides"], body)


def pareto(points: list[tuple[float, float]], lower: bool = False) -> list[tuple[float, float]]:
    """The points no other point beats on both: lower cost and a better validation metric (higher;
    `lower`: lower, a loss or a perplexity)."""
    return pareto_front(points, x=lambda p: p[0], y=lambda p: p[1] if lower else -p[1])


def pareto_plot(search, tolerance: float, by: str) -> str:
    fig, (ax,) = figure(8, 4.4)
    base = search.baseline
    done = [r for r in search.rows if r.ratio is not None and r.val is not None]
    for state, color, marker in (("complete", COLORS[0], "o"), ("pruned", "#9e9e9e", "x")):
        pts = [(r.ratio, r.val) for r in done if r.state == state]
        if pts:
            ax.scatter(*zip(*pts), c=color, marker=marker, label=f"{state} ({len(pts)})", zorder=3)
    lower = lower_is_better(search.metric)
    front = pareto([(r.ratio, r.val) for r in done if r.state == "complete"] + [(1.0, base["val"])], lower)
    if front:
        ax.step(*zip(*front), where="post", color=COLORS[2], alpha=0.7, label="Pareto front")
    ax.scatter([1.0], [base["val"]], c=COLORS[1], marker="s", s=60, label="baseline", zorder=4)
    ax.axhline(base["val"] + (tolerance if lower else -tolerance), color=COLORS[1], ls="--", lw=1,
               label=f"baseline {'+' if lower else '-'} {tolerance:g}")
    if search.chosen is not None:
        ax.scatter([search.chosen.ratio], [search.chosen.val], s=180, facecolors="none", edgecolors=COLORS[3],
                   lw=2, label=f"chosen (trial {search.chosen.number})", zorder=5)
    ax.set_xlabel(f"{by} / baseline's (design seed)")
    ax.set_ylabel("validation metric")
    ax.legend(fontsize=8, loc="lower right")
    return png(fig)


def write_html(out: Path, search, tolerance: float, by: str, confirmation=None, payback: Optional[int] = None,
               costs: Optional[dict] = None, plan: Optional[dict] = None) -> Path:
    body = []
    chosen = search.chosen
    lines = [f"baseline: validation {search.baseline['val']:.4f}, {by} {fmt(search.baseline['cost'])}",
             f"levers searched: {', '.join(lv.name for lv in search.levers)}"]
    lines += [f"not applied: {k} ({v})" for k, v in search.not_applied.items()]
    if chosen is not None:
        lines.append(f"chosen on validation: trial {chosen.number}, {chosen.ratio:.3f}x the cost, deficit "
                     f"{chosen.deficit:+.4f}: {' '.join(chosen.overrides)}")
    else:
        lines.append(f"no trial kept the validation metric within {tolerance:g} of the baseline's")
    body.append("<section><h2>Search</h2>" + "".join(f"<p>{e(x)}</p>" for x in lines) + "</section>")
    try:
        body.append("<section><h2>Cost against validation metric</h2>"
                    + img(pareto_plot(search, tolerance, by), "Pareto front") + "</section>")
    except Exception as exc:  # matplotlib missing (the report extra): the page without the plot
        body.append(f'<section><p class="note">plot skipped: {e(exc)}</p></section>')
    if costs:
        body.append("<section><h2>What the search cost</h2>" + table(
            ["part", f"{by}", "baseline runs"], [[k, fmt(v), f"{v / search.baseline['cost']:.2f}"]
                                                 for k, v in costs.items()]) +
                    (f"<p>pays back after <b>{payback}</b> production runs of the green recipe</p>"
                     if payback is not None else "<p>the green recipe saves nothing per run: it never pays back</p>")
                    + "</section>")
    if confirmation is not None:
        cls = "pass" if confirmation.verdict == "PASS" else "fail"
        body.append(f'<section><h2>Confirmed on fresh seeds: <span class="{cls}">{e(confirmation.verdict)}</span></h2>'
                    f"<pre>{e(confirmation.report)}</pre></section>")
    if plan is not None:
        from ecotrain.green.plan import lines

        body.append("<section><h2>The plan: CO2e and money, three families</h2>"
                    + f"<p>{e(plan['note'])}</p>"
                    + table(["family", "measured or modelled", "CO2e", "money", "how"],
                            [list(r) for r in lines(plan)]) + "</section>")
    rows = [[r["trial"], r["state"], fmt(r["cost_ratio"]), fmt(r["val"]), fmt(r["deficit"]), fmt(r["check_deficit"]),
             r["overrides"] if r["state"] != "skipped" else r["note"]] for r in rows_of(search)]
    body.append("<section><h2>Trials</h2>" + table(["trial", "state", "cost x", "val", "deficit",
                                                    "deficit, all design seeds", "overrides"], rows)
                + "</section>")
    path = out / "green.html"
    atomic_write(path, page("ecotrain green", f"tolerance {tolerance:g}, cost by {by}", body).encode())
    return path
