"""Carbon-aware timing: the same run started at once, and timed by a 48-hour grid forecast with a deadline.

    python bench/carbon_timing.py [--out runs/bench-carbon] [--steps 6000] [--deadline 24h] [--quick]

`--quick` (a check that the bench runs, not a figure): 60 steps of 360 s each (the same 6 hours), in
a temporary folder.

Both runs are `ecotrain fit recipes/mnist1d_cnn.yaml --carbon-forecast OUT/forecast.json` (an
ElectricityMaps-shaped forecast written by this bench: 48 hourly values of a grid with a midday solar dip
and a slower wind swing, 180-610 g/kWh), on the simulated clock `carbon.clock` (a step takes
`--seconds-per-step`, 3.6 s: the run needs 6 of the 48 hours; waits pass at once): the forecast is
given, and only when the training happens differs. The timed run adds `--deadline 24h`: it pauses at a
checkpoint outside the cleanest hours before the deadline and resumes in them.

Energy is CodeCarbon's (measured or estimated, ledger.json `energy.method`); each ledger's CO2e is the
sum over the intervals the run trained in of kWh x that interval's forecast intensity (`co2e.intervals`).
`co2e_ratio` is timed / at once from the ledgers (measured energy: it moves a little with the machine's
load); `intensity_ratio` is the same by steps (each step is the same work), which no load moves.
`weights_identical`: the two model.safetensors files are byte-identical. `deadline_met`: the timed run's
simulated finish is at or before its deadline.

Ends with `RESULT co2e_ratio=... intensity_ratio=... weights_identical=true|false deadline_met=true|false
pauses=N g_per_kwh_now=... g_per_kwh_timed=... hours_needed=... deadline_hours=...`.
"""

from __future__ import annotations

import argparse
import atexit
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "recipes/mnist1d_cnn.yaml"
T0 = datetime(2026, 12, 3, tzinfo=timezone.utc)


def forecast(path: Path) -> None:
    """48 hourly values: a night-high, midday-low solar day (24 h) on a slower wind swing (31 h)."""
    points = []
    for h in range(48):
        g = 400 + 150 * math.cos(2 * math.pi * (h - 1) / 24) + 60 * math.sin(2 * math.pi * h / 31)
        points.append({"datetime": (T0 + timedelta(hours=h)).isoformat().replace("+00:00", "Z"),
                       "carbonIntensity": round(g)})
    path.write_text(json.dumps({"zone": "BENCH", "forecast": points, "updatedAt": T0.isoformat()}, indent=1))


def fit(run: Path, *extra: str) -> dict:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": os.environ.get("BENCH_THREADS", "1")}
    env.setdefault("ECOTRAIN_CACHE", str(Path(tempfile.gettempdir()) / "ecotrain-bench-cache"))
    cmd = [sys.executable, "-m", "ecotrain", "fit", RECIPE, "--run-dir", str(run), "--overwrite", "--quiet", *extra]
    print("$ ecotrain " + " ".join(cmd[3:]), flush=True)
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"bench/carbon_timing.py: the run failed:\n{r.stderr[-2000:]}")
    for line in r.stderr.splitlines():
        if "carbon:" in line:
            print("  " + line)
    return json.loads((run / "ledger.json").read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench-carbon"))
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--seconds-per-step", type=float, default=3.6)
    ap.add_argument("--deadline", default="24h")
    ap.add_argument("--quick", action="store_true", help="60 steps of 360 s, a temporary folder: checks the bench runs")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.seconds_per_step = 60, args.seconds_per_step * 100
        args.out = tempfile.mkdtemp(prefix="bench-carbon-")
        atexit.register(shutil.rmtree, args.out, ignore_errors=True)
    out = Path(args.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    f = out / "forecast.json"
    forecast(f)
    clock = f'carbon.clock={{start: "{T0.isoformat()}", seconds_per_step: {args.seconds_per_step}}}'
    common = [f"loop.max_steps={args.steps}", "--carbon-forecast", str(f), clock]
    now = fit(out / "now", *common)["co2e"]
    timed = fit(out / "timed", *common, "--deadline", args.deadline)["co2e"]
    same = (out / "now" / "model.safetensors").read_bytes() == (out / "timed" / "model.safetensors").read_bytes()
    for name, c in (("at once", now), ("timed", timed)):
        spans = ", ".join(f"{i['start'][5:16]}..{i['end'][11:16]} {i['g_per_kwh']:.0f}g" for i in c["intervals"])
        print(f"{name}: {c['pauses']} pauses, {c['g_per_kwh_by_steps']:.0f} g/kWh by steps, CO2e {c['kg']} kg; {spans}")
    r = subprocess.run([sys.executable, "-m", "ecotrain", "compare", str(out / "now"), str(out / "timed"), "--by", "co2e",
                        "--max-accuracy-drop", "0", "--min-cost-cut", "0.3"], cwd=ROOT, capture_output=True, text=True)
    print(f"$ ecotrain compare {out / 'now'} {out / 'timed'} --by co2e --max-accuracy-drop 0 --min-cost-cut 0.3\n"
          + r.stdout + r.stderr)
    ratio = timed["kg"] / now["kg"] if timed["kg"] and now["kg"] else float("nan")
    hours = args.steps * args.seconds_per_step / 3600
    print(f"RESULT co2e_ratio={ratio:.3f} intensity_ratio={timed['g_per_kwh_by_steps'] / now['g_per_kwh_by_steps']:.3f} "
          f"weights_identical={'true' if same else 'false'} deadline_met={'true' if timed['deadline_met'] else 'false'} "
          f"pauses={timed['pauses']} g_per_kwh_now={now['g_per_kwh_by_steps']:.0f} "
          f"g_per_kwh_timed={timed['g_per_kwh_by_steps']:.0f} hours_needed={hours:g} deadline={args.deadline}")
    return 0 if same and timed["deadline_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
