"""The headline answers, decided: each comparison adds fresh seeds until its verdict is PASS or FAIL
(docs/evaluation.md: the sequential interval, valid at every look), and the mutation table's lowest
module score.

1. `green_verdict`: recipes/mnist1d_green.yaml against the demo recipe recipes/mnist1d_cnn.yaml,
   through the real CLI: `ecotrain fit GREEN --seeds 30-32 --baseline DEMO --until-decided --by flops`
   (test accuracy within 1 point, FLOPs cut by at least half). Fresh seeds from 30: the recipe was
   chosen on seeds 0-2 and confirmed before on 10-14.
2. `search_verdict`: `ecotrain green recipes/mnist1d_cnn.yaml --tolerance 0.01 --seeds-confirm 40-42
   --until-decided`: the search on design seed 0 (checks 1-2), its choice confirmed from seed 40 on.
3. `continual_verdict`: the continual strategy chosen on validation (replay + LwF on the replay
   rows, docs/continual.md) against joint training on Split MNIST-1D, per seed the shortfall
   1 - (its final average accuracy / joint's); the claim "at least 0.85x joint" is PASS when the
   sequential interval of the shortfall lies within 0.15. Fresh seeds from 50 (chosen on seed 0,
   reported before on 10-12).
4. `bn_verdict`: BatchNorm drift in the `short` setting (docs/finetuning.md): the policy chosen on
   validation (recompute) against naive fine-tuning, new-domain test accuracy; the claim "at least 3
   points over naive" is PASS when the gain's sequential interval lies wholly above 0.03
   (`bench/bn_drift.py --decide 60-62`). Fresh seeds from 60 (chosen on 0-2, reported on 10-14).
5. `mutation_min`: the lowest module score of the last `make mutants` (build/mutants/summary.json;
   `--mutants` runs it first).

    python bench/decisive.py [--only green search continual bn] [--max-seeds 40] [--out runs/bench-decisive]
    python bench/decisive.py --quick   # a check that it runs: continual and bn tiny, 3 seeds, a temporary OUT

`--quick` trains no recipe as shipped: green and search (the CLI's own --until-decided, tested in
tests/integration) read `skipped`; continual runs 1 epoch per task on 1,250 samples and bn
`bench/bn_drift.py --quick`, each over the first 3 seeds (their verdicts say nothing).

The cap is 40 seeds, not the CLI's default 20: the sequential interval spends alpha 0.05/(k(k+1)) at look k, a
sum that stays under 0.05 however many looks follow, so a later cap keeps the error rate (docs/evaluation.md).

A finished seed in OUT is kept (--resume auto), so an interrupted bench continues, and so does an
INCONCLUSIVE answer under a higher --max-seeds (its finished seeds are read at the same looks again). Ends with
`RESULT green_verdict=... search_verdict=... continual_verdict=... bn_verdict=... mutation_min=...` and, per
answer, its seeds, looks, forecast and interval.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def cli(*args) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "ecotrain", *map(str, args)], cwd=ROOT, env=ENV, capture_output=True,
                       text=True)
    if r.returncode not in (0, 1):
        sys.exit(f"bench/decisive.py: {' '.join(map(str, args))} failed:\n{r.stderr[-3000:]}")
    return r


def green(out: Path, max_seeds: int) -> dict:
    r = cli("fit", "recipes/mnist1d_green.yaml", "--seeds", "30-32", "--baseline", "recipes/mnist1d_cnn.yaml",
            "--until-decided", "--max-seeds", max_seeds, "--by", "flops", "--max-accuracy-drop", "0.01",
            "--run-dir", out / "green", "--resume", "auto", "--quiet")
    d = json.loads((out / "green-decision.json").read_text())
    return {**d, "line": next((ln for ln in r.stdout.splitlines() if ln.startswith("test_accuracy:")), "")}


QUICK = False  # --quick: continual and bn tiny (see the docstring)
SEARCH_OVERRIDES: list[str] = []  # --search-override: e.g. a default that changed since OUT's runs finished


def search(out: Path, max_seeds: int) -> dict:
    r = cli("green", "recipes/mnist1d_cnn.yaml", *SEARCH_OVERRIDES, "--tolerance", "0.01", "--seeds-confirm", "40-42",
            "--until-decided", "--max-seeds", max_seeds, "--out", out / "search")
    g = json.loads((out / "search" / "green.json").read_text())
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("test_accuracy:")), "")
    return {"verdict": g["verdict"], **(g.get("decision") or {}), "drop": g["drop"], "line": line,
            "overrides": g["overrides"], "flops_ratio": g["cost_ratio"]}


def continual(out: Path, max_seeds: int) -> dict:
    import continual as bench_continual  # bench/continual.py: the strategies and the scores

    from ecotrain.continual.scenario import write_tasks
    from ecotrain.seeds.decide import until_decided_values

    work = Path(tempfile.mkdtemp(prefix="decisive-continual-"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)  # the tasks' data and runs; the answers are in OUT
    data = work / "data"
    write_tasks(data, num_samples=1250 if QUICK else 6250, tasks=bench_continual.TASKS, seed=0)
    epochs = 1 if QUICK else 20
    cache = out / "continual-seeds.json"  # per seed, once: an interrupted bench keeps what it had
    done = json.loads(cache.read_text()) if cache.exists() else {}

    def shortfall(seed: int) -> float:
        if str(seed) not in done:
            best = bench_continual.run_strategy(("replay+lwf-old", str(data), str(work), epochs, seed, "test"))
            joint = bench_continual.run_joint((data, work, epochs, seed))
            b, j = bench_continual.scores(best["acc"])[0], bench_continual.scores(joint["acc"])[0]
            done[str(seed)] = {"best": b, "joint": j}
            cache.write_text(json.dumps(done, indent=1))
        r = done[str(seed)]
        print(f"continual seed {seed}: best {r['best']:.4f} joint {r['joint']:.4f} x joint "
              f"{r['best'] / r['joint']:.3f}", flush=True)
        return 1 - r["best"] / r["joint"]

    return until_decided_values(shortfall, [50, 51, 52], max_seeds, 0.15)


def bn(out: Path, max_seeds: int) -> dict:
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "bn_drift.py"), "--decide", "60-62", "--max-seeds",
                        str(max_seeds), "--work", str(out / "bn"), *(["--quick"] if QUICK else [])],
                       cwd=ROOT, env=ENV, capture_output=True, text=True)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        sys.exit(f"bench/decisive.py: bench/bn_drift.py --decide failed:\n{r.stderr[-3000:]}")
    got = dict(kv.split("=", 1) for kv in line.split()[1:])
    return {"verdict": got["bn_verdict"], "seeds": [int(x) for x in got["bn_seeds"].split(",")],
            "looks": int(got["bn_looks"]), "forecast": got["bn_forecast"],
            "line": f"gain {got['bn_gain_mean']} [{got['bn_gain_low']}, {got['bn_gain_high']}]"}


def mutation_min(run: bool) -> str:
    if run:
        subprocess.run(["make", "mutants"], cwd=ROOT, check=False)
    path = ROOT / "build" / "mutants" / "summary.json"
    if not path.exists():
        return "not_measured"
    return f"{json.loads(path.read_text())['min']:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", choices=["green", "search", "continual", "bn"], default=None)
    ap.add_argument("--max-seeds", type=int, default=40)
    ap.add_argument("--mutants", action="store_true", help="run `make mutants` first (long)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-decisive")
    ap.add_argument("--search-override", action="append", default=[], metavar="KEY=VALUE",
                    help="an override of the search's runs: to go on with OUT's finished runs after a default "
                         "changed (`ecotrain` refuses to read a finished run as another config)")
    ap.add_argument("--quick", action="store_true", help="continual and bn tiny, 3 seeds: checks the bench runs")
    args = ap.parse_args()
    SEARCH_OVERRIDES.extend(args.search_override)
    if args.quick:
        global QUICK
        QUICK, args.max_seeds, args.out = True, 3, Path(tempfile.mkdtemp(prefix="bench-decisive-"))
        atexit.register(shutil.rmtree, args.out, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    only = args.only or ["green", "search", "continual", "bn"]
    if args.quick:
        only = [n for n in only if n in ("continual", "bn")]
    found, t0 = {}, time.perf_counter()
    for name, fn in (("green", green), ("search", search), ("continual", continual), ("bn", bn)):
        if name in only:
            found[name] = fn(args.out, args.max_seeds)
            f = found[name]
            print(f"{name}: {f['verdict']} on seeds {f.get('seeds')} ({f.get('looks')} looks; forecast "
                  f"{f.get('forecast')}) {f.get('line', '')}", flush=True)
    path = args.out / "decisive.json"  # the answers of earlier calls on OUT are kept beside this call's
    earlier = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**earlier, **found}, indent=1))
    print(f"wall: {time.perf_counter() - t0:.0f} s")
    said = " ".join(f"{n}_verdict={found[n]['verdict'] if n in found else 'skipped'}"
                    for n in ("green", "search", "continual", "bn") if n in found or args.quick)
    seeds = " ".join(f"{n}_seeds={len(found[n].get('seeds') or [])}" for n in found)
    print(f"RESULT {said} mutation_min={mutation_min(args.mutants)} {seeds}")


if __name__ == "__main__":
    main()
