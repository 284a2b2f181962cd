"""Sharded streams (docs/data.md, `data.name: shards:PATTERN`) on 200 small WebDataset-style tar
shards (tests/helpers/tars.py: 16 samples each, 32 float32 features, the first one the sample's id).

1. `resume_identical`: the CLI with 2 loader workers, SIGKILLed at `--kills` random steps (each run
   killed once, the steps drawn from `--seed`), resumed; final model.safetensors byte-identical to an
   uninterrupted run, every time.
2. `first_batch_ratio_90_over_10`: in one process, the time from nothing (the config) to the first
   batch of a resume at 90% of an epoch over the same at 10%: load the shards' index, build the
   sampler, start 2 workers, read batch k. Medians over `--rounds` alternating rounds. Beside it,
   `reread_ratio_90_over_10`: a loader that skips to the position by reading (what a stream
   without a seekable position must do), for scale.
3. `exactly_once`: real torchrun, 2 ranks x 2 workers, a model that writes down the ids it trains on
   (tests/helpers/id_model.py): one epoch, then a run resized 2 -> 1 -> 2 ranks within one epoch;
   every id exactly once in both.
4. `throughput_vs_raw`: samples/s of ecotrain's feed (data.workers 0, its seeded shard order and
   window shuffle) over a hand-written loop over the same shards (tarfile in file order, the same
   np.load and np.stack per batch of 64); the median of per-round ratios.
5. `bad_shard_one_line`: a truncated shard: exit 2, one line naming the file and the byte.

    python bench/streams.py [--rounds 5] [--kills 3] [--seed N] [--out runs/bench-streams] [--quick]

`--quick` (a check that the bench runs, not a figure): one round, one kill (seed 0), no torchrun part
(`exactly_once=skipped`; tests/distributed covers it), in a temporary folder.

Ends with `RESULT resume_identical=... first_batch_ratio_90_over_10=... exactly_once=...
throughput_vs_raw=... bad_shard_one_line=...`.
"""

from __future__ import annotations

import argparse
import atexit
import io
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ecotrain.config import Config  # noqa: E402
from ecotrain.data.builtin import load_data  # noqa: E402
from ecotrain.data.bucketing import build_sampler  # noqa: E402
from ecotrain.data.loader import Feed  # noqa: E402
from ecotrain.core.state import Counters  # noqa: E402
from tests.helpers.id_model import seen  # noqa: E402
from tests.helpers.tars import make_tar_shards  # noqa: E402

SHARDS, PER_SHARD, DIM, BATCH = 200, 16, 32, 64
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}


def recipe(out: Path, folder: Path, name: str, **over) -> Path:
    tree = {"name": name, "seed": 5,
            "data": {"name": f"shards:{folder}", "batch_size": BATCH, "workers": 2, "shuffle_window": 256,
                     "val_split": 0.1, "test_split": 0.1},
            "model": {"name": "mlp", "kwargs": {"hidden": [32]}, "dropout": 0.1},
            "loop": {"max_steps": 120, "max_epochs": None, "log_every": 20, "eval_every": 40},
            "checkpoint": {"every_n_steps": 7}, "ledger": {"enabled": False}, "logging": {"progress": "off"}}
    for section, values in over.items():
        tree[section] = {**tree.get(section, {}), **values} if isinstance(values, dict) else values
    p = out / f"{name}.yaml"
    p.write_text(yaml.safe_dump(tree))
    return p


