"""Long sequences in a fixed byte budget: the levers of docs/memory.md against a naive plan.

A GPT-style char model (memory.levers' CharLM) with a large vocabulary, so that at long sequences the
logits are the largest activation. Steps, CPU, float32, glibc's `release_freed` in every worker:
1. budget: the training peak of the naive plan (no lever) at sequence S, measured in a fresh process
   (peak RSS `VmHWM` less the RSS before the first step: the training's own bytes, not the interpreter);
2. the lever plan (every block checkpointed, chunked loss, optimizer-state offload to a file) at
   2S, 4S, 8S ... in fresh processes: `seq_ratio_in_budget` = the longest length whose peak fits / S;
3. at that length, `--steps` steps of the lever plan beside the naive plan (unconstrained: no budget)
   from the same weights and batches, in this process: `loss_max_rel_diff`, the largest relative
   difference of the per-step losses;
4. `time_per_token_ratio`: the lever plan's CPU seconds per token at that length / the naive plan's at S
   (fastest of 4 timed steps of each fresh process, one thread);
5. `chunked_ce_peak_ratio`: the LM head + cross-entropy alone, forward and backward, over that length's
   tokens at a large vocabulary (`--ce-vocab`): the peak of the bytes torch's CPU allocator hands out
   (torch.profiler with profile_memory: every allocation and free in order, summed; not RSS, so
   glibc's retention does not count) chunked / whole;
6. `optimizer_offload_exact`: weights after 10 steps with the optimizer state in a file == without;
7. `zero2_rank_state_ratio`: 2 gloo ranks under torchrun, one step: each rank's bytes of gradients +
   optimizer state (the tensors it holds: FSDP's local shards) with ecotrain's distributed.strategy=zero2
   wrapping (`TorchDist.wrap`) / with its DDP's. Counted, not a process peak: these tensors live from the
   first step to the end (DDP's gradient buckets, a second copy of the gradients, are not counted:
   the ratio is DDP's best case).

    python bench/long_context.py [--seq 128] [--vocab 8192] [--steps 50] [--threads 1] [--quick]
Ends with `RESULT seq_ratio_in_budget=... loss_max_rel_diff=... time_per_token_ratio=...
zero2_rank_state_ratio=... chunked_ce_peak_ratio=... optimizer_offload_exact=true|false`
(`--quick`: tiny sizes, 2S at most, 3 steps; zero2 left out).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ecotrain.core.chunked_loss import apply_chunked_loss, chunked_cross_entropy, is_head_input  # noqa: E402
from ecotrain.core.levers import apply_activation_checkpointing, release_freed_memory  # noqa: E402
from ecotrain.core.optim_offload import OptimizerOffload  # noqa: E402
from ecotrain.models.charlm import CharLM  # noqa: E402


def build(args, seq: int, levers: set, folder: str):
    torch.manual_seed(0)
    model = CharLM(vocab=args.vocab, max_len=seq, d_model=args.d_model, n_layers=args.layers, n_heads=4)
    if "ckpt" in levers:
        apply_activation_checkpointing(model, "all")
    if "chunked" in levers:
        apply_chunked_loss(model, args.chunk)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if "optim_offload" in levers:
        OptimizerOffload(opt, Path(folder), torch.device("cpu"))
    return model, opt


def batches(args, seq: int, n: int):
    g = torch.Generator().manual_seed(1)
    for _ in range(n):
        x = torch.randint(0, args.vocab, (args.batch, seq + 1), generator=g)
        yield x[:, :-1], x[:, 1:]


def step(model, opt, x, y) -> float:
    out = model(x)
    loss = chunked_cross_entropy(out, y) if is_head_input(out) else F.cross_entropy(out.flatten(0, 1), y.reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def _rss(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def worker(args) -> None:
    """One plan in this fresh process: its training peak over the RSS before training, and its fastest step
    after the first (CPU seconds)."""
    release_freed_memory()
    torch.set_num_threads(args.threads)
    levers = set(filter(None, args.levers.split(",")))
    with tempfile.TemporaryDirectory() as folder:
        model, opt = build(args, args.seq_len, levers, folder)
        data = list(batches(args, args.seq_len, 5))
        start = _rss("VmRSS")
        times = []
        for x, y in data:
            t0 = time.process_time()  # CPU seconds: far less disturbed by a shared machine's other jobs than wall time
            step(model, opt, x, y)
            times.append(time.process_time() - t0)
        print(json.dumps({"peak": _rss("VmHWM") - start, "step_s": min(times[1:])}))


def measure(args, seq: int, levers: str) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--seq-len", str(seq), "--levers", levers,
           *(f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
             if k in ("vocab", "d_model", "layers", "batch", "chunk", "threads"))]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def losses(args, seq: int, levers: set, n: int) -> list[float]:
    with tempfile.TemporaryDirectory() as folder:
        model, opt = build(args, seq, levers, folder)
        return [step(model, opt, x, y) for x, y in batches(args, seq, n)]


def offload_exact(args) -> bool:
    with tempfile.TemporaryDirectory() as folder:
        a, oa = build(args, args.seq, set(), folder)
        b, ob = build(args, args.seq, {"optim_offload"}, folder)
        for x, y in batches(args, args.seq, 10):
            step(a, oa, x, y)
            step(b, ob, x, y)
        return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


ZERO2_WORKER = r"""
import json, os, sys, torch, torch.distributed as td
sys.path.insert(0, sys.argv[1])
from ecotrain.config.run import DistributedConfig
from ecotrain.core.distributed import TorchDist
from ecotrain.models.charlm import CharLM
vocab, d, layers = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def local(t):
    return t.to_local() if hasattr(t, "to_local") else t
