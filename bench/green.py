"""The green recipe against the baseline, under the evaluation protocol (docs/evaluation.md).

    python bench/green.py [--design-seeds 0-2] [--fresh-seeds 10-14] [--out runs/bench-green] [--fresh] [--quick]

1. Design, on validation data only: the baseline (`recipes/mnist1d_cnn.yaml` as shipped) and each
   candidate (overrides of the baseline: fewer samples seen, smaller batches) on the design seeds.
   The FLOPs goal is the constraint (at most 0.33x the baseline's); among the candidates that meet
   it, the one with the smallest mean validation-accuracy drop is chosen (the cheapest one that
   merely scrapes 1 point on three seeds is the one most likely to miss it on fresh ones). No test
   figure is read in this stage.
2. Confirmation, on seeds no design step has seen: the baseline and the chosen candidate on the
   fresh seeds, each run's test split read once, at its end; then
   `ecotrain compare BASE-group.json GREEN-group.json --by flops` (mean, interval, verdict).

Every run goes through the real CLI (`--seeds`: sibling run folders and a group file). A finished
seed of an earlier, interrupted bench in the same OUT is kept (`--resume auto`); `--fresh` retrains
everything. One intra-op thread on both sides (OMP_NUM_THREADS=1; BENCH_THREADS=N to change it).
FLOPs are counted; CPU-seconds and CO2e are measured or estimated on a shared machine, so they are
shown, not judged. `verdict`: PASS when the fresh-seed mean test-accuracy drop is at most 0.01 and
the mean FLOPs ratio at most 0.33; `interval_verdict`: `ecotrain compare`'s rule, PASS only when the
drop's whole 95% interval is within 0.01 (INCONCLUSIVE when it straddles it).

Ends with `RESULT design_seeds=... fresh_seeds=... selected_on=val selected="..." acc_baseline=<mean>
acc_green=<mean> acc_drop_mean=<f> acc_drop_ci_low=<f> acc_drop_ci_high=<f> flops_ratio=<f> cpu_ratio=<f>
verdict=PASS|FAIL interval_verdict=PASS|FAIL|INCONCLUSIVE`. `--quick` (a check that the bench runs, not
a figure): the first candidate only, every schedule at 1/200 of its steps, design seed 0, fresh seeds
10-11, a temporary folder, exit 0 whatever the verdict.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from ecotrain.base.stats import mean_ci, verdict as verdict_of  # noqa: E402
from ecotrain.seeds.sweep import parse_seeds  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "recipes" / "mnist1d_cnn.yaml"
MAX_DROP, MAX_FLOPS = 0.01, 0.33
# overrides of the baseline recipe: the same model, data and optimizer, fewer samples seen
CANDIDATES = ["data.batch_size=50 loop.max_steps=3400", "data.batch_size=50 loop.max_steps=3900",
              "data.batch_size=32 loop.max_steps=6000"]


def ecotrain(*args: str) -> subprocess.CompletedProcess:
    # one intra-op thread on both sides: this model's step is too small to gain from a second one, and on
    # a shared machine an OpenMP thread spinning while it waits for a core cost 30x the step time here
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": os.environ.get("BENCH_THREADS", "1")}
    env.setdefault("ECOTRAIN_CACHE", str(Path(tempfile.gettempdir()) / "ecotrain-bench-cache"))
    return subprocess.run([sys.executable, "-m", "ecotrain", *args], cwd=ROOT, env=env, text=True,
                          capture_output=True)


QUICK_SCALE = 200  # --quick: every schedule's steps / this
QUICK = False


def quick_steps(overrides: list[str]) -> list[str]:
    """`overrides` with their loop.max_steps cut by QUICK_SCALE (the baseline's 6000 when none)."""
    steps = next((int(o.split("=")[1]) for o in overrides if o.startswith("loop.max_steps=")), 6000)
    return [*(o for o in overrides if not o.startswith("loop.max_steps=")), f"loop.max_steps={steps // QUICK_SCALE}"]


def train_group(recipe: Path, prefix: Path, seeds: str, fresh: bool, extra: list[str] = (), show_test: bool = True) -> Path:
    if QUICK:
        extra = quick_steps(list(extra))
    flag = ["--overwrite"] if fresh else ["--resume", "auto"]
    print("$ ecotrain fit " + " ".join([str(recipe.relative_to(ROOT)), *extra, "--seeds", seeds, "--run-dir",
                                        str(prefix), *flag, "--quiet"]), flush=True)
    r = ecotrain("fit", str(recipe), *extra, "--seeds", seeds, "--run-dir", str(prefix), *flag, "--quiet")
    if r.returncode != 0:
        sys.exit(f"bench/green.py: training failed ({recipe.name}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    shown = ("test_accuracy", "ledger:", "group:") if show_test else ("ledger:", "group:")  # design: no test figure
    for line in r.stdout.splitlines():
        if line.startswith(shown):
            print("  " + line)
    return prefix.with_name(prefix.name + "-group.json")


def rows(group: Path) -> list[dict]:
    """Per run of a group, in seed order: seed, validation and test accuracy, FLOPs, CPU-seconds."""
    out = []
    for run in (group.parent / r for r in json.loads(group.read_text())["runs"]):
        s, L = json.loads((run / "summary.json").read_text()), json.loads((run / "ledger.json").read_text())
        out.append({"val": s["val_accuracy"], "test": s["test_accuracy"], "flops": L["flops"]["total"],
                    "cpu": L["cpu_seconds"]})
    return out


def mean(group_rows: list[dict], key: str) -> float:
    return statistics.fmean(r[key] for r in group_rows)


def design(out: Path, seeds: str, fresh: bool) -> tuple[str, list[str]]:
    """Stage 1: the candidate chosen on validation accuracy over the design seeds."""
    print(f"== design, on validation data, seeds {seeds}")
    base = rows(train_group(BASELINE, out / "design-baseline", seeds, fresh, show_test=False))
    table = []
    for i, cand in enumerate(CANDIDATES):
        got = rows(train_group(BASELINE, out / f"design-c{i}", seeds, fresh, cand.split(), show_test=False))
        drop = mean_ci([b["val"] - c["val"] for b, c in zip(base, got)])
        table.append((mean(got, "flops") / mean(base, "flops"), drop, cand))
        print(f"  {cand}: FLOPs {table[-1][0]:.3f}x, validation drop {drop}")
    ok = [t for t in table if t[0] <= MAX_FLOPS]
    chosen = min(ok or table, key=lambda t: t[1].mean)[2]
    print(f"  chosen on validation: {chosen}" + ("" if ok else " (none within the FLOPs goal: the smallest drop)"))
    return chosen, [c[2] for c in table]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--design-seeds", default="0-2")
    ap.add_argument("--fresh-seeds", default="10-14")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench-green"))
    ap.add_argument("--fresh", action="store_true", help="retrain every seed, even finished ones in --out")
    ap.add_argument("--quick", action="store_true", help="1 candidate, 1/200 of the steps: checks the bench runs")
    args = ap.parse_args()
    if args.quick:
        global QUICK
        QUICK = True
        del CANDIDATES[1:]
        args.design_seeds, args.fresh_seeds, args.out = "0", "10-11", tempfile.mkdtemp(prefix="bench-green-")
        atexit.register(shutil.rmtree, args.out, ignore_errors=True)
    if set(parse_seeds(args.design_seeds)) & set(parse_seeds(args.fresh_seeds)):
        sys.exit("bench/green.py: --fresh-seeds must be disjoint from --design-seeds (docs/evaluation.md)")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    chosen, _ = design(out, args.design_seeds, args.fresh)

    print(f"\n== confirmation, on test data, fresh seeds {args.fresh_seeds}")
    base_g = train_group(BASELINE, out / "baseline", args.fresh_seeds, args.fresh)
    green_g = train_group(BASELINE, out / "green", args.fresh_seeds, args.fresh, chosen.split())
    print(f"\n$ ecotrain compare {base_g} {green_g} --by flops --min-cost-cut {1 - MAX_FLOPS:.2f}")
    r = ecotrain("compare", str(base_g), str(green_g), "--by", "flops", "--min-cost-cut", f"{1 - MAX_FLOPS:.2f}")
    print(r.stdout + r.stderr)
    b, g = rows(base_g), rows(green_g)
    drop = mean_ci([x["test"] - y["test"] for x, y in zip(b, g)])  # paired: the same fresh seeds
    flops_ratio, cpu_ratio = mean(g, "flops") / mean(b, "flops"), mean(g, "cpu") / mean(b, "cpu")
    print("per seed, test accuracy (baseline, green): "
          + ", ".join(f"({x['test']:.3f}, {y['test']:.3f})" for x, y in zip(b, g)))
    print(f"test-accuracy drop on fresh seeds: {drop}; FLOPs {flops_ratio:.3f}x (counted); "
          f"CPU-seconds {cpu_ratio:.3f}x (measured on a shared machine: shown, not judged)")
    verdict = "PASS" if drop.mean <= MAX_DROP + 1e-12 and flops_ratio <= MAX_FLOPS else "FAIL"
    interval = verdict_of(drop, MAX_DROP) if flops_ratio <= MAX_FLOPS else "FAIL"  # compare's rule: the whole interval
    print(f"RESULT design_seeds={args.design_seeds} fresh_seeds={args.fresh_seeds} selected_on=val "
          f"selected=\"{chosen}\" acc_baseline={mean(b, 'test'):.4f} acc_green={mean(g, 'test'):.4f} "
          f"acc_drop_mean={drop.mean:.4f} acc_drop_ci_low={drop.low:.4f} acc_drop_ci_high={drop.high:.4f} "
          f"flops_ratio={flops_ratio:.3f} cpu_ratio={cpu_ratio:.3f} verdict={verdict} interval_verdict={interval}")
    return 0 if verdict == "PASS" or args.quick else 1


if __name__ == "__main__":
    sys.exit(main())