def cli(*args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ecotrain", *map(str, args), "--quiet"], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=timeout)


def resume_identical(out: Path, data: Path, kills: int, rng: random.Random) -> tuple[bool, list[int]]:
    r = cli("fit", recipe(out, data, "ref"), "--run-dir", out / "ref", "--overwrite")
    assert r.returncode == 0, r.stderr
    ref = (out / "ref" / "model.safetensors").read_bytes()
    steps, same = sorted(rng.sample(range(3, 118), kills)), []
    for k, step in enumerate(steps):
        run = out / f"killed-{k}"
        killer = recipe(out, data, f"killer-{k}", callbacks=[{"path": "tests.helpers.killer:KillAt",
                                                              "kwargs": {"step": step}}])
        r = cli("fit", killer, "--run-dir", run, "--overwrite")
        assert r.returncode == -9, (step, r.returncode, r.stderr[-2000:])
        r = cli("fit", recipe(out, data, "ref"), "--run-dir", run, "--resume", "auto", "--allow-config-change")
        assert r.returncode == 0, r.stderr
        same.append((run / "model.safetensors").read_bytes() == ref)
    return all(same), steps


def first_batch_seconds(data: Path, fraction: float, reread: bool) -> float:
    """Config -> index -> sampler -> workers -> the first batch at `fraction` of epoch 1."""
    t0 = time.perf_counter()
    cfg = Config.model_validate({"seed": 5, "data": {"name": f"shards:{data}", "batch_size": BATCH, "workers": 2,
                                                      "shuffle_window": 256}})
    bundle = load_data(cfg)
    sampler = build_sampler(len(bundle.train), None, BATCH, cfg.seed, False, bundle.extra["blocks"], 256)
    start = int(fraction * len(sampler))
    state = SimpleNamespace(config=cfg, device=torch.device("cpu"), counters=Counters(), progress_fields={})
    feed = Feed(state, sampler, bundle.train)
    try:
        if reread:  # what a stream that cannot seek does: read from the epoch's start, drop what was trained
            it = feed.epoch(1, 0)
            for _ in range(start + 1):
                next(it)
        else:
            next(feed.epoch(1, start))
        return time.perf_counter() - t0
    finally:
        feed.close()


def first_batch_ratios(data: Path, rounds: int) -> tuple[float, float]:
    times: dict = {(f, r): [] for f in (0.1, 0.9) for r in (False, True)}
    for i in range(rounds):
        order = [(0.1, False), (0.9, False), (0.1, True), (0.9, True)]
        for key in (order if i % 2 == 0 else order[::-1]):
            times[key].append(first_batch_seconds(data, *key))
    med = {k: statistics.median(v) for k, v in times.items()}
    return med[(0.9, False)] / med[(0.1, False)], med[(0.9, True)] / med[(0.1, True)]


def raw_epoch(shards: list[Path]) -> int:
    """The hand-written loop: each shard in file order, members paired by key, np.load, batches of 64."""
    xs, ys, n = [], [], 0
    for path in shards:
        with tarfile.open(path, "r:") as tar:
            x = None
            for m in tar:
                raw = tar.extractfile(m).read()
                if m.name.endswith(".npy"):
                    x = np.load(io.BytesIO(raw), allow_pickle=False)
                else:
                    xs.append(x)
                    ys.append(int(raw))
                    if len(xs) == BATCH:
                        torch.from_numpy(np.stack(xs)), torch.tensor(ys)
                        n += len(xs)
                        xs, ys = [], []
    if xs:
        torch.from_numpy(np.stack(xs)), torch.tensor(ys)
        n += len(xs)
    return n


def ecotrain_epoch(data: Path) -> tuple[int, float]:
    cfg = Config.model_validate({"seed": 5, "data": {"name": f"shards:{data}", "batch_size": BATCH,
                                                      "shuffle_window": 256, "val_split": 0, "test_split": 0}})
    bundle = load_data(cfg)
    sampler = build_sampler(len(bundle.train), None, BATCH, cfg.seed, False, bundle.extra["blocks"], 256)
    state = SimpleNamespace(config=cfg, device=torch.device("cpu"), counters=Counters(), progress_fields={})
    feed = Feed(state, sampler, bundle.train)
    t = time.perf_counter()
    n = sum(k for k, _ in feed.epoch(0, 0))
    return n, time.perf_counter() - t


def throughput_vs_raw(data: Path, rounds: int) -> float:
    shards = sorted(data.glob("*.tar"))
    ratios = []
    for i in range(rounds):
        for first in ((True, False) if i % 2 == 0 else (False, True)):
            if first:
                n_e, s_e = ecotrain_epoch(data)
            else:
                t = time.perf_counter()
                n_r = raw_epoch(shards)
                s_r = time.perf_counter() - t
        assert n_e == n_r == SHARDS * PER_SHARD, (n_e, n_r)
        ratios.append((n_e / s_e) / (n_r / s_r))
    return statistics.median(ratios)


def torchrun(nproc: int, rec: Path, run: Path, ids: Path, steps: int, resume: bool) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr",
           "127.0.0.1", "--master-port", str(port), "-m", "ecotrain", "fit", str(rec), "--run-dir", str(run),
           "--quiet", f"loop.max_steps={steps}", *(["--resume", "auto", "--allow-config-change"] if resume else [])]
    r = subprocess.run(cmd, cwd=ROOT, env={**ENV, "ECOTRAIN_IDS_DIR": str(ids)}, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]


