"""Faults a cluster inflicts, on the demo recipe (recipes/mnist1d_cnn.yaml, fp32, shortened to
`--steps`), under real torchrun with 2 gloo ranks of one thread each.

1. Elastic restart: `torchrun --nnodes 1:2 --max-restarts 2 --rdzv-backend c10d` with rank 1
   SIGKILLed mid-epoch in the first attempt; torchrun restarts the group, which resumes with
   `--resume auto`. `restart_identical`: the run recorded one resume (summary.json `resumes`: the
   restarted attempt continued from a checkpoint) and its final weights are byte-identical to the
   uninterrupted 2-rank run's; `steps_redone`: summary.json's count (steps trained past the last
   checkpoint before the kill), against the checkpoint interval.
2. Resize: the same run stopped by SIGTERM on 2 ranks, continued on 1, stopped again, finished on 2
   (`loop.micro_batch_size` keeps each rank's micro-batch: 2 micro-batches per step on 2 ranks, 4 on
   1). `resize_max_abs_diff`: the largest weight difference from the uninterrupted 2-rank run of the
   same recipe (the same micro-batches: another micro-batch size rounds differently, and this
   recipe's ReLUs turn that into another run); `resize_test_identical`: the same test accuracy.
3. Preemption under FSDP with background checkpoints (DCP async_save): SIGTERM on both ranks,
   `notice_to_checkpoint_s` is what the run itself reports (notice -> complete checkpoint on disk).
   `async_blocked_s`: per periodic save, the seconds the step loop was blocked (summary.json's
   checkpoint_blocked_seconds over the saves), beside `sync_blocked_s` for the same run with
   synchronous saves; medians would need more runs than this bench makes, so both are single runs
   on a shared machine (read them as sizes, not as a ratio to the third digit).

    python bench/elastic.py [--steps 200] [--out runs/bench-elastic] [--quick]

`--quick` (a check that the bench still runs, not a figure): 120 steps, a resize 2 -> 1 (the one
rank finishes the run), no FSDP part (its three figures read `skipped`).

Ends with `RESULT restart_identical=... steps_redone=... checkpoint_every=... resize_max_abs_diff=...
resize_test_identical=... notice_to_checkpoint_s=... async_blocked_s=... sync_blocked_s=...`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "mnist1d_cnn.yaml"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
CHECKPOINT_EVERY = 25


def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(run_dir: Path, overrides: list[str], nproc: int = 2, launcher: list[str] = (), env: dict = None,
             resume: bool = False) -> subprocess.CompletedProcess:
    launch = list(launcher) or ["--master-addr", "127.0.0.1", "--master-port", str(port())]
    cmd = [*TORCHRUN, *launch, "--nproc-per-node", str(nproc), "-m", "ecotrain", "fit", str(RECIPE), *overrides,
           "--run-dir", str(run_dir), "--quiet", *(["--resume", "auto"] if resume else [])]
    e = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True, timeout=900)


def ok(r: subprocess.CompletedProcess, what: str) -> None:
    if r.returncode != 0:
        sys.exit(f"bench/elastic.py: {what} failed (exit {r.returncode}):\n{r.stderr[-3000:]}")


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def max_abs_diff(a: Path, b: Path) -> float:
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    return max((wa[k] - wb[k]).abs().max().item() for k in wa)


def newest_step(run: Path) -> int:
    return max(int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("step-*"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-elastic")
    ap.add_argument("--quick", action="store_true", help="120 steps, 2 -> 1 ranks, no FSDP: checks the bench runs")
    args = ap.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    steps = 120 if args.quick else args.steps
    # one recipe for every part: the resize compares with the same micro-batches (see the docstring)
    base = [f"loop.max_steps={steps}", "loop.max_epochs=null", "loop.log_every=1", "loop.eval_every=1000",
            "distributed.strategy=ddp", f"checkpoint.every_n_steps={CHECKPOINT_EVERY}", "loop.micro_batch_size=25"]

    # 1. elastic restart after a SIGKILLed worker
    ref = args.out / "ref"
    ok(torchrun(ref, base), "the uninterrupted 2-rank run")
    kill_at = int(steps * 0.35) + CHECKPOINT_EVERY // 2 + 1  # between two checkpoints, mid-epoch
    kill = ('callbacks=[{path: "tests.helpers.killer:KillAt", '
            f'kwargs: {{step: {kill_at}, rank: 1, attempt: 0}}}}]')
    elastic = ["--nnodes", "1:2", "--max-restarts", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
               f"127.0.0.1:{port()}", "--rdzv-conf", "last_call_timeout=1", "--monitor-interval", "0.5"]
    run = args.out / "elastic"
    r = torchrun(run, [*base, kill], launcher=elastic, resume=True)
    ok(r, "the elastic run")
    restarted = summary(run)["resumes"] == 1  # the run's own record: no launcher's log wording
    identical = restarted and (run / "model.safetensors").read_bytes() == (ref / "model.safetensors").read_bytes()
    redone = summary(run)["steps_redone"]
    print(f"elastic: killed at step {kill_at}, restarted={restarted}, identical={identical}, steps redone={redone}")

    # 2. resize 2 -> 1 -> 2 ranks, one global batch
    resized = args.out / "resize"
    rec = [*base, 'callbacks=[{path: "tests.helpers.killer:SigtermAtEnvStep"}]']
    first = int(steps * 0.2)
    r = torchrun(resized, rec, nproc=2, env={"ECOTRAIN_TEST_SIGTERM_AT": str(first)})
    stop1 = newest_step(resized)
    r = torchrun(resized, rec, nproc=1, resume=True,
                 env={"ECOTRAIN_TEST_SIGTERM_AT": "never" if args.quick else str(stop1 + int(steps * 0.3))})
    stop2 = newest_step(resized)
    if not args.quick:
        ok(torchrun(resized, rec, nproc=2, resume=True), "the last segment of the resized run")
    diff = max_abs_diff(resized, ref)
    same_test = summary(resized)["test_accuracy"] == summary(ref)["test_accuracy"]
    last = "" if args.quick else f", 2 ranks to {steps}"
    print(f"resize: 2 ranks to step {stop1}, 1 rank to step {stop2}{last}: max |dw| = {diff:.3g}, "
          f"test accuracy {summary(resized)['test_accuracy']:.4f} vs {summary(ref)['test_accuracy']:.4f}")

    # 3. FSDP: background saves, then a SIGTERM
    fsdp = [*base[:4], "distributed.strategy=fsdp", "checkpoint.every_n_steps=20"]
    blocked, notice = {"true": "skipped", "false": "skipped"}, "skipped"
    for mode in () if args.quick else ("true", "false"):
        d = args.out / f"fsdp-background-{mode}"
        ok(torchrun(d, [*fsdp, f"checkpoint.background={mode}"]), f"FSDP with checkpoint.background={mode}")
        saves = steps // 20 + (steps % 20 != 0)  # the periodic ones and the final one
        blocked[mode] = f'{summary(d)["checkpoint_blocked_seconds"] / saves:.3f}'
    if not args.quick:
        d = args.out / "fsdp-notice"
        r = torchrun(d, [*fsdp, "checkpoint.background=true",
                         'callbacks=[{path: "tests.helpers.killer:SigtermAtEnvStep"}]'],
                     env={"ECOTRAIN_TEST_SIGTERM_AT": str(steps // 2)})
        m = re.search(r"\(([\d.]+) s after the notice\)", r.stdout)
        if r.returncode == 0 or m is None:
            sys.exit(f"bench/elastic.py: the FSDP run did not stop on SIGTERM:\n{r.stdout[-1000:]}{r.stderr[-2000:]}")
        notice = f"{float(m.group(1)):.2f}"
    print(f"fsdp: notice -> checkpoint {notice} s; blocked per save {blocked['true']} s in the background, "
          f"{blocked['false']} s synchronous")

    print(f"RESULT restart_identical={str(identical).lower()} steps_redone={redone} checkpoint_every={CHECKPOINT_EVERY} "
          f"resize_max_abs_diff={diff:.3g} resize_test_identical={str(same_test).lower()} "
          f"notice_to_checkpoint_s={notice} async_blocked_s={blocked['true']} "
          f"sync_blocked_s={blocked['false']}")


if __name__ == "__main__":
    main()
