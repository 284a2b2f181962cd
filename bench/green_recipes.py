"""`ecotrain green`'s own pick on each proof recipe, against its baseline on fresh seeds; the levers on a
compute-bound recipe; `threads: auto` against one thread on the demo.

    python bench/green_recipes.py [--only lm,image,demo] [--seeds 7001-7006] [--search]
                                  [--out runs/bench-green-recipes] [--skip-levers] [--skip-threads] [--quick]

Three proof recipes (docs/efficiency.md):
- **lm**: recipes/lm_green.yaml, a GPT-2 (the lm_small family) on the standard library's source, byte
  level; the tolerance is 0.02 validation bits per byte (lower is better; bits per byte rather than
  perplexity because a fixed difference in bits is a fixed ratio of perplexity per byte at any level:
  0.02 bits is 1.4%, so one tolerance reads the same on a good and a poor model);
- **image**: recipes/glyphs_cnn2d.yaml, a 2-D CNN with BatchNorm on generated 16x16 images, 1 accuracy
  point;
- **demo**: recipes/mnist1d_cnn.yaml (start-up and Python dominate its time), 1 accuracy point.
The first two are compute-bound: their step time is their kernels. Each one's green recipe is the one
`ecotrain green` wrote, committed beside it (recipes/*_green_search.yaml, its comment says the command
and the commit); `--search` runs that search again here first, with the same command, and confirms what
it writes instead.

The confirmation is bench/green_measured.py's: both recipes on the same fresh seeds (no design step
used them), one process per run, interleaved pairs (A B, B A, ...), one thread each, the same grid and
price; ratios of the means, `ecotrain compare`'s verdict on energy, CO2e and money (a cut of at least
half, the quality within the tolerance, 95% intervals; PASS when all three pass).

Levers: bench/levers.py on the compute-bound image recipe (one design seed: the lever's direction),
`levers_time_cut_best` the largest wall cut of a model or data lever (not steps, batch or LR).

Threads: the demo trained with `threads: auto` (the probe decides on a fresh cache, its cost reported
apart) and with `threads=1`, paired on the same seeds; `threads_auto_*_ratio` is auto over one thread of
the runs' own ledgers (energy CPU-time based, money the cores held x wall x price), the median pair.

Process start-up is out of every ledger (it starts at the first step) on both sides alike.

`--quick`: two seeds of 40 steps per side, two levers, one threads pair, the LM a tiny GPT-2 searched
but not confirmed: the plumbing in minutes, not the claim.

Ends with `RESULT lm_energy_ratio=... lm_co2e_ratio=... lm_cost_ratio=... lm_verdict=PASS|FAIL|INCONCLUSIVE
image_... demo_... levers_time_cut_best=... threads_auto_energy_ratio=... threads_auto_cost_ratio=...`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from ecotrain.accounting.energy import cpu_time_kwh  # noqa: E402
from ecotrain.accounting.report import figure  # noqa: E402
from ecotrain.seeds.sweep import parse_seeds  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# name -> (baseline, green recipe written by the search, test metric, tolerance, the search's own arguments)
PROOFS = {
    "lm": ("recipes/lm_green.yaml", "recipes/lm_green_search.yaml", "test_bits_per_byte", 0.02,
           ["--metric", "bits_per_byte", "--tolerance", "0.02", "--trials", "16", "--budget-runs", "12"]),
    "image": ("recipes/glyphs_cnn2d.yaml", "recipes/glyphs_green_search.yaml", "test_accuracy", 0.01,
              ["--tolerance", "0.01", "--trials", "20", "--budget-runs", "14"]),
    "demo": ("recipes/mnist1d_cnn.yaml", "recipes/mnist1d_green_search.yaml", "test_accuracy", 0.01,
             ["--levers", "schedule,batch,lr", "--budget-runs", "40", "--trials", "40"]),
}
RESULT = re.compile(r"^RESULT (.*)$", re.M)
# --quick: the plumbing in minutes (CI's bench tier gives a program 10): tiny runs; the LM a tiny GPT-2,
# searched but not confirmed (its recipe's model is what a confirmation would train)
QUICK = ["loop.max_steps=40", "loop.max_epochs=null", "data.num_samples=1000"]
QUICK_MODEL = {"lm": ["model.kwargs.d_model=32", "model.kwargs.n_layers=1", "data.kwargs.max_bytes=200000"]}


def env() -> dict:
    e = {**os.environ, "PYTHONUNBUFFERED": "1"}
    e.pop("OMP_NUM_THREADS", None)
    e.setdefault("ECOTRAIN_CACHE", str(Path(tempfile.gettempdir()) / "ecotrain-bench-cache"))
    return e


def run(cmd: list[str], what: str, ok=(0,)) -> str:
    print(f"$ {' '.join(cmd)}", flush=True)
    r = subprocess.run(cmd, cwd=ROOT, env=env(), text=True, capture_output=True)
    if r.returncode not in ok:
        sys.exit(f"bench/green_recipes.py: {what} failed (exit {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r.stdout


def result_of(text: str) -> dict:
    found = RESULT.findall(text)
    if not found:
        sys.exit("bench/green_recipes.py: a bench printed no RESULT line:\n" + text[-2000:])
    return dict(kv.split("=", 1) for kv in found[-1].split())


def search(name: str, out: Path, quick: bool) -> str:
    """`ecotrain green BASELINE ...` as the green recipe's comment says; the recipe it wrote."""
    base, _, _, _, extra = PROOFS[name]
    folder = out / name / "search"
    cmd = [sys.executable, "-m", "ecotrain", "green", base, *extra, "--seeds-confirm", "0", "--out", str(folder)]
    if quick:
        cmd = [sys.executable, "-m", "ecotrain", "green", base, *QUICK, *QUICK_MODEL.get(name, []), *extra[:4],
               "--trials", "2", "--budget-runs", "8", "--check-seeds", "none", "--seeds-confirm", "0",
               "--out", str(folder)]
    run(cmd, f"ecotrain green {base}", ok=(0, 1))  # 1: no trial kept the tolerance (said in its output)
    wrote = folder / "green.yaml"
    if not wrote.is_file() and quick:  # two 40-step trials rarely keep the tolerance: confirm the committed pick
        print(f"{name}: the quick search chose nothing (said in its output); confirming {PROOFS[name][1]}", flush=True)
        return PROOFS[name][1]
    if not wrote.is_file():
        sys.exit(f"bench/green_recipes.py: the search on {base} wrote no green recipe (see {folder}/green.html)")
    return str(wrote)


