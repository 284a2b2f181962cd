"""The report's figures: matplotlib (Agg, no display, no pyplot state), each returned as a PNG data URI."""

from __future__ import annotations

import base64
import io
import signal
import threading
from typing import Optional, Sequence

from ecotrain.base.errors import ConfigError

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f",
          "#bcbd22")
DPI = 100


def load_matplotlib():
    """matplotlib's Figure and Agg canvas (the `report` extra), imported with SIGINT and SIGTERM held
    back. Raised inside this import, the KeyboardInterrupt of a stop signal (cli/program.py: commands that do
    not train stop at once) can be swallowed where a C extension imports numpy and turned into an
    ImportError, leaving half-imported modules that fail later with an unrelated error (exit 1, or
    "needs matplotlib") instead of 130. Held back, the signal arrives as soon as the import is done."""
    held = hasattr(signal, "pthread_sigmask") and threading.current_thread() is threading.main_thread()
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM}) if held else None
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError("ecotrain report: needs matplotlib; pip install 'ecotrain[report]'") from None
    finally:
        if held:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)  # a signal that came meanwhile is delivered here
    return Figure, FigureCanvasAgg


def figure(width: float, height: float, ncols: int = 1):
    Figure, FigureCanvasAgg = load_matplotlib()
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
    return fig, axes


def png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _xy(points):
    return [p[0] for p in points], [p[1] for p in points]


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#777")


def curves(run, diagnosis=None) -> str:
    """Loss (train vs validation), the validation metric (with the final train/val/test figures),
    and the learning rate, side by side."""
    fig, (ax_loss, ax_metric, ax_lr) = figure(13, 3.6, 3)
    train, val = run.series("loss"), run.series("val_loss")
    if train:
        ax_loss.plot(*_xy(train), color=COLORS[0], lw=1.4, label="train (log intervals)")
    if val:
        ax_loss.plot(*_xy(val), color=COLORS[1], lw=1.6, marker="o", ms=3, label="validation")
    s = run.summary or {}
    best = s.get("best_step")
    if best is not None and val:
        ax_loss.axvline(best, color="#555", ls=":", lw=1, label=f"best step {best:,}")
    if diagnosis is not None and diagnosis.rises_from is not None and val:
        ax_loss.axvspan(diagnosis.rises_from, val[-1][0], color=COLORS[1], alpha=0.08, label="validation rising")
    if not (train or val):
        _empty(ax_loss, "no loss recorded")
    ax_loss.set(title="loss", xlabel="step")
    if train and val and min(v for _, v in train + val) > 0 and max(v for _, v in train + val) / min(
            v for _, v in train + val) > 50:
        ax_loss.set_yscale("log")
    if ax_loss.get_legend_handles_labels()[0]:  # nothing labelled (no loss recorded): no empty legend, no warning
        ax_loss.legend(fontsize=8)

    metric = run.metric
    if metric:
        pts = run.series(metric)
        if metric == "val_perplexity":  # a language model: training perplexity beside it, the diagnosis on it
            tp = run.train_perplexity()
            if tp:
                ax_metric.plot(*_xy(tp), color=COLORS[0], lw=1.4, label="train (log intervals)")
            if diagnosis is not None and diagnosis.rises_from is not None and pts:
                ax_metric.axvspan(diagnosis.rises_from, pts[-1][0], color=COLORS[1], alpha=0.08,
                                  label="validation rising")
            if pts and min(v for _, v in tp + pts) > 0 and max(v for _, v in tp + pts) / min(v for _, v in tp + pts) > 20:
                ax_metric.set_yscale("log")
        ax_metric.plot(*_xy(pts), color=COLORS[1], lw=1.6, marker="o", ms=3, label="validation")
        name = metric[4:]
        x_end = max([p[0] for p in pts] + [s.get("steps") or 0])
        es = run.config.get("early_stopping") or {}
        if best is not None and (es.get("restore_best", True) or not es.get("enabled")):
            x_end = best  # finish tests the best evaluation's weights: the final figures belong to that step
        for key, color, marker, label in ((f"train_{name}", COLORS[0], "s", "final train"),
                                          (f"val_{name}", COLORS[1], "D", "final validation"),
                                          (f"test_{name}", COLORS[2], "*", "final test")):
            if isinstance(s.get(key), (int, float)):
                ax_metric.plot([x_end], [s[key]], marker=marker, ms=9 if marker == "*" else 6, color=color,
                               ls="none", label=f"{label} {s[key]:.3f}")
        ax_metric.legend(fontsize=8)
        ax_metric.set(title=name.replace("_", " "), xlabel="step")
    else:
        _empty(ax_metric, "no validation metric")
        ax_metric.set(title="metric")
    lr = run.series("lr")
    if lr:
        ax_lr.plot(*_xy(lr), color=COLORS[3], lw=1.4)
        ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    else:
        _empty(ax_lr, "no learning rate recorded")
    ax_lr.set(title="learning rate", xlabel="step")
    return png(fig)


def regions(rows: Sequence[tuple[str, float, bool]], kwh: float, method: str) -> str:
    """CO2e (g) of the run's energy on each grid; `rows` = (label, grams, is the recorded grid)."""
    fig, (ax,) = figure(7.5, 0.3 * len(rows) + 1.2)
    labels = [r[0] for r in rows]
    ax.barh(labels, [r[1] for r in rows], color=[COLORS[1] if r[2] else COLORS[0] for r in rows])
    ax.invert_yaxis()
    for i, r in enumerate(rows):
        ax.text(r[1], i, f" {r[1]:.3g} g", va="center", fontsize=8)
    ax.set(xlabel=f"g CO2e for this run's {kwh:.3g} kWh ({method})", title="CO2e by grid region")
    ax.margins(x=0.15)
    return png(fig)


def overlay(runs: Sequence) -> str:
    """Several runs: validation loss, training loss and the validation metric, one colour per run."""
    fig, (ax_val, ax_train, ax_metric) = figure(13, 3.8, 3)
    metric = next((r.metric for r in runs if r.metric), None)
    for i, run in enumerate(runs):
        c = COLORS[i % len(COLORS)]
        if run.series("val_loss"):
            ax_val.plot(*_xy(run.series("val_loss")), color=c, lw=1.5, marker="o", ms=2.5, label=run.label)
        if run.series("loss"):
            ax_train.plot(*_xy(run.series("loss")), color=c, lw=1.3, label=run.label)
        if metric and run.series(metric):
            ax_metric.plot(*_xy(run.series(metric)), color=c, lw=1.5, marker="o", ms=2.5, label=run.label)
    ax_val.set(title="validation loss", xlabel="step")
    ax_train.set(title="training loss", xlabel="step")
    ax_metric.set(title=(metric or "validation metric").replace("_", " "), xlabel="step")
    for ax in (ax_val, ax_train, ax_metric):
        if ax.lines:
            ax.legend(fontsize=7)
        else:
            _empty(ax, "not recorded")
    return png(fig)


def series(title: str, values: Sequence, xlabel: Optional[str] = None) -> str:
    """A method's list of numbers (or of [x, y] pairs) as a small line plot."""
    fig, (ax,) = figure(5.5, 2.6)
    if values and isinstance(values[0], (list, tuple)):
        ax.plot([v[0] for v in values], [v[1] for v in values], color=COLORS[0], lw=1.4, marker="o", ms=2.5)
    else:
        ax.plot(range(len(values)), list(values), color=COLORS[0], lw=1.4, marker="o", ms=2.5)
    ax.set(title=title, xlabel=xlabel or ("x" if values and isinstance(values[0], (list, tuple)) else "index"))
    return png(fig)