out = {}
for strategy in ("ddp", "zero2"):
    cfg = DistributedConfig(strategy=strategy)  # zero2: read as fsdp with reshard_after_forward=false
    dist = TorchDist(cfg.strategy, torch.device("cpu"), 120)
    torch.manual_seed(0)
    m = dist.wrap(CharLM(vocab=vocab, max_len=64, d_model=d, n_layers=layers, n_heads=4), cfg)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    x = torch.randint(0, vocab, (2, 65))
    torch.nn.functional.cross_entropy(m(x[:, :-1]).flatten(0, 1), x[:, 1:].reshape(-1)).backward()
    grads = sum(local(p.grad).numel() * local(p.grad).element_size() for p in m.parameters() if p.grad is not None)
    opt.step()
    state = sum(local(v).numel() * local(v).element_size() for st in opt.state.values() for v in st.values()
                if isinstance(v, torch.Tensor) and v.ndim > 0)
    out[strategy] = grads + state
if td.get_rank() == 0:
    print(json.dumps(out))
td.barrier()
"""


def zero2_ratio(args) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(ZERO2_WORKER)
    with socket.socket() as sock:  # a free port: ecotrain's TorchDist joins the agent's store at MASTER_PORT
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(port), f.name, str(ROOT / "src"), str(args.vocab), str(args.d_model), str(args.layers)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=300,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
    finally:
        os.unlink(f.name)
    got = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1])
    print(f"2 ranks, one step: gradients + optimizer state per rank: DDP {got['ddp'] / 2**20:.1f} MiB, "
          f"zero2 {got['zero2'] / 2**20:.1f} MiB")
    return got["zero2"] / got["ddp"]


def ce_peak(tokens: int, vocab: int, d_model: int, chunk: int, chunked: bool) -> int:
    """Peak bytes torch's CPU allocator hands out during the head + cross-entropy's forward and backward
    over `tokens` tokens (torch.profiler's memory events: each allocation and free, in order)."""
    torch.manual_seed(0)
    head = torch.nn.Linear(d_model, vocab)
    h = torch.randn(1, tokens, d_model, requires_grad=True)
    y = torch.randint(0, vocab, (1, tokens))
    if chunked:
        apply_chunked_loss(torch.nn.ModuleDict({"head": head}), chunk)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        out = head(h)
        loss = chunked_cross_entropy(out, y) if is_head_input(out) else F.cross_entropy(out.flatten(0, 1), y.reshape(-1))
        loss.backward()
        del out, loss
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    now = peak = 0
    for e in events:  # nbytes: + for an allocation, - for a free
        now += e.nbytes()
        peak = max(peak, now)
    return peak


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--ce-vocab", type=int, default=32768, help="chunked_ce_peak_ratio's vocabulary")
    ap.add_argument("--d-model", type=int, default=32)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-factor", type=int, default=16)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--seq-len", type=int)
    ap.add_argument("--levers", default="")
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.quick:
        args.seq, args.vocab, args.d_model, args.steps, args.chunk, args.max_factor = 64, 8192, 32, 3, 32, 2
        args.ce_vocab = 8192
    t0 = time.perf_counter()
    torch.set_num_threads(args.threads)
    plan = "ckpt,chunked,optim_offload"
    naive = measure(args, args.seq, "")
    budget = naive["peak"]
    print(f"vocab {args.vocab}, d_model {args.d_model}, {args.layers} layers, batch {args.batch}, float32; "
          f"naive plan at S={args.seq}: training peak {budget / 2**20:.1f} MiB (the budget), "
          f"{naive['step_s'] * 1e3 / (args.batch * args.seq):.3f} CPU-ms/token")
    best, best_m, factor = None, None, 2
    while factor <= args.max_factor:
        m = measure(args, factor * args.seq, plan)
        fits = m["peak"] <= budget
        print(f"  levers ({plan}) at {factor}S = {factor * args.seq}: peak {m['peak'] / 2**20:.1f} MiB "
              f"{'fits' if fits else 'over'}")
        if not fits:
            break
        best, best_m, factor = factor, m, factor * 2
    out = {}
    if best is None:
        print("no longer sequence fits the budget")
        out["seq_ratio_in_budget"] = 1
    else:
        seq = best * args.seq
        out["seq_ratio_in_budget"] = best
        ref = losses(args, seq, set(), args.steps)
        got = losses(args, seq, set(plan.split(",")), args.steps)
        out["loss_max_rel_diff"] = f"{max(abs(a - b) / abs(b) for a, b in zip(got, ref)):.2e}"
        out["time_per_token_ratio"] = round(best_m["step_s"] / best / naive["step_s"], 3)
        print(f"losses over {args.steps} steps vs the naive plan at {seq}: max rel diff {out['loss_max_rel_diff']}")
    tokens = args.batch * (seq if best is not None else args.seq)
    whole, chunked = (ce_peak(tokens, args.ce_vocab, args.d_model, args.chunk, c) for c in (False, True))
    print(f"head + cross-entropy, forward and backward, {tokens} tokens x vocabulary {args.ce_vocab}: peak "
          f"{whole / 2**20:.1f} MiB whole, {chunked / 2**20:.1f} MiB in chunks of {args.chunk} (torch.profiler memory)")
    out["chunked_ce_peak_ratio"] = round(chunked / whole, 3)
    if not args.quick:
        out["zero2_rank_state_ratio"] = round(zero2_ratio(args), 3)
    out["optimizer_offload_exact"] = str(offload_exact(args)).lower()
    print(f"{time.perf_counter() - t0:.0f} s")
    print("RESULT " + " ".join(f"{k}={v}" for k, v in out.items()))


if __name__ == "__main__":
    main()
