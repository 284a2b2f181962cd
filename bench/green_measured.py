"""What is paid, measured: the green recipe against the demo recipe in energy, CO2e and money.

    python bench/green_measured.py [--green recipes/mnist1d_green_measured.yaml] [--seeds 2401-2412]
                                   [--threads 1] [--country FR] [--out runs/bench-green-measured] [--quick]
                                   [--look K] [--reuse]

Both recipes train on the same fresh seeds, one process per run, in interleaved pairs: seed by seed,
baseline then green, the order flipped every other seed (A B, B A, A B, ...), so a load that comes
and goes on a shared machine falls on both sides alike and a slow drift does not favour the side that
always ran second. Both sides run with the same thread count (`threads=N`: a thread count is not a
model, data or schedule lever), the same grid (`ledger.country`) and the same price table, so the
ratios are the recipes' own.

Energy is the ledger's (docs/ledger.md): without RAPL it is CodeCarbon's estimate, TDP x this
process's CPU load plus a RAM power x wall time, so it follows the run's time. The verdict is
`ecotrain compare`'s (paired by seed; under contention the cut's interval decides), read for
`--by energy`, `co2e` and `cost`: PASS when all three pass, FAIL when one fails, else INCONCLUSIVE.
Ratios are of the means (compare's); `*_pair_median` is the median of the per-seed ratios.

Energy starts at the first step on both sides: CodeCarbon's own start-up (~1.5 s, a fresh process
pays it) is reported in each ledger (`energy.meter_startup`) and not counted (accounting/energy.py).

`--look K`: the K-th look of a comparison that adds seeds after an INCONCLUSIVE one: the accuracy
verdict uses compare's sequential interval, valid at every look (stats.sequential_interval; look 1:
97.5%, look 2: 99.2%), not the fixed 95% one. `--reuse`: a seed's run already finished in `--out`
(summary.json and ledger.json) is read back, not trained again (the seeds added at a later look).

`--quick`: two seeds of 40 steps on 1000 samples (seconds; checks the plumbing, not the claim).

Ends with `RESULT energy_ratio=... co2e_ratio=... cost_ratio=... flops_ratio=... wall_ratio=...
cpu_ratio=... energy_pair_median=... drop=... drop_ci_low=... drop_ci_high=... verdict=PASS|FAIL|INCONCLUSIVE
seeds=...`.
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
from ecotrain.accounting.compare import judge  # noqa: E402
from ecotrain.accounting.report import figure, lower_is_better  # noqa: E402
from ecotrain.base.stats import diff_ci, sequential_interval  # noqa: E402
from ecotrain.seeds.sweep import parse_seeds  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "recipes/mnist1d_cnn.yaml"
QUICK = ["loop.max_steps=40", "loop.eval_every=20", "data.num_samples=1000", "schedule.warmup=5"]
BY = ("energy", "co2e", "cost")


def fit(recipe: str, seed: int, run_dir: Path, common: list[str], reuse: bool = False) -> Path:
    if reuse and (run_dir / "summary.json").is_file() and (run_dir / "ledger.json").is_file():
        print(f"  {Path(recipe).stem} s{seed}: finished before, read back ({run_dir})", flush=True)
        return run_dir
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("OMP_NUM_THREADS", None)  # threads=N in the overrides decides, the same on both sides
    env.setdefault("ECOTRAIN_CACHE", str(Path(tempfile.gettempdir()) / "ecotrain-bench-cache"))
    cmd = [sys.executable, "-m", "ecotrain", "fit", recipe, f"seed={seed}", *common, "--run-dir", str(run_dir),
           "--overwrite", "--quiet"]
    r = subprocess.run(cmd, cwd=ROOT, env=env, text=True, capture_output=True)
    if r.returncode != 0:
        sys.exit(f"bench/green_measured.py: {recipe} seed {seed} failed:\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}")
    print(f"  {Path(recipe).stem} s{seed}: " + next((ln for ln in r.stdout.splitlines() if ln.startswith("ledger:")),
                                                   "?"), flush=True)
    return run_dir


def ledger(run: Path) -> dict:
    return json.loads((run / "ledger.json").read_text())


def ratio(base: list[Path], green: list[Path], key: str) -> tuple[float, float]:
    """(ratio of the means, median of the per-seed ratios) of a ledger figure."""
    b = [figure(ledger(r), key) for r in base]
    g = [figure(ledger(r), key) for r in green]
    return statistics.fmean(g) / statistics.fmean(b), statistics.median(y / x for x, y in zip(b, g))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--green", default="recipes/mnist1d_green_measured.yaml")
    ap.add_argument("--baseline", default=BASELINE)
    ap.add_argument("--seeds", default=None, help="fresh seeds, never used in design (default 2401-2412)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads on both sides")
    ap.add_argument("--country", default="FR", help="the grid on both sides (ledger.country)")
    ap.add_argument("--max-accuracy-drop", type=float, default=0.01, help="the tolerance on --metric (its name kept)")
    ap.add_argument("--metric", default="test_accuracy", help="the test figure judged (test_bits_per_byte for an LM)")
    ap.add_argument("--min-cut", type=float, default=0.5, help="required cut of energy, CO2e and money")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench-green-measured"))
    ap.add_argument("--quick", action="store_true", help="two seeds of 40 steps: the plumbing, in seconds")
    ap.add_argument("--look", type=int, default=None, help="this comparison's look (1, 2, ...): the accuracy "
                    "interval valid at every look decides")
    ap.add_argument("--reuse", action="store_true", help="read back runs already finished in --out")
    args = ap.parse_args()
    seeds = parse_seeds(args.seeds or ("1220-1221" if args.quick else "2401-2412"))
    common = [f"threads={args.threads}", f"ledger.country={args.country}"] + (QUICK if args.quick else [])
    out = Path(args.out).resolve() / ("quick" if args.quick else "full")
    base, green = [], []
    print(f"== {args.baseline} (A) and {args.green} (B), seeds {seeds}, interleaved pairs; {' '.join(common)}")
    for i, seed in enumerate(seeds):
        order = [("A", args.baseline), ("B", args.green)][:: 1 if i % 2 == 0 else -1]
        for side, recipe in order:
            run = fit(recipe, seed, out / f"{side}-s{seed}", common, args.reuse)
            (base if side == "A" else green).append(run)
    verdicts = {}
    for by in BY:
        report, verdicts[by] = judge([str(r) for r in base], [str(r) for r in green], args.max_accuracy_drop,
                                     args.min_cut, by, args.metric, look=args.look)
        if by == "co2e":
            print("\n" + report + "\n")
    vs = set(verdicts.values())
    verdict = "PASS" if vs == {"PASS"} else "FAIL" if "FAIL" in vs else "INCONCLUSIVE"
    print("verdicts: " + ", ".join(f"--by {k}: {v}" for k, v in verdicts.items()))
    # the drop is baseline - green for a figure better higher, green - baseline for one better lower (bits per byte)
    sign = -1.0 if lower_is_better(args.metric) else 1.0
    acc = lambda r: sign * json.loads((r / "summary.json").read_text())[args.metric]  # noqa: E731
    drop = diff_ci([acc(r) for r in base], [acc(r) for r in green], paired=True)  # the fixed 95% interval
    seq = sequential_interval([acc(b) - acc(g) for b, g in zip(base, green)], args.look) if args.look else None
    startup = [(ledger(r)["energy"].get("meter_startup") or {}).get("wait_seconds") for r in base + green]
    startup = [x for x in startup if isinstance(x, (int, float))]
    figs = {k: ratio(base, green, k) for k in ("energy", "co2e", "cost", "flops", "wall_seconds", "cpu_seconds")}
    text = "-".join(map(str, (seeds[0], seeds[-1]))) if seeds == list(range(seeds[0], seeds[-1] + 1)) else \
        ",".join(map(str, seeds))
    print(f"RESULT energy_ratio={figs['energy'][0]:.3f} co2e_ratio={figs['co2e'][0]:.3f} "
          f"cost_ratio={figs['cost'][0]:.3f} flops_ratio={figs['flops'][0]:.3f} wall_ratio={figs['wall_seconds'][0]:.3f} "
          f"cpu_ratio={figs['cpu_seconds'][0]:.3f} energy_pair_median={figs['energy'][1]:.3f} "
          f"drop={drop.mean:.4f} drop_ci_low={drop.low:.4f} drop_ci_high={drop.high:.4f} "
          + (f"look={args.look} drop_seq_low={seq.low:.4f} drop_seq_high={seq.high:.4f} drop_seq_level={seq.level:.4f} "
             if seq else "")
          + f"meter_startup_s_not_counted={statistics.fmean(startup) if startup else float('nan'):.2f} verdict={verdict} "
          f"seeds={text} threads={args.threads} quick={int(args.quick)}")
    return 0  # a bench reports: the verdict is in the RESULT line (a tiny --quick run is rarely decided)


if __name__ == "__main__":
    sys.exit(main())