def confirm(name: str, green: str, seeds: str, out: Path, quick: bool) -> dict:
    base, _, metric, tol, _ = PROOFS[name]
    cmd = [sys.executable, "bench/green_measured.py", "--baseline", base, "--green", green, "--seeds", seeds,
           "--metric", metric, "--max-accuracy-drop", str(tol), "--out", str(out / name / "confirm"), "--reuse"]
    return result_of(run(cmd + (["--quick"] if quick else []), f"the confirmation of {green}"))


def threads_pair(seeds: list[int], out: Path, quick: bool) -> dict:
    """The demo with threads: auto (a fresh cache: the probe decides) over threads=1, the median pair."""
    cache = out / "threads" / "cache"
    extra = ["loop.max_steps=200", "data.num_samples=1000"] if quick else []
    ratios: dict[str, list[float]] = {"energy": [], "cost": []}
    picked = []
    for i, seed in enumerate(seeds):
        sides = [("auto", "threads=auto"), ("one", "threads=1")][:: 1 if i % 2 == 0 else -1]
        got = {}
        for side, setting in sides:
            folder = out / "threads" / f"{side}-s{seed}"
            cmd = [sys.executable, "-m", "ecotrain", "fit", "recipes/mnist1d_cnn.yaml", setting, f"seed={seed}",
                   *extra, "--run-dir", str(folder), "--overwrite", "--quiet"]
            print(f"$ ECOTRAIN_CACHE={cache} {' '.join(cmd)}", flush=True)
            r = subprocess.run(cmd, cwd=ROOT, env={**env(), "ECOTRAIN_CACHE": str(cache)}, text=True,
                               capture_output=True)
            if r.returncode != 0:
                sys.exit(f"bench/green_recipes.py: the demo with {setting} failed:\n{r.stderr[-2000:]}")
            got[side] = json.loads((folder / "ledger.json").read_text())
        picked.append(int((got["auto"].get("threads") or {}).get("threads") or got["auto"]["device"].get("count") or 1))
        ratios["energy"].append(cpu_time_kwh(got["auto"]) / cpu_time_kwh(got["one"]))
        ratios["cost"].append(figure(got["auto"], "cost") / figure(got["one"], "cost"))
    return {"energy": statistics.median(ratios["energy"]), "cost": statistics.median(ratios["cost"]),
            "picked": picked}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="lm,image,demo", help="which proof recipes (comma list)")
    ap.add_argument("--seeds", default=None, help="fresh seeds for the confirmations (default 7001-7006)")
    ap.add_argument("--search", action="store_true", help="run each recipe's `ecotrain green` again first")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench-green-recipes"))
    ap.add_argument("--skip-levers", action="store_true")
    ap.add_argument("--skip-threads", action="store_true")
    ap.add_argument("--quick", action="store_true", help="two seeds of 40 steps: the plumbing, not the claim")
    args = ap.parse_args()
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in PROOFS]
    if unknown:
        sys.exit(f"bench/green_recipes.py: --only {unknown[0]}: one of {', '.join(PROOFS)}")
    seeds = args.seeds or ("7101-7102" if args.quick else "7001-7006")
    out = Path(args.out).resolve() / ("quick" if args.quick else "full")
    cells = []
    for name in names:
        green = search(name, out, args.quick) if args.search or args.quick else PROOFS[name][1]
        if args.quick and name in QUICK_MODEL:
            cells.append(f"{name}_verdict=searched_only")
            continue
        got = confirm(name, green, seeds, out, args.quick)
        print(f"{name}: {PROOFS[name][0]} -> {green}: energy {got['energy_ratio']}x, CO2e {got['co2e_ratio']}x, money "
              f"{got['cost_ratio']}x, FLOPs {got['flops_ratio']}x, wall {got['wall_ratio']}x; quality drop "
              f"{got['drop']} [{got['drop_ci_low']}, {got['drop_ci_high']}]; {got['verdict']}", flush=True)
        cells.append(f"{name}_energy_ratio={got['energy_ratio']} {name}_co2e_ratio={got['co2e_ratio']} "
                     f"{name}_cost_ratio={got['cost_ratio']} {name}_flops_ratio={got['flops_ratio']} "
                     f"{name}_drop={got['drop']} {name}_drop_ci_high={got['drop_ci_high']} "
                     f"{name}_verdict={got['verdict']}")
    if not args.skip_levers:
        cmd = [sys.executable, "bench/levers.py", "--recipe", "glyphs", "--out", str(out / "levers")]
        lev = result_of(run(cmd + (["--quick"] if args.quick else ["--levers", "narrow,fidelity,distill_narrow"]),
                            "bench/levers.py"))
        cells.append(f"levers_time_cut_best={lev['time_cut_best']} levers_time_cut_best_lever={lev['time_cut_best_lever']}")
    if not args.skip_threads:
        t = threads_pair(parse_seeds("7201" if args.quick else "7201-7203"), out, args.quick)
        cells.append(f"threads_auto_energy_ratio={t['energy']:.3f} threads_auto_cost_ratio={t['cost']:.3f} "
                     f"threads_auto_picked={','.join(map(str, t['picked']))}")
    print(f"RESULT {' '.join(cells)} seeds={seeds} quick={int(args.quick)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
