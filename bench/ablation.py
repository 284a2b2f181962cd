"""Each efficiency lever alone against the baseline: its cost ratio and accuracy change.

    python bench/ablation.py [--seeds 0] [--only short,ema] [--scale 0.333]
                             [--baseline-group runs/bench-green/baseline-group.json] [--quick]

Every row is the baseline recipe (recipes/mnist1d_cnn.yaml as shipped) plus one lever's overrides,
trained with `ecotrain fit ... --seeds S --run-dir OUT/<row>` (the real CLI), then read back like
`ecotrain compare OUT/../baseline-group.json OUT/<row>-group.json`: median FLOPs and CPU-seconds
as fractions of the baseline's, and the median test-accuracy change in points. The baseline is
the bench/green.py group when one exists (`--baseline-group`), else trained here with the same seeds.
`--scale F` runs the whole table, baseline included, at F x the baseline's 6000 steps (a row's own
step count scales with it): the levers at a third of the cost, against a baseline shortened alike.
A row whose start is refused (a method that does not apply to this model) is reported with its
one-line reason instead of figures. Both sides run with one intra-op thread (see bench/green.py).

Prints a Markdown table (docs/efficiency.md holds its last output) and ends with
`RESULT rows=<n> baseline_acc=<f> best_cost=<row> best_cost_flops_ratio=<f>`: the row with the
lowest FLOPs ratio among those within 1 point of the baseline's accuracy. `--quick` (a check that
the bench runs, not a figure): one row (`short`) and the baseline at 30 steps, in a temporary folder.
"""

from __future__ import annotations

import argparse
import atexit
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from green import BASELINE, ROOT, rows as group_rows, train_group  # noqa: E402

BASE_STEPS = 6000  # recipes/mnist1d_cnn.yaml's loop.max_steps

# (row, what it tests, overrides of the baseline recipe given its step count S). Costs a teacher or a
# reference run adds are in the row's own ledger (count_teacher / count_reference): on the row's side.
LEVERS = [
    ("short", "a third of the steps, cosine as shipped", lambda S: [f"loop.max_steps={S // 3}"]),
    ("batch50", "batches of 50 for a quarter of the samples (S/2 steps)",
     lambda S: ["data.batch_size=50", f"loop.max_steps={S // 2}"]),
    ("onecycle", "one-cycle to lr-find's LR (0.02)", lambda S: ["schedule.name=onecycle", "schedule.warmup=0",
                                                                 "optim.lr=0.02"]),
    ("narrow", "ConvBase with 16 channels instead of 25", lambda S: ["model.kwargs.channels=16"]),
    ("batch200", "batches of 200, half the steps (same samples), lr x2",
     lambda S: ["data.batch_size=200", f"loop.max_steps={S // 2}", "optim.lr=0.02"]),
    ("ema", "EMA of the weights (decay 0.998)", lambda S: ["methods=[{name: ema, decay: 0.998}]"]),
    ("selective", "selective backprop, the hardest 50% of each batch",
     lambda S: ["methods=[{name: selective_backprop, keep: 0.5}]"]),
    ("late_freeze", "conv1 and conv2 frozen for the last half",
     lambda S: ["methods=[{name: late_freeze, freeze_depth: 2, at: 0.5}]"]),
    ("batch_ramp", "batch 25 -> 100 over the first quarter, linear LR",
     lambda S: [f"methods=[{{name: batch_ramp, lr_scaling: linear, steps: {S // 4}}}]"]),
    ("dedup", "exact + near-duplicate removal", lambda S: ["methods=[{name: dedup}]"]),
    ("prune", "structured L1 pruning, 50% of channels by mid-run",
     lambda S: ["methods=[{name: prune, kind: structured, amount: 0.5}]"]),
    ("resize", "progressive resizing (x0.5, x0.75)", lambda S: ["methods=[{name: progressive_resize}]"]),
    ("stability", "stop once val_loss is stable over 5 evaluations",
     lambda S: ["methods=[{name: stability_stop, window: 5}]"]),
]


def medians(group: Path) -> dict:
    """A group's median test accuracy, FLOPs and CPU-seconds over its seeds (bench/green.py reads the runs)."""
    got = group_rows(group)
    return {k: statistics.median(r[key] for r in got) for k, key in (("acc", "test"), ("flops", "flops"), ("cpu", "cpu"))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--only", help="comma list of rows (default: all): " + ",".join(r for r, _, _ in LEVERS))
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench-ablation"))
    ap.add_argument("--baseline-group", default=str(ROOT / "runs" / "bench-green" / "baseline-group.json"))
    ap.add_argument("--scale", type=float, default=1.0, help="every schedule's steps x this (baseline included, "
                    "then trained here): 0.333 runs the whole table at a third of the cost")
    ap.add_argument("--quick", action="store_true", help="one row, 30 steps, a temporary folder: checks the bench runs")
    args = ap.parse_args()
    if args.quick:
        args.only, args.scale, args.out = "short", 30 / BASE_STEPS, tempfile.mkdtemp(prefix="bench-ablation-")
        atexit.register(shutil.rmtree, args.out, ignore_errors=True)
    steps = round(BASE_STEPS * args.scale)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows = [r for r in LEVERS if not args.only or r[0] in args.only.split(",")]
    base_group = Path(args.baseline_group)
    if args.scale != 1.0 or not base_group.is_file():
        base_group = train_group(BASELINE, out / "baseline", args.seeds, fresh=False,
                                 extra=[f"loop.max_steps={steps}"] if args.scale != 1.0 else [])
    b = medians(base_group)
    n_base = len(json.loads(base_group.read_text())["runs"])
    table = ["| lever | what | seeds | FLOPs ratio | CPU-s ratio | test acc change (points) |",
             "|---|---|---|---|---|---|"]
    best = None
    for name, what, levers in rows:
        overrides = [f"loop.max_steps={steps}", *levers(steps)]  # a row's own max_steps comes last and wins
        try:
            group = train_group(BASELINE, out / name, args.seeds, fresh=False, extra=overrides)
        except SystemExit as exc:  # a refused start: its one line is the row's result
            reason = next((ln for ln in str(exc).splitlines() if "error:" in ln), str(exc).splitlines()[-1])
            table.append(f"| {name} | {what} | - | n/a | n/a | refused: {reason.split('error: ', 1)[-1][:150]} |")
            continue
        m = medians(group)
        fr, cr, d = m["flops"] / b["flops"], m["cpu"] / b["cpu"], (m["acc"] - b["acc"]) * 100
        table.append(f"| {name} | {what} | {args.seeds} | {fr:.3f} | {cr:.3f} | {d:+.1f} |")
        if d >= -1.0 and (best is None or fr < best[1]):
            best = (name, fr)
    print(f"\nbaseline: {BASELINE.name} at {steps} steps, median of {n_base} seed(s), test accuracy {b['acc']:.4f} "
          f"({base_group})")
    print("\n".join(table))
    best = best or ("none", float("nan"))
    print(f"RESULT rows={len(rows)} baseline_acc={b['acc']:.4f} best_cost={best[0]} best_cost_flops_ratio={best[1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
