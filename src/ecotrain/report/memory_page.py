"""The memory-budget section (memory/planner.py): the plans measured, the Pareto front of peak memory against
step time, and the one chosen. In a run's report (from summary.json's `memory_plan`) and as the
page `ecotrain plan --budget B --out PAGE` writes."""

from __future__ import annotations

import time
from pathlib import Path

from ecotrain.memory.planner import fmt_bytes, from_record, pareto
from ecotrain.report import page as P
from ecotrain.report.plots import figure, png
from ecotrain.base.rundir import atomic_write


def plot(record: dict) -> str:
    s = from_record(record)
    fig, (ax,) = figure(6.4, 3.6)
    mib = 2**20
    ax.scatter([m.peak_bytes / mib for m in s.measured], [m.step_seconds for m in s.measured], color="#1f77b4",
               label="measured plans", zorder=3)
    front = pareto(s.measured)
    ax.plot([m.peak_bytes / mib for m in front], [m.step_seconds for m in front], color="#2ca02c", drawstyle="steps-post",
            label="Pareto front")
    ax.axvline(s.budget / mib, color="#d62728", linestyle="--", label=f"budget {fmt_bytes(s.budget)}")
    ax.axvline(s.usable / mib, color="#d62728", linestyle=":", alpha=0.6, label="budget - margin")
    if s.chosen:
        ax.scatter([s.chosen.peak_bytes / mib], [s.chosen.step_seconds], s=160, facecolors="none", edgecolors="#d62728",
                   linewidths=2, label="chosen", zorder=4)
    ax.set_xlabel("measured peak (MiB)")
    ax.set_ylabel("step time (s)")
    ax.set_title("memory vs step time of the measured plans")
    ax.legend(fontsize=8)
    return png(fig)


def section(record: dict) -> str:
    s = from_record(record)
    rows = [(r["plan"], round(r["peak_bytes"] / 2**20, 1),
             round(r["predicted_bytes"] / 2**20, 1) if r.get("predicted_bytes") else None, r["step_seconds"],
             "chosen" if record.get("chosen") == r else "fits" if r["fits"] else "over")
            for r in record["measured"]]
    pick = (f"chosen: {record['chosen']['plan']}" if record.get("chosen")
            else "no plan fits the budget")
    return ('<section id="memory-plan"><h2>Memory budget</h2>'
            f"<p>budget {P.e(fmt_bytes(s.budget))} (usable {P.e(fmt_bytes(s.usable))}, margin {s.margin:g}); "
            f"{len(s.measured)} plans measured in {s.seconds:.1f} s; {P.e(pick)}</p>"
            + P.img(plot(record), "the Pareto front: measured peak memory against step time of each plan")
            + P.table(["plan", "peak MiB", "predicted MiB", "s/step", ""], rows)
            + '<p class="muted">Peak: the allocator\'s max_memory_allocated on CUDA, the process\'s peak RSS on CPU, '
              "each plan in a fresh process over a few real training steps; step time: the fastest timed step."
              "</p></section>")


def write_page(record: dict, out, name: str) -> Path:
    target = Path(out)
    html = P.page(f"ecotrain plan: {name}", f"memory budget search | written {time.strftime('%Y-%m-%d %H:%M')}",
                  [section(record)])
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(target, html.encode("utf-8"))
    return target