def exactly_once(out: Path, data: Path) -> tuple[bool, bool]:
    rec = recipe(out, data, "ids", data={"val_split": 0, "test_split": 0, "workers": 2},
                 model={"name": "tests.helpers.id_model:IdRecorder", "kwargs": {"dim": DIM, "classes": 4},
                        "dropout": 0.0},
                 distributed={"strategy": "ddp"}, checkpoint={"every_n_steps": 10})
    epoch = SHARDS * PER_SHARD // BATCH  # 50 full global batches
    every = set(range(SHARDS * PER_SHARD))
    result = []
    for name, segments in (("one-epoch", [(2, epoch)]), ("resized", [(2, 15), (1, 35), (2, epoch)])):
        run, ids = out / name, out / f"{name}-ids"
        shutil.rmtree(run, ignore_errors=True)
        shutil.rmtree(ids, ignore_errors=True)
        ids.mkdir(parents=True)
        for k, (nproc, steps) in enumerate(segments):
            torchrun(nproc, rec, run, ids, steps, resume=k > 0)
        got = seen(ids)
        result.append(len(got) == len(every) and set(got) == every)
        print(f"exactly_once {name}: {len(got)} ids trained, {len(set(got))} distinct of {len(every)}", flush=True)
    return result[0], result[1]


def bad_shard_one_line(out: Path, data: Path) -> bool:
    bad = out / "bad-data"
    shutil.rmtree(bad, ignore_errors=True)
    shutil.copytree(data, bad)
    victim = sorted(bad.glob("*.tar"))[57]
    victim.write_bytes(victim.read_bytes()[:5000])
    r = cli("fit", recipe(out, bad, "bad"), "--run-dir", out / "bad-run", "--overwrite")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    print(f"bad shard: exit {r.returncode}: {lines}", flush=True)
    return r.returncode == 2 and len(lines) == 1 and str(victim) in lines[0] and "byte" in lines[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--seed", type=int, default=None, help="kill steps' seed (default: drawn, and printed)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-streams")
    ap.add_argument("--quick", action="store_true", help="one round, one kill, no torchrun: checks the bench runs")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.kills, args.seed = 1, 1, 0 if args.seed is None else args.seed
        args.out = Path(tempfile.mkdtemp(prefix="bench-streams-"))
        atexit.register(shutil.rmtree, args.out, ignore_errors=True)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    out = args.out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    data = out / "data"
    make_tar_shards(data, shards=SHARDS, per_shard=PER_SHARD, dim=DIM)

    same, steps = resume_identical(out, data, args.kills, random.Random(seed))
    print(f"resume: kill seed {seed}, steps {steps}, identical {same}", flush=True)
    seek, reread = first_batch_ratios(data, args.rounds)
    print(f"first batch 90%/10%: seek {seek:.3f}, re-read {reread:.3f}", flush=True)
    once = "skipped" if args.quick else str(all(exactly_once(out, data))).lower()
    thr = throughput_vs_raw(data, args.rounds)
    print(f"throughput vs raw: {thr:.3f}", flush=True)
    one_line = bad_shard_one_line(out, data)
    print(f"RESULT resume_identical={str(same).lower()} first_batch_ratio_90_over_10={seek:.3f} "
          f"reread_ratio_90_over_10={reread:.3f} exactly_once={once} "
          f"throughput_vs_raw={thr:.3f} bad_shard_one_line={str(one_line).lower()} kill_seed={seed}")


if __name__ == "__main__":
    main()
