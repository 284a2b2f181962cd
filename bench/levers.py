"""Each lever's measured effect on what is paid (wall, CPU time, energy, money) next to its FLOPs effect.

    python bench/levers.py [--seeds 0] [--scale 1.0] [--threads 1] [--out runs/bench-levers] [--quick]

Every row is `recipes/mnist1d_cnn.yaml` plus one lever, trained in an interleaved pair with the
baseline (baseline, lever on even seeds; lever, baseline on odd ones), one process per run, the same
thread count, grid and price table on both sides; the ratios are the lever's figure over its own
pair's baseline, the median over the seeds. `--scale` shortens the baseline and every lever's step
count alike (0.25: a quarter of the steps) to fit a busy machine's time. A lever whose FLOPs ratio is
more than 0.15 below its energy ratio is labelled `flops-only` (it saves FLOPs, not time), one whose
energy ratio is above 1.05 `costs more`. One seed's wall and energy move by about 20% with the load:
read ratios between 0.8 and 1.2 as no effect.

The accuracy column is the test accuracy of one or few design seeds: the lever's direction, not a
claim (claims: bench/green_measured.py, docs/evaluation.md). Energy is the ledger's estimate on a
machine without RAPL (docs/ledger.md): TDP x process CPU load plus a RAM power x wall time.

`--quick`: 40-step runs on 1000 samples, three levers (seconds per run; the plumbing only).

Ends with one line `RESULT levers=N seeds=... scale=... <lever>_energy=<ratio> <lever>_flops=<ratio> ...
flops_only=<names> costs_more=<names>`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from ecotrain.accounting.report import figure  # noqa: E402
from ecotrain.seeds.sweep import parse_seeds  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "recipes/mnist1d_cnn.yaml"
STEPS = 6000  # the baseline's loop.max_steps
# name -> (overrides of the baseline; steps as a fraction of the baseline's, scaled by --scale)
LEVERS = {
    "big_batch": (["data.batch_size=500", "optim.lr=0.03", "schedule.warmup=50"], 1000 / STEPS),
    "small_batch": (["data.batch_size=32"], 1.0),
    "short_schedule": (["optim.lr=0.02"], 0.4),
    "narrow": (["model.kwargs.channels=16"], 1.0),
    "early_stop": (["early_stopping.enabled=true", "early_stopping.patience=2"], 1.0),
    "selective": (["methods=[{name: selective_backprop, keep: 0.5}]"], 1.0),
    "prune": (["methods=[{name: prune, kind: structured, amount: 0.3}]"], 1.0),
    "bf16": (["precision=bf16-mixed"], 1.0),
}
QUICK_LEVERS = ("big_batch", "small_batch", "narrow")
FIGS = ("flops", "wall_seconds", "cpu_seconds", "energy", "cost")


def fit(overrides: list[str], seed: int, run_dir: Path) -> dict:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("OMP_NUM_THREADS", None)  # threads=N in the overrides, the same on both sides
    env.setdefault("ECOTRAIN_CACHE", str(Path(tempfile.gettempdir()) / "ecotrain-bench-cache"))
    r = subprocess.run([sys.executable, "-m", "ecotrain", "fit", BASELINE, f"seed={seed}", *overrides,
                        "--run-dir", str(run_dir), "--overwrite", "--quiet"], cwd=ROOT, env=env, text=True,
                       capture_output=True)
    if r.returncode != 0:
        sys.exit(f"bench/levers.py: {' '.join(overrides)} seed {seed} failed:\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}")
    L = json.loads((run_dir / "ledger.json").read_text())
    acc = json.loads((run_dir / "summary.json").read_text())["test_accuracy"]
    return {"acc": acc, **{k: figure(L, k) for k in FIGS}}


def steps(fraction: float, scale: float, quick: bool) -> int:
    return 40 if quick else max(10, round(STEPS * fraction * scale))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0", help="design seeds (direction only, not a claim)")
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of every step count")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--levers", default=None, help="comma list (default: all)")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench-levers"))
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    names = args.levers.split(",") if args.levers else list(QUICK_LEVERS if args.quick else LEVERS)
    unknown = [n for n in names if n not in LEVERS]
    if unknown:
        sys.exit(f"bench/levers.py: unknown lever {unknown[0]!r}; one of {', '.join(LEVERS)}")
    seeds = parse_seeds(args.seeds)
    common = [f"threads={args.threads}"]
    if args.quick:
        common += ["data.num_samples=1000", "loop.eval_every=20", "schedule.warmup=5"]
    out = Path(args.out).resolve() / ("quick" if args.quick else "full")
    base_steps = steps(1.0, args.scale, args.quick)
    base_o = [*common, f"loop.max_steps={base_steps}", f"loop.eval_every={max(1, base_steps // 12)}"]
    rows = {}
    for name in names:
        extra, frac = LEVERS[name]
        n = steps(frac, args.scale, args.quick)
        lever_o = [*common, *extra, f"loop.max_steps={n}", f"loop.eval_every={max(1, n // 12)}"]
        ratios, accs = {k: [] for k in FIGS}, []
        for i, seed in enumerate(seeds):
            pair = [("base", base_o), ("lever", lever_o)][:: 1 if i % 2 == 0 else -1]
            got = {side: fit(o, seed, out / f"{name}-{side}-s{seed}") for side, o in pair}
            for k in FIGS:
                ratios[k].append(got["lever"][k] / got["base"][k])
            accs.append(got["lever"]["acc"] - got["base"]["acc"])
        rows[name] = {k: statistics.median(v) for k, v in ratios.items()} | {"dacc": statistics.fmean(accs)}
        r = rows[name]
        print(f"  {name:15s} FLOPs {r['flops']:.3f}x  wall {r['wall_seconds']:.3f}x  CPU {r['cpu_seconds']:.3f}x  "
              f"energy {r['energy']:.3f}x  money {r['cost']:.3f}x  test acc {r['dacc'] * 100:+.2f} pts", flush=True)
    # labels: a lever that makes the run dearer says so; one whose FLOPs fall well below its energy saves FLOPs, not time
    costs_more = [n for n, r in rows.items() if r["energy"] > 1.05]
    flops_only = [n for n, r in rows.items() if r["flops"] < r["energy"] - 0.15 and n not in costs_more]
    label = lambda n: "costs more" if n in costs_more else "flops-only" if n in flops_only else ""  # noqa: E731
    print("\n| lever | overrides | FLOPs | wall | CPU s | energy | money | test acc (pts) | |\n|---|---|---|---|---|---|---|---|---|")
    for n, r in rows.items():
        print(f"| {n} | `{' '.join(LEVERS[n][0])}` | {r['flops']:.2f}x | {r['wall_seconds']:.2f}x | "
              f"{r['cpu_seconds']:.2f}x | {r['energy']:.2f}x | {r['cost']:.2f}x | {r['dacc'] * 100:+.1f} | "
              f"{label(n)} |")
    cells = " ".join(f"{n}_energy={r['energy']:.3f} {n}_flops={r['flops']:.3f}" for n, r in rows.items())
    print(f"RESULT levers={len(rows)} seeds={args.seeds} scale={args.scale:g} threads={args.threads} {cells} "
          f"flops_only={','.join(flops_only) or 'none'} costs_more={','.join(costs_more) or 'none'} "
          f"quick={int(args.quick)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
