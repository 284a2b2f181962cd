"""The report's HTML: one self-contained page (inline CSS, plots as data: URIs, no script, no link
to anywhere). A Content-Security-Policy forbids every load but data: images, so even a URL inside a
config value can never make the page reach the network."""

from __future__ import annotations

import json
import math
from html import escape
from typing import Iterable, Optional, Sequence

from ecotrain.accounting.energy import country_intensity, country_iso3
from ecotrain.accounting.report import FIGURES, figure, format_ledger, num
from ecotrain.base.errors import ConfigError
from ecotrain.report import plots
from ecotrain.report.diagnosis import Diagnosis

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d232a;margin:0;background:#f5f6f8}
main{max-width:1340px;margin:0 auto;padding:18px 28px 40px}
h1{font-size:24px;margin:6px 0 2px}h2{font-size:18px;margin:0 0 10px}h3{font-size:15px;margin:14px 0 6px}
.sub{color:#5b6570;margin:0 0 14px;font-size:13px}
section{background:#fff;border:1px solid #dfe3e8;border-radius:8px;padding:14px 18px;margin:14px 0}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:10px 0}
.card{background:#fff;border:1px solid #dfe3e8;border-radius:8px;padding:8px 14px;min-width:120px}
.card b{display:block;font-size:18px}.card span{color:#5b6570;font-size:12px}
.diag{border-left:6px solid #2e7d32}.diag.overfitting{border-left-color:#c62828}
.diag.underfitting,.diag.unstable{border-left-color:#ef6c00}.diag.not-enough-data{border-left-color:#78909c}
.verdict{font-size:12px;text-transform:uppercase;letter-spacing:.05em;color:#5b6570}
.diag p{font-size:15px;margin:4px 0 8px}
table{border-collapse:collapse;font-size:13px}td,th{border-bottom:1px solid #e6e9ed;padding:4px 10px;text-align:left;
vertical-align:top}th{background:#f0f2f5;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#f6f8fa;border:1px solid #e6e9ed;border-radius:6px;padding:10px;overflow:auto;font-size:12px;
max-height:520px}
img{max-width:100%;height:auto;display:block;margin:6px 0}
.note{color:#8a5a00;font-size:13px}.muted{color:#5b6570;font-size:12px}
.pass{color:#2e7d32;font-weight:600}.fail{color:#c62828;font-weight:600}
details>summary{cursor:pointer;color:#37474f;margin:4px 0}
"""


def e(x) -> str:
    return escape("" if x is None else str(x), quote=True)


def fmt(v) -> str:
    if isinstance(v, bool) or v is None:
        return "n/a" if v is None else str(v).lower()
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.3g}"
    return str(v)


def table(header: Optional[Sequence[str]], rows: Iterable[Sequence], numeric_from: int = 1, cls: str = "") -> str:
    out = [f'<table class="{e(cls)}">' if cls else "<table>"]
    if header:
        out.append("<tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>")
    for row in rows:
        cells = []
        for i, c in enumerate(row):
            text = e(fmt(c)) if not isinstance(c, Raw) else c.html
            cells.append(f'<td class="n">{text}</td>' if i >= numeric_from and isinstance(c, (int, float))
                         and not isinstance(c, bool) else f"<td>{text}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    return "\n".join(out) + "</table>"


class Raw:
    """Pre-built HTML for a table cell."""

    def __init__(self, html: str):
        self.html = html


def img(src: str, alt: str) -> str:
    return f'<img src="{src}" alt="{e(alt)}">'


def page(title: str, subtitle: str, body: Sequence[str]) -> str:
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{e(title)}</title><style>{CSS}</style></head>\n<body><main>\n"
            f"<h1>{e(title)}</h1><p class=\"sub\">{e(subtitle)}</p>\n" + "\n".join(body) + "\n</main></body></html>\n")


# -- one run's sections ---------------------------------------------------------------------------
def cards(run) -> str:
    s, L = run.summary or {}, run.ledger
    items = []
    for key in ("test_accuracy", "val_accuracy", "test_loss", "val_loss"):
        if isinstance(s.get(key), (int, float)):
            items.append((fmt(s[key]), key.replace("_", " ")))
    if s.get("steps") is not None:
        items.append((f"{s['steps']:,}", f"steps ({s.get('epochs', 0)} epochs)"))
    if s.get("stopped_because"):
        items.append((s["stopped_because"], "stopped because"))
    if isinstance(s.get("train_seconds"), (int, float)):
        items.append((f"{s['train_seconds']:.1f} s", "training time"))
    if L:
        if L["energy"].get("kwh") is not None:
            items.append((f"{num(L['energy']['kwh'])} kWh", f"energy ({L['energy'].get('method')})"))
        if L["co2e"].get("kg") is not None:
            items.append((f"{num(L['co2e']['kg'] * 1000)} g", f"CO2e ({L['co2e'].get('grid')})"))
    return '<div class="cards">' + "".join(f'<div class="card"><b>{e(v)}</b><span>{e(k)}</span></div>'
                                           for v, k in items) + "</div>"


def diagnosis_section(d: Diagnosis, anchor: str = "diagnosis") -> str:
    cls = d.verdict.replace(" ", "-")
    ev = "".join(f"<li>{e(x)}</li>" for x in d.evidence)
    return (f'<section id="{e(anchor)}" class="diag {e(cls)}"><div class="verdict">diagnosis: {e(d.verdict)}</div>'
            f'<p class="diagnosis-text">{e(d.text)}</p>'
            + (f"<details><summary>evidence (thresholds: docs/report.md)</summary><ul>{ev}</ul></details>" if ev else "")
            + "</section>")


def curves_section(run, d: Diagnosis) -> str:
    return ('<section class="curves"><h2>Learning curves</h2>'
            + img(plots.curves(run, d), f"learning curves of {run.name}: loss, metric, learning rate")
            + '<p class="muted">Training loss: the mean over each log interval, in training mode (augmentation, '
              "dropout on). Validation: each evaluation. The final figures are summary.json's, on the saved weights."
              "</p></section>")


def ledger_section(run, region_codes: Sequence[str]) -> str:
    L = run.ledger
    if L is None:
        return ('<section class="ledger"><h2>Cost</h2><p class="muted">No ledger.json (ledger.enabled=false, or the '
                "run did not finish).</p></section>")
    e_, c = L["energy"], L["co2e"]
    f = L.get("flops") or {}
    parts = ['<section class="ledger"><h2>Cost</h2>']
    parts.append(table(None, [("FLOPs", num(f.get("total"))), ("wall, CPU", f"{fmt(L.get('wall_seconds'))} s, "
                                                                            f"{fmt(L.get('cpu_seconds'))} CPU-s"),
                              ("energy", f"{num(e_.get('kwh'))} kWh" if e_.get("kwh") is not None else "n/a"),
                              ("CO2e", f"{num(c['kg'] * 1000)} g" if c.get("kg") is not None else "n/a"),
                              ("cost", f"{num(L['cost'].get('amount'))} {L['cost'].get('currency', '')}"),
                              ("energy method", e_.get("method") or "n/a"),
                              ("how", e_.get("how") or e_.get("missing_reason") or "n/a"),
                              ("grid", f"{c.get('grid')}: {fmt(c.get('g_per_kwh'))} g/kWh ({c.get('source')})")]))
    rows, note = region_rows(L, region_codes)
    if rows:
        parts.append(img(plots.regions(rows, e_["kwh"], e_.get("method") or ""), "CO2e by grid region"))
        parts.append('<p class="muted">The same energy on other grids (CodeCarbon\'s per-country data): what choosing '
                     "the region alone would change; the recorded grid in red. `ecotrain ledger RUN --regions ...` "
                     "prints it.</p>")
    if note:
        parts.append(f'<p class="note">{e(note)}</p>')
    parts.append(f'<details><summary>the whole ledger (as `ecotrain ledger` prints it)</summary>'
                 f'<pre style="white-space:pre-wrap">{e(format_ledger(L))}</pre></details></section>')
    return "".join(parts)


def region_rows(L: dict, codes: Sequence[str]) -> tuple[list, str]:
    kwh = L["energy"].get("kwh")
    if kwh is None:
        return [], f"No CO2e-by-region chart: no energy figure ({L['energy'].get('missing_reason')})."
    rows, grid = [], L["co2e"].get("grid")
    if L["co2e"].get("kg") is not None:
        rows.append((f"{grid} (recorded)", L["co2e"]["kg"] * 1000, True))
    try:
        for code in codes:
            iso3 = country_iso3(code)
            if iso3 == grid:
                continue
            g, _ = country_intensity(iso3)
            rows.append((iso3, kwh * g, False))
    except ConfigError as exc:
        return rows, f"CO2e by region incomplete: {exc}"
    return rows, ""


def checkpoints_section(run) -> str:
    s = run.summary or {}
    if not run.checkpoints:
        return '<section class="checkpoints"><h2>Checkpoints</h2><p class="muted">None kept.</p></section>'
    last = (s.get("last_checkpoint") or "").rstrip("/").rsplit("/", 1)[-1]
    rows = []
    for c in run.checkpoints:
        marks = [m for m, on in (("last", c["name"] == last), ("best step", c["step"] == s.get("best_step"))) if on]
        rows.append((c["name"], c["step"], "yes" if c["complete"] else "no (no MANIFEST.json)",
                     f"{c['bytes'] / 2**20:.2f} MiB", ", ".join(marks)))
    weights = [(n, f"{b / 2**20:.2f} MiB") for n, b in run.files if n.endswith(".safetensors")]
    return ('<section class="checkpoints"><h2>Checkpoints and weights</h2>'
            + table(["checkpoint", "step", "complete", "size", ""], rows)
            + (("<h3>Weights</h3>" + table(["file", "size"], weights)) if weights else "")
            + f'<p class="muted">model.safetensors holds the weights the test ran on (step '
              f'{e(fmt(s.get("best_step")))}\'s, the best evaluation, unless early stopping kept the last).</p>'
            + "</section>")


def environment_section(run) -> str:
    env = run.environment
    if env is None:
        return ('<section class="environment"><h2>Environment</h2><p class="muted">No environment.json (the run did '
                "not finish, or an older ecotrain wrote it).</p></section>")
    rows = []
    py, pl, hw = env.get("python", {}), env.get("platform", {}), env.get("hardware", {})
    rows.append(("python", f"{py.get('version')} ({py.get('implementation')})"))
    rows.append(("platform", f"{pl.get('system')} {pl.get('release')} {pl.get('machine')}"))
    git = env.get("git")
    if git:
        rows.append(("git", f"{(git.get('commit') or 'no commit')[:12]}{' (dirty)' if git.get('dirty') else ''}"
                            f"{' on ' + git['branch'] if git.get('branch') else ''} in {git.get('root')}"))
    else:
        rows.append(("git", "not in a git repository (or git unavailable)"))
    rows.append(("CPU", f"{hw.get('cpu_model')}: {hw.get('cpu_count')} logical, {hw.get('cpus_usable', '?')} usable, "
                        f"{hw.get('torch_threads', '?')} torch threads"))
    rows.append(("memory", f"{hw.get('memory_gb')} GiB"))
    gpus = hw.get("gpus") or []
    rows.append(("GPU", ", ".join(f"{g['name']} ({g.get('memory_gb')} GiB)" for g in gpus) or "none"))
    rows.append(("dataset hash", env.get("dataset_hash") or (run.summary or {}).get("dataset_hash")))
    rows.append(("packages", ", ".join(f"{k} {v}" for k, v in sorted(env.get("packages", {}).items()))))
    return '<section class="environment"><h2>Environment</h2>' + table(None, rows) + "</section>"


def config_section(run) -> str:
    return (f'<section class="config"><h2>Config</h2><details><summary>config.yaml ({len(run.config_text.splitlines())}'
            f" lines)</summary><pre>{e(run.config_text)}</pre></details></section>")


def trackers_section(run) -> str:
    rows = [(n, f"{b / 2**10:.1f} KiB") for n, b in run.files]
    extra = []
    if run.mlflow:
        extra.append(("MLflow", f"run {run.mlflow.get('run_id')} in {run.mlflow.get('tracking_uri')} "
                                f"(experiment {run.mlflow.get('experiment_id')})"))
    if (run.path / "tensorboard").is_dir():
        extra.append(("TensorBoard", f"tensorboard --logdir {run.path / 'tensorboard'}"))
    return ('<section class="files"><h2>Run folder</h2>'
            + (table(None, extra) if extra else "") + table(["file", "size"], rows)
            + "".join(f'<p class="note">{e(n)}</p>' for n in run.notes) + "</section>")


# -- methods' own sections ------------------------------------------------------------------------
def method_sections(run) -> str:
    """One section per summary.json `methods.<key>`, rendered generically (docs/report.md):
    `title` and `text` strings head it; numbers, strings and nested dicts become table rows; a list
    of numbers or of [x, y] pairs becomes a line plot; anything else is shown as JSON."""
    methods = (run.summary or {}).get("methods") or {}
    out = []
    for key, fig in methods.items():
        if not isinstance(fig, dict):
            fig = {"value": fig}
        title, text = fig.get("title"), fig.get("text")
        rows, images = [], []
        for k, v in _flat(fig):
            if k in ("title", "text"):
                continue
            if _is_series(v):
                images.append(img(plots.series(k, v), f"{key}: {k}"))
            elif isinstance(v, (int, float, str, bool)) or v is None:
                rows.append((k, v))
            else:
                rows.append((k, json.dumps(v)[:300]))
        out.append(f'<section class="method" id="method-{e(key)}"><h2>{e(title or "Method: " + str(key))}</h2>'
                   + (f"<p>{e(text)}</p>" if text else "") + (table(None, rows) if rows else "")
                   + "".join(images) + "</section>")
    return "\n".join(out)


def _flat(d: dict, prefix: str = ""):
    for k, v in d.items():
        if isinstance(v, dict) and v and not _is_series(v):
            yield from _flat(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def _is_series(v) -> bool:
    if not isinstance(v, (list, tuple)) or len(v) < 2:
        return False
    if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        return True
    return all(isinstance(x, (list, tuple)) and len(x) == 2 and all(isinstance(y, (int, float)) for y in x) for x in v)


# -- several runs ---------------------------------------------------------------------------------
COMPARE_ROWS = (("test_accuracy", "summary"), ("val_accuracy", "summary"), ("test_loss", "summary"),
                ("val_loss", "summary"), ("train_val_gap", "summary"), ("best_val_metric", "summary"),
                ("best_step", "summary"), ("steps", "summary"), ("stopped_because", "summary"),
                ("train_seconds", "summary"))


def comparison_table(runs, groups: Sequence[int], diagnoses: Sequence[Diagnosis]) -> str:
    header = [""] + [f"{r.label}" + (f" [group {g + 1}]" if max(groups) > 0 else "") for r, g in zip(runs, groups)]
    rows = [["diagnosis"] + [d.verdict for d in diagnoses]]
    for key, _ in COMPARE_ROWS:
        vals = [(r.summary or {}).get(key) for r in runs]
        if any(v is not None for v in vals):
            rows.append([key] + vals)
    for key, (label, _) in FIGURES.items():
        vals = [figure(r.ledger, key) if r.ledger else None for r in runs]
        if any(v is not None for v in vals):
            rows.append([label] + [num(v) if v is not None else None for v in vals])
    rows.append(["energy method"] + [(r.ledger or {}).get("energy", {}).get("method") for r in runs])
    rows.append(["dataset hash"] + [((r.summary or {}).get("dataset_hash") or "")[:19] for r in runs])
    rows.append(["git commit"] + [(((r.environment or {}).get("git") or {}).get("commit") or "")[:12] for r in runs])
    return table(header, rows)
