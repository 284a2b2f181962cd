"""Each lever's measured effect on what is paid (wall, CPU time, energy, money) next to its FLOPs effect.

    python bench/levers.py [--recipe demo|glyphs|lm] [--seeds 0] [--scale 1.0] [--threads 1]
                           [--out runs/bench-levers] [--quick]

Every row is the baseline recipe (`--recipe`: the demo, recipes/mnist1d_cnn.yaml, whose time is mostly
start-up and Python; or a compute-bound proof recipe, recipes/glyphs_cnn2d.yaml or recipes/lm_green.yaml,
whose time is its kernels) plus one lever, trained in an interleaved pair with the
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

Ends with one line `RESULT recipe=... levers=N seeds=... scale=... <lever>_energy=<ratio> <lever>_wall=<ratio>
<lever>_flops=<ratio> ... time_cut_best=<1 - the best model or data lever's wall ratio> time_cut_best_lever=<name>
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
# name -> (overrides of the baseline; steps as a fraction of the baseline's, scaled by --scale; kind). The kind
# says what a lever changes: the schedule (steps, batch, LR) or the model or data (the "real" levers).
# "{teacher}" in an override is the pair's baseline run folder: a teacher the user already has (its training
# is not counted: it was paid for before; count_teacher=false), so that baseline trains first.
DEMO = {
    "big_batch": (["data.batch_size=500", "optim.lr=0.03", "schedule.warmup=50"], 1000 / 6000, "schedule"),
    "small_batch": (["data.batch_size=32"], 1.0, "schedule"),
    "short_schedule": (["optim.lr=0.02"], 0.4, "schedule"),
    "narrow": (["model.kwargs.channels=16"], 1.0, "model"),
    "early_stop": (["early_stopping.enabled=true", "early_stopping.patience=2"], 1.0, "schedule"),
    "selective": (["methods=[{name: selective_backprop, keep: 0.5}]"], 1.0, "data"),
    "prune": (["methods=[{name: prune, kind: structured, amount: 0.3}]"], 1.0, "model"),
    "bf16": (["precision=bf16-mixed"], 1.0, "model"),
}
# the compute-bound proof recipes: their step time is their kernels, so a model or data lever can show in wall
GLYPHS = {
    "narrow": (["model.kwargs.widths=[14, 29, 58]"], 1.0, "model"),
    "fidelity": (["methods=[{name: progressive_resize, scales: [0.5], until: [0.5]}]"], 1.0, "data"),
    "distill_narrow": (["model.kwargs.widths=[14, 29, 58]",
                        "methods=[{name: distill, teacher: '{teacher}', count_teacher: false}]"], 1.0, "model"),
    "selective": (["methods=[{name: selective_backprop, keep: 0.5}]"], 1.0, "data"),
    "curriculum": (["methods=[{name: curriculum, reference: '{teacher}', count_reference: false}]"], 1.0, "data"),
    "batch_ramp": (["methods=[{name: batch_ramp, lr_scaling: sqrt, start: 0.25, steps: 300}]"], 1.0, "schedule"),
    "big_lr_short": (["optim.lr=0.004", "schedule.warmup=30"], 0.5, "schedule"),
    "bf16": (["precision=bf16-mixed"], 1.0, "model"),
}
LM = {
    "narrow": (["model.kwargs.d_model=128"], 1.0, "model"),
    "shallow": (["model.kwargs.n_layers=2"], 1.0, "model"),
    "fidelity": (["methods=[{name: progressive_resize, scales: [0.5], until: [0.5]}]"], 1.0, "data"),
    "big_lr_short": (["optim.lr=0.004"], 0.5, "schedule"),
}
RECIPES = {"demo": ("recipes/mnist1d_cnn.yaml", 6000, DEMO, ("big_batch", "small_batch", "narrow")),
           "glyphs": ("recipes/glyphs_cnn2d.yaml", 906, GLYPHS, ("narrow", "fidelity")),
           "lm": ("recipes/lm_green.yaml", 120, LM, ("narrow", "fidelity"))}
FIGS = ("flops", "wall_seconds", "cpu_seconds", "energy", "cost")


def fit(recipe: str, overrides: list[str], seed: int, run_dir: Path) -> dict:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("OMP_NUM_THREADS", None)  # threads=N in the overrides, the same on both sides
    env.setdefault("ECOTRAIN_CACHE", str(Path(tempfile.gettempdir()) / "ecotrain-bench-cache"))
    r = subprocess.run([sys.executable, "-m", "ecotrain", "fit", recipe, f"seed={seed}", *overrides,
                        "--run-dir", str(run_dir), "--overwrite", "--quiet"], cwd=ROOT, env=env, text=True,
                       capture_output=True)
    if r.returncode != 0:
        sys.exit(f"bench/levers.py: {' '.join(overrides)} seed {seed} failed:\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}")
    L = json.loads((run_dir / "ledger.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    quality = summary.get("test_accuracy", summary.get("test_bits_per_byte"))
    return {"acc": quality, **{k: figure(L, k) for k in FIGS}}


def steps(fraction: float, scale: float, quick: bool, base: int) -> int:
    return 40 if quick else max(10, round(base * fraction * scale))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default="demo", choices=list(RECIPES), help="the baseline: the demo, or a "
                    "compute-bound proof recipe (glyphs: 2-D CNN; lm: a GPT-2)")
    ap.add_argument("--seeds", default="0", help="design seeds (direction only, not a claim)")
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of every step count")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--levers", default=None, help="comma list (default: all)")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench-levers"))
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    recipe, base_total, table, quick_levers = RECIPES[args.recipe]
    names = args.levers.split(",") if args.levers else list(quick_levers if args.quick else table)
    unknown = [n for n in names if n not in table]
    if unknown:
        sys.exit(f"bench/levers.py: unknown lever {unknown[0]!r} for --recipe {args.recipe}; one of {', '.join(table)}")
    seeds = parse_seeds(args.seeds)
    common = [f"threads={args.threads}"]
    if args.quick:
        common += ["data.num_samples=1000", "loop.eval_every=20", "schedule.warmup=5"]
    out = Path(args.out).resolve() / args.recipe / ("quick" if args.quick else "full")
    base_steps = steps(1.0, args.scale, args.quick, base_total)
    base_o = [*common, f"loop.max_steps={base_steps}", "loop.max_epochs=null",
              f"loop.eval_every={max(1, base_steps // 12)}"]
    rows, bases = {}, {}
    for name in names:
        extra, frac, _ = table[name]
        n = steps(frac, args.scale, args.quick, base_total)
        ratios, accs = {k: [] for k in FIGS}, []
        for i, seed in enumerate(seeds):
            teacher = out / f"base-s{seed}"  # one baseline run per seed, the teacher of distillation too
            lever_o = [*common, *(o.replace("{teacher}", str(teacher)) for o in extra), f"loop.max_steps={n}",
                       "loop.max_epochs=null", f"loop.eval_every={max(1, n // 12)}"]
            # interleaved: the baseline beside each lever (A B, then B A on the next seed) under the same load;
            # a lever that reads the baseline run (its teacher) always after it
            first_base = i % 2 == 0 or "{teacher}" in " ".join(extra)
            pair = [("base", base_o), ("lever", lever_o)][:: 1 if first_base else -1]
            got = {side: fit(recipe, o, seed, teacher if side == "base" else out / f"{name}-s{seed}")
                   for side, o in pair}
            bases.setdefault(seed, got["base"])
            for k in FIGS:
                ratios[k].append(got["lever"][k] / got["base"][k])
            accs.append(got["lever"]["acc"] - got["base"]["acc"])
        rows[name] = {k: statistics.median(v) for k, v in ratios.items()} | {"dacc": statistics.fmean(accs)}
        r = rows[name]
        print(f"  {name:15s} FLOPs {r['flops']:.3f}x  wall {r['wall_seconds']:.3f}x  CPU {r['cpu_seconds']:.3f}x  "
              f"energy {r['energy']:.3f}x  money {r['cost']:.3f}x  test {r['dacc']:+.4f} (lever - baseline)", flush=True)
    # labels: a lever that makes the run dearer says so; one whose FLOPs fall well below its energy saves FLOPs, not time
    costs_more = [n for n, r in rows.items() if r["energy"] > 1.05]
    flops_only = [n for n, r in rows.items() if r["flops"] < r["energy"] - 0.15 and n not in costs_more]
    label = lambda n: "costs more" if n in costs_more else "flops-only" if n in flops_only else ""  # noqa: E731
    what = "test accuracy" if args.recipe != "lm" else "test bits per byte"
    print(f"\n| lever | kind | overrides | FLOPs | wall | CPU s | energy | money | {what} (lever - baseline) | |\n"
          "|---|---|---|---|---|---|---|---|---|---|")
    for n, r in rows.items():
        print(f"| {n} | {table[n][2]} | `{' '.join(table[n][0])}` | {r['flops']:.2f}x | {r['wall_seconds']:.2f}x | "
              f"{r['cpu_seconds']:.2f}x | {r['energy']:.2f}x | {r['cost']:.2f}x | {r['dacc']:+.4f} | {label(n)} |")
    cells = " ".join(f"{n}_energy={r['energy']:.3f} {n}_wall={r['wall_seconds']:.3f} {n}_flops={r['flops']:.3f}"
                     for n, r in rows.items())
    real = {n: r for n, r in rows.items() if table[n][2] != "schedule"}  # model and data levers only
    best = max(real, key=lambda n: 1 - real[n]["wall_seconds"]) if real else None
    print(f"RESULT recipe={args.recipe} levers={len(rows)} seeds={args.seeds} scale={args.scale:g} threads={args.threads} "
          f"{cells} time_cut_best={1 - real[best]['wall_seconds'] if best else float('nan'):.3f} "
          f"time_cut_best_lever={best or 'none'} flops_only={','.join(flops_only) or 'none'} "
          f"costs_more={','.join(costs_more) or 'none'} quick={int(args.quick)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
