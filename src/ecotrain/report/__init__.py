"""`ecotrain report RUN [RUN ...]`: one self-contained report.html (docs/report.md).

For one run: a plain-words diagnosis (diagnosis.py), learning curves, the cost ledger with a
CO2e-by-region chart, checkpoints, methods' own sections, environment, config and the run folder.
For several (each argument a run folder or a comma list of them, a seed group): a comparison
table, overlaid curves and `ecotrain compare`'s verdict of each group against the first, then each
run's own sections.

Everything is read from the run folders' files (rundata.py); plots are matplotlib PNGs embedded as
data: URIs (plots.py); the page has no script and loads nothing (page.py).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional, Sequence

from ecotrain.accounting.compare import judge
from ecotrain.base.errors import ConfigError
from ecotrain.report import page as P
from ecotrain.report import plots
from ecotrain.report.diagnosis import diagnose, diagnose_lm
from ecotrain.report.memory_page import section
from ecotrain.report.page import e
from ecotrain.report.rundata import read_run
from ecotrain.base.rundir import atomic_write, refuse_overwriting
from ecotrain.base.version import __version__
from ecotrain.base.runfiles import REPORT

DEFAULT_REGIONS = ("SE", "FR", "GB", "DE", "US", "CN", "IN", "PL", "AU")


def diagnose_run(run):
    es = run.config.get("early_stopping") if isinstance(run.config.get("early_stopping"), dict) else None
    if run.is_lm:  # perplexity curves (diagnosis.diagnose_lm)
        return diagnose_lm(run.series("val_perplexity"), run.train_perplexity(), run.summary or {}, es)
    return diagnose(run.series("val_loss"), run.series("loss"), run.summary or {}, es)


def _run_sections(run, d, regions, heading: bool) -> list[str]:
    out = []
    if heading:
        out.append(f'<h2 id="run-{P.e(run.path.name)}" style="margin-top:28px">{P.e(run.label)}</h2>'
                   f'<p class="sub">{P.e(run.path)}</p>')
    out += [P.cards(run), P.diagnosis_section(d, "diagnosis" if not heading else f"diagnosis-{run.path.name}"),
            P.curves_section(run, d), P.ledger_section(run, regions), P.checkpoints_section(run)]
    methods = P.method_sections(run)
    if methods:
        out.append(methods)
    if isinstance((run.summary or {}).get("memory_plan"), dict):  # memory.budget's measurements
        out.append(section(run.summary["memory_plan"]))
    out += [P.environment_section(run), P.config_section(run), P.trackers_section(run)]
    return out


def build_report(groups: Sequence[Sequence[str]], out: Optional[str | Path] = None,
                 regions: Sequence[str] = DEFAULT_REGIONS, by: str = "co2e", metric: str = "test_accuracy",
                 max_accuracy_drop: float = 0.01, min_cost_cut: float = 0.5) -> Path:
    """Write the report of `groups` (each a list of run folders) and return its path. Default path:
    RUN/report.html for one run, ./report.html for several."""
    paths = [(g, p) for g, group in enumerate(groups) for p in group]
    if not paths:
        raise ConfigError("report: give at least one run folder")
    plots.load_matplotlib()  # first: its import holds a stop signal back (plots.py says why); the rest is ours
    runs = [read_run(p) for _, p in paths]
    group_of = [g for g, _ in paths]
    diagnoses = [diagnose_run(r) for r in runs]
    stamp = time.strftime("%Y-%m-%d %H:%M")
    if len(runs) == 1:
        run = runs[0]
        title = f"ecotrain report: {run.name}"
        body = _run_sections(run, diagnoses[0], regions, heading=False)
        subtitle = f"run folder {run.path} | written {stamp} by ecotrain {__version__}"
        target = Path(out) if out else run.path / REPORT
    else:
        title = f"ecotrain report: {len(runs)} runs"
        subtitle = (f"{', '.join(str(r.path) for r in runs)} | written {stamp} by ecotrain {__version__}")
        body = ['<section id="comparison"><h2>Comparison</h2>' + P.comparison_table(runs, group_of, diagnoses)
                + "</section>"]
        body.append(_verdicts(groups, by, metric, max_accuracy_drop, min_cost_cut))
        body.append('<section id="overlay"><h2>Learning curves, overlaid</h2>'
                    + P.img(plots.overlay(runs), "overlaid learning curves") + "</section>")
        for run, d in zip(runs, diagnoses):
            body += _run_sections(run, d, regions, heading=True)
        target = Path(out) if out else Path(REPORT)
    if out:
        refuse_overwriting(target, "--out")
    html = P.page(title, subtitle, body)
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(target, html.encode("utf-8"))
    return target


def _verdicts(groups, by, metric, max_drop, min_cut) -> str:
    parts = ['<section id="verdict"><h2>Verdict (ecotrain compare)</h2>']
    if len(groups) < 2:
        parts.append('<p class="muted">One group of runs: no baseline to compare with. Give the baseline and the '
                     "candidate as two arguments (each a run folder or a comma list of seeds).</p></section>")
        return "".join(parts)
    base = list(groups[0])
    for i, cand in enumerate(groups[1:], start=2):
        for figure in dict.fromkeys([by, "flops"]):  # a run without energy figures: FLOPs, said so
            cmd = (f"ecotrain compare {','.join(base)} {','.join(cand)} --by {figure} --metric {metric} "
                   f"--max-accuracy-drop {max_drop:g} --min-cost-cut {min_cut:g}")
            try:
                text, said = judge(base, list(cand), max_drop, min_cut, figure, metric)
            except ConfigError as exc:
                parts.append(f'<p class="note">group {i} vs group 1 --by {e(figure)}: no verdict: {e(exc)}</p>')
                if not str(exc).startswith(f"--by {figure}:"):
                    break
                continue
            verdict = f'<p class="{"pass" if said == "PASS" else "fail"}">group {i} vs group 1: {said}</p>'
            parts.append(f"{verdict}<pre>$ {e(cmd)}\n{e(text)}</pre>")
            break
    parts.append("</section>")
    return "".join(parts)
