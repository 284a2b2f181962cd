"""Memory levers measured side by side: the char transformer at T=2048, one process per config.

Configs: full (fp32, no checkpointing), activation checkpointing on every block, checkpointing +
bf16 autocast. Each runs `ecotrain.fit` on the stdlib text (packed, seq_len 2048) in its own
subprocess: 1 warm-up step, then `--steps` timed steps; the worker reports the process's peak
RSS (`ru_maxrss`; on a GPU, CUDA max allocated, untested here) at the end of training (the final
evaluation is not measured) and its fastest step (the least disturbed by neighbours on a shared
machine), in wall seconds and in CPU seconds of all its threads (which neighbours disturb less).
Rounds alternate the configs; ratios are against the full run of the same round and allocator,
median over rounds.

The three configs run with `memory.release_freed` (freed tensors >= 1 MiB go back to the OS;
core/levers.py) on every side, and (`--default-rounds`) with glibc's default allocator. glibc
by default keeps freed blocks under 32 MiB in its heap, and checkpointing's interleaved
recompute/backward leaves ~0.5 GB of such retained heap at T=2048, which RSS counts. The RESULT
line is the release_freed comparison (the same allocator on every side); the line before it gives
the default allocator's figures. Then the padding of bucketed vs random batches over one epoch of
the variable-length stdlib paragraphs.

    python bench/memory.py [--layers 6] [--d-model 256] [--batch 8] [--steps 3] [--rounds 2] [--default-rounds 1]
Ends with `RESULT peak_ratio=<f> time_ratio=<f> peak_ratio_bf16=<f> time_ratio_bf16=<f> padding_cut=<f>`.
`--quick` (a check that the bench runs, not a figure): 1 layer, d_model 32, batch 1, 1 timed step, one
round, no default-allocator round.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

CONFIGS = {"full": ("off", "fp32"), "ckpt": ("all", "fp32"), "ckpt_bf16": ("all", "bf16-mixed")}


def worker(args) -> None:
    import torch

    from ecotrain import Callback, Config, fit

    torch.set_num_threads(args.threads)
    ac, precision = CONFIGS[args.worker]

    class Meter(Callback):
        def __init__(self):
            self.times, self.cpu, self.t0, self.c0 = [], [], 0.0, 0.0

        def on_step_start(self, state):
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, state):
            self.times.append(time.perf_counter() - self.t0)
            self.cpu.append(time.process_time() - self.c0)  # all threads' CPU seconds: robust to neighbours

        def on_fit_end(self, state):
            peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
            if state.device.type == "cuda":  # on a GPU: what the tensors held at most
                peak_mb = torch.cuda.max_memory_allocated() / 2**20
            print(json.dumps({"peak_mb": peak_mb, "step_s": min(self.times[1:]), "cpu_s": min(self.cpu[1:]),
                              "loss": float(state.loss)}), flush=True)
            os._exit(0)  # training is what is measured; skip the final evaluation

    steps = args.steps + 1
    cfg = Config.model_validate({
        "seed": 0, "precision": precision,
        "data": {"name": "text", "kwargs": {"seq_len": 2048, "max_bytes": 2048 * args.batch * steps + 1},
                 "batch_size": args.batch, "val_split": 0, "test_split": 0},
        "model": {"name": "charlm", "kwargs": {"d_model": args.d_model, "n_layers": args.layers, "n_heads": 4}},
        "memory": {"activation_checkpointing": ac, "release_freed": args.release},
        "loop": {"max_steps": steps, "max_epochs": None, "log_every": 1000},
        "checkpoint": {"at_end": False}, "logging": {"progress": "off"},
        # off: its FLOP-counting step runs under FlopCounterMode, which defeats checkpointing on that step
        "ledger": {"enabled": False},
    })
    with tempfile.TemporaryDirectory() as d:
        fit(cfg, callbacks=[Meter()], run_dir=d, quiet=True)


def run_config(name: str, args, release: bool) -> dict:
    cmd = [sys.executable, __file__, *(["--release"] if release else []), "--worker", name, "--layers", str(args.layers), "--d-model", str(args.d_model),
           "--batch", str(args.batch), "--steps", str(args.steps), "--threads", str(args.threads)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if r.returncode != 0:
        sys.exit(f"{name} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def padding(batch: int) -> tuple[float, float, float]:
    """Padding tokens of one epoch of stdlib paragraphs (cut at 512 bytes): random vs bucketed batches."""
    from ecotrain.data.bucketing import BucketSampler, padding_ratio
    from ecotrain.data.sampler import EpochSampler
    from ecotrain.data.text import paragraph_rows, read_corpus

    _, lengths = paragraph_rows(read_corpus(4_000_000), 512, 16)

    def pad_tokens(sampler) -> tuple[int, float]:
        batches = list(sampler.batches(0))
        ratio = padding_ratio(batches, lengths)
        real = int(lengths.sum())
        return ratio * real / (1 - ratio), ratio  # pad = ratio * all, all = real + pad

    pad_rand, r_rand = pad_tokens(EpochSampler(len(lengths), batch, 0))
    pad_buck, r_buck = pad_tokens(BucketSampler(lengths, batch, 0))
    print(f"padding over one epoch of {len(lengths)} stdlib paragraphs (16-512 bytes, batch {batch}): random batches "
          f"{r_rand:.1%} of tokens are padding, bucketed {r_buck:.1%}; padding tokens cut {pad_rand / pad_buck:.1f}x")
    return pad_rand / pad_buck, r_rand, r_buck


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", choices=sorted(CONFIGS))
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per process, after one warm-up step")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--default-rounds", type=int, default=1, help="rounds with glibc's default allocator (shown, not in RESULT)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--release", action="store_true", help="(worker) memory.release_freed=true")
    ap.add_argument("--quick", action="store_true", help="a tiny model, one round: checks the bench runs")
    args = ap.parse_args()
    if args.quick:
        args.layers, args.d_model, args.batch, args.steps, args.rounds, args.default_rounds = 1, 32, 1, 1, 1, 0
    if args.worker:
        return worker(args)
    print(f"char transformer: {args.layers} layers, d_model {args.d_model}, T=2048, batch {args.batch}, "
          f"{args.threads} threads; {args.rounds} rounds with memory.release_freed, {args.default_rounds} with the "
          f"default allocator, x (1 warm-up + {args.steps} timed steps) per config", file=sys.stderr)
    keys = ("peak", "time", "peak_bf16", "time_bf16", "cpu", "cpu_bf16")
    ratios = {alloc: {k: [] for k in keys} for alloc in ("default", "release")}
    for r in range(args.rounds):
        for alloc, rat in ratios.items():
            if alloc == "default" and r >= args.default_rounds:
                continue
            res = {name: run_config(name, args, alloc == "release") for name in CONFIGS}
            full, ck, bf = res["full"], res["ckpt"], res["ckpt_bf16"]
            rat["peak"].append(ck["peak_mb"] / full["peak_mb"])
            rat["time"].append(ck["step_s"] / full["step_s"])
            rat["peak_bf16"].append(bf["peak_mb"] / full["peak_mb"])
            rat["time_bf16"].append(bf["step_s"] / full["step_s"])
            rat["cpu"].append(ck["cpu_s"] / full["cpu_s"])
            rat["cpu_bf16"].append(bf["cpu_s"] / full["cpu_s"])
            print(f"round {r}, {alloc} allocator: " + "; ".join(
                f"{n} {v['peak_mb']:.0f} MB peak RSS, {v['step_s']:.2f} s/step ({v['cpu_s']:.2f} CPU-s)" for n, v in res.items()),
                file=sys.stderr)
    med = {alloc: {k: statistics.median(v) for k, v in rat.items()} for alloc, rat in ratios.items() if rat["peak"]}
    for alloc, label in (("default", "glibc's default allocator"), ("release", "memory.release_freed on every side")):
        if alloc not in med:  # --default-rounds 0
            continue
        m = med[alloc]
        print(f"{label}: activation checkpointing (every block) peak RSS {m['peak']:.2f}x, step time {m['time']:.2f}x "
              f"the full run; with bf16 autocast {m['peak_bf16']:.2f}x, {m['time_bf16']:.2f}x "
              f"(median of {len(ratios[alloc]['peak'])} rounds); CPU-seconds per step {m['cpu']:.2f}x, {m['cpu_bf16']:.2f}x")
    med = med["release"]
    cut, _, _ = padding(16)
    print(f"RESULT peak_ratio={med['peak']:.3f} time_ratio={med['time']:.3f} peak_ratio_bf16={med['peak_bf16']:.3f} "
          f"time_ratio_bf16={med['time_bf16']:.3f} padding_cut={cut:.2f}")


if __name__ == "__main__":
    main()
