"""GPT-2 124M on one GPU: ecotrain's `fit` against a hand-written nanoGPT loop, side by side (issue 63).

    python bench/gpu_perf.py --gpu-minutes 8 --write bench/results/gpu_perf.txt   # the prepared GPU run
    python bench/gpu_perf.py --cpu        # (= --quick) the same program, tiny, on the CPU: ~20 s

The prepared run takes about --gpu-minutes in all (give its command a 10-minute limit); `--compile off`
leaves out the compiled runs.

The GPU run: nanoGPT's GPT-2 sizes (12 layers, 12 heads, d_model 768, vocabulary 50304, 1,024 tokens
a window; micro-batches of 12 windows, 5 accumulated per optimizer step: nanoGPT's share per GPU) for
two models, ecotrain's built-in `nanogpt` and the `transformers` GPT-2 (`causal_lm`, arch gpt2), in
bf16 autocast (`precision: bf16-mixed`), with and without `torch.compile` (`compile: true`), AdamW
with weight decay 0.1 on the matrices, betas (0.9, 0.95), clip 1.0. Both loops read one token file
written here (random uint16 ids, `data.name: tokens:PATH`).

One `fit` per (model, compile). Inside it a callback runs the hand-written loop on its own copy of
the model (the same class, built by ecotrain's `build_model` from the same config): nanoGPT's
train.py, i.e. get_batch from the token file (a fresh memmap per batch, pinned, copied
non_blocking, the next batch fetched while the GPU runs the forward), bf16 autocast, loss /
accumulate, clip 1.0, AdamW with the kernel ecotrain picked (fused on CUDA), zero_grad(set_to_none),
`loss.item()` only every `log_every` steps. ecotrain runs its defaults (ledger with CodeCarbon,
metrics.jsonl, divergence guard) except `deterministic: false` (nanoGPT's kernels on both sides;
ecotrain's default deterministic mode may pick other attention kernels: not measured here) and
`divergence.check_every` = `loop.log_every` (one host sync per log interval, as the hand loop).

Order: ecotrain's warm-up steps, then the hand loop's (compilation happens in these; not timed), then
segments in turn, K steps of ecotrain, K of the hand loop, ..., each timed between device syncs
(`torch.cuda.synchronize`), so that a slow spell of the machine falls on both. K is chosen for ~3 s
segments; `--gpu-minutes` shares the wall time among the runs, which stop at a segment's end past
their share (at least 3 pairs each). The final evaluation `fit` runs after its loop is outside the
figures (and runs eager: no second compilation for it).

RESULT keys (the built-in nanogpt, compiled on a GPU; `hf_`: the transformers GPT-2, likewise;
`eager_`, `hf_eager_`: the same without torch.compile):
- `tokens_per_s`: ecotrain's tokens per second over its timed segments; `tokens_per_s_vs_hand`:
  that over the hand loop's, the median over pairs of segments (1.0: no overhead).
- `mfu`, `mfu_hand`: tokens/s x FLOPs per token (the ledger's count of the eager run of the same
  model: forward + backward matmuls and attention) over the card's dense bf16 peak
  (ecotrain.accounting.peaks, NVIDIA's datasheet by device name; nan for a card not in it, e.g. the
  A10G, and on a CPU, which has no known peak).
- `peak_mem_vs_hand`: each side's `torch.cuda.max_memory_allocated` over its segments (the peak
  stats reset at each segment's start), less the other side's resident model and optimizer state;
  ecotrain's over the hand loop's. nan on a CPU (the process's RSS peak is both sides' at once).
- `data_wait_share`: ecotrain's own data-wait counter (the one summary.json divides, data/loader.py),
  per step over the whole run (the loader books it every 64 batches), x the timed steps, over the
  timed segments' seconds.
- `kwh_per_mtok`: the ledger's energy meter (CodeCarbon: NVML for the GPU, plus its CPU and RAM
  figures; on a CPU machine its estimate) read at each segment's ends: ecotrain's segments' kWh per
  million of its tokens (the hand loop's is printed on stderr).
- `budget_fill`: a separate ecotrain run of the nanogpt model (eager, 20 steps) with `memory.budget`
  at 50% of the card's memory (the plans measured in a fresh process, memory/planner.py): the run's
  peak, training and its final evaluation (summary.json `gpu_peak_memory_bytes`), over the budget.
  nan on a CPU.
- `compile`: whether the headline runs were compiled; `wall_s`: the program's seconds.
A run that raised reads `error` (its traceback on stderr), one left out for lack of time `skipped`.
`--write PATH` writes the RESULT line with the device, torch and CUDA versions, the date and the
commit ("with uncommitted changes" when the tree differs from it). Without a CUDA device (and
without --cpu): one line saying so and `RESULT device=absent ...`, exit 0.

What --cpu (--quick, CI's bench tier) proves: only that the program runs end to end (2 layers,
d_model 64, 64 tokens, vocabulary 256, no compile, a handful of steps). Its figures say nothing of a
GPU: no MFU, no memory peaks, no budget, and a CPU's tokens/s ratio is another machine's.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from ecotrain import Callback, Config, fit
from ecotrain.accounting.ledger import Ledger
from ecotrain.accounting.peaks import peak_flops
from ecotrain.models.build import build_model

ROOT = Path(__file__).resolve().parents[1]
HEADLINE = ("tokens_per_s", "tokens_per_s_vs_hand", "mfu", "mfu_hand", "peak_mem_vs_hand", "data_wait_share",
            "kwh_per_mtok")
EAGER_KEYS = ("tokens_per_s", "tokens_per_s_vs_hand", "mfu")
BUDGET_RESERVE_S = 75  # the memory.budget run: a measuring process and ~20 steps
FINISH_S = 10  # fit's end after the last segment: final evaluation, weights written


class Sizes(NamedTuple):
    n_layers: int
    n_heads: int
    d_model: int
    vocab: int
    seq: int
    batch: int  # windows per micro-batch
    accumulate: int  # micro-batches per optimizer step
    windows: int  # in the token file: a multiple of batch * accumulate (no short last batch to recompile for)
    warm: int  # steps of each side before any timing
    seg_steps: int  # K of the first segment
    log_every: int

    @property
    def step_tokens(self) -> int:
        return self.batch * self.accumulate * self.seq


# nanoGPT's train.py: GPT-2 124M, micro-batches of 12, 40 accumulated on 8 GPUs (5 on each)
GPT2 = Sizes(12, 12, 768, 50304, 1024, 12, 5, 12 * 5 * 17, 3, 5, 10)
TINY = Sizes(2, 4, 64, 256, 64, 4, 2, 4 * 2 * 8, 1, 2, 2)


def model_config(kind: str, s: Sizes) -> dict:
    size = {"d_model": s.d_model, "n_layers": s.n_layers, "n_heads": s.n_heads}
    if kind == "nanogpt":
        return {"name": "nanogpt", "kwargs": size}
    return {"name": "causal_lm", "kwargs": {"arch": "gpt2", **size}}


def run_config(kind: str, s: Sizes, path: Path, device: str, compiled: bool, max_steps: int, **over) -> Config:
    tree = {
        "name": f"gpu-perf-{kind}", "seed": 0, "device": device, "precision": "bf16-mixed", "compile": compiled,
        "deterministic": False,
        "data": {"name": f"tokens:{path}", "batch_size": s.batch, "val_split": 0.0, "test_split": 0.0,
                 "kwargs": {"seq_len": s.seq, "dtype": "uint16", "vocab_size": s.vocab}},
        "model": model_config(kind, s),
        "optim": {"name": "adamw", "lr": 6e-4, "weight_decay": 0.1, "betas": [0.9, 0.95]},
        "schedule": {"name": "constant"},
        "loop": {"max_steps": max_steps, "max_epochs": None, "accumulate": s.accumulate, "grad_clip": 1.0,
                 "log_every": s.log_every},
        "divergence": {"check_every": s.log_every},
        "logging": {"progress": "off"}, "checkpoint": {"at_end": False, "every_minutes": None},
    }
    for key, value in over.items():  # "memory.budget" -> tree["memory"]["budget"]
        section, name = key.split(".")
        tree.setdefault(section, {})[name] = value
    return Config.model_validate(tree)


def write_tokens(path: Path, s: Sizes) -> None:
    ids = np.random.default_rng(0).integers(0, s.vocab, size=s.windows * s.seq + 1, dtype=np.uint16)
    ids.tofile(path)


def sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


class Hand:
    """nanoGPT's train.py loop on its own model (module doc), driven `train(steps)` at a time."""

    def __init__(self, model: torch.nn.Module, path: Path, s: Sizes, device: torch.device, compiled: bool):
        self.raw, self.path, self.s, self.device = model, path, s, device
        self.model = torch.compile(model) if compiled else model
        self.gen = torch.Generator().manual_seed(1)
        self.iter, self.loss = 0, math.nan
        self.x = self.y = self.opt = None

    def make_optimizer(self, cfg, kernel: dict) -> None:
        params = list(self.raw.parameters())  # tied weights once
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        self.opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, **kernel)

    def get_batch(self):
        data = np.memmap(self.path, dtype=np.uint16, mode="r")  # nanoGPT: a fresh memmap per batch
        t = self.s.seq
        ix = torch.randint(len(data) - t, (self.s.batch,), generator=self.gen)
        x = torch.stack([torch.from_numpy(data[i:i + t].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + t].astype(np.int64)) for i in ix])
        if self.device.type == "cuda":
            x = x.pin_memory().to(self.device, non_blocking=True)
            y = y.pin_memory().to(self.device, non_blocking=True)
        return x, y

    def train(self, steps: int) -> None:
        accumulate = self.s.accumulate
        if self.x is None:
            self.x, self.y = self.get_batch()
        for _ in range(steps):
            for _ in range(accumulate):
                with torch.autocast(self.device.type, dtype=torch.bfloat16):
                    logits = self.model(self.x)
                    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), self.y.view(-1)) / accumulate
                self.x, self.y = self.get_batch()  # the next batch while the GPU runs the forward
                loss.backward()
            torch.nn.utils.clip_grad_norm_(self.raw.parameters(), 1.0)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            self.iter += 1
            if self.iter % self.s.log_every == 0:
                self.loss = loss.item() * accumulate  # a CPU-GPU sync point, at log steps only

    def resident_bytes(self) -> int:
        """Parameters and optimizer state (the gradients are None between steps)."""
        tensors = list(self.raw.parameters()) + [v for st in self.opt.state.values() for v in st.values()
                                                 if isinstance(v, torch.Tensor)]
        return sum(t.numel() * t.element_size() for t in tensors if t.device == self.device)


class Figures:
    """Sums over the timed segments of each side (a plain class: the import check loads this file
    without registering it in sys.modules, where a dataclass looks its string annotations up)."""

    def __init__(self):
        self.eco_s = self.hand_s = 0.0
        self.eco_tokens = self.hand_tokens = self.eco_steps = 0
        self.ratios: list[float] = []  # per pair: ecotrain's tokens/s over the hand loop's
        self.eco_peak = self.hand_peak = 0
        self.wait_per_step = math.nan  # ecotrain's data-wait counter over all its steps, per step
        self.eco_kwh: float | None = 0.0
        self.hand_kwh: float | None = 0.0


class Pair(Callback):
    """Inside `fit`: after ecotrain's warm-up steps, the hand loop's; then K steps of each in turn,
    each segment timed between device syncs. Stops the run after `max_pairs`, or past `deadline`
    once `min_pairs` are done."""

    after = ("*",)  # every other callback's work of a step is ecotrain's, inside its segment

    def __init__(self, hand: Hand, s: Sizes, cuda: bool, compiled: bool, deadline: float, min_pairs: int,
                 max_pairs: float, target_s: float | None):
        self.hand, self.s, self.cuda, self.compiled = hand, s, cuda, compiled
        self.deadline, self.min_pairs, self.max_pairs, self.target_s = deadline, min_pairs, max_pairs, target_s
        self.k, self.steps, self.pairs = s.seg_steps, 0, 0
        self.fig = Figures()
        self.ledger: Ledger | None = None
        self.hand_resident = 0
        self.t0 = None  # the open ecotrain segment: (clock, step, samples, kWh)

    def on_fit_start(self, state):
        kernel = {k: v for k, v in state.optimizer.defaults.items() if k in ("fused", "foreach") and v}
        self.hand.make_optimizer(state.config.optim, kernel)  # ecotrain's kernel: fused on CUDA
        self.ledger = next((c for c in state.cost_listeners if isinstance(c, Ledger)), None)

    def kwh(self) -> float | None:
        meter = self.ledger.meter if self.ledger is not None else None
        return meter.live_kwh() if meter is not None else None

    def open_segment(self, state) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        self.t0 = (time.perf_counter(), self.steps, state.samples_seen, self.kwh())

    def on_step_end(self, state):
        self.steps += 1
        if self.t0 is None:
            if self.steps == self.s.warm:
                sync(self.cuda)
                self.hand.train(self.s.warm)  # compiles, when compiled: never timed
                sync(self.cuda)
                self.hand_resident = self.hand.resident_bytes()
                self.open_segment(state)
            return
        if self.steps - self.t0[1] < self.k:
            return
        fig, (t, step, samples, kwh) = self.fig, self.t0
        sync(self.cuda)
        eco_s, eco_kwh = time.perf_counter() - t, self.kwh()
        eco_tokens = (state.samples_seen - samples) * self.s.seq
        if self.cuda:
            fig.eco_peak = max(fig.eco_peak, torch.cuda.max_memory_allocated() - self.hand_resident)
            torch.cuda.reset_peak_memory_stats()
        at_start = torch.cuda.memory_allocated() if self.cuda else 0
        t1 = time.perf_counter()
        self.hand.train(self.k)
        sync(self.cuda)
        hand_s, hand_kwh = time.perf_counter() - t1, self.kwh()
        hand_tokens = self.k * self.s.step_tokens
        if self.cuda:  # less ecotrain's resident state: what was allocated at the start beyond the hand loop's
            fig.hand_peak = max(fig.hand_peak, torch.cuda.max_memory_allocated() - (at_start - self.hand_resident))
        fig.eco_s, fig.hand_s = fig.eco_s + eco_s, fig.hand_s + hand_s
        fig.eco_tokens, fig.hand_tokens = fig.eco_tokens + eco_tokens, fig.hand_tokens + hand_tokens
        fig.eco_steps += self.steps - step
        fig.ratios.append((eco_tokens / eco_s) / (hand_tokens / hand_s))
        if None in (kwh, eco_kwh, hand_kwh, fig.eco_kwh):
            fig.eco_kwh = fig.hand_kwh = None
        else:
            fig.eco_kwh, fig.hand_kwh = fig.eco_kwh + eco_kwh - kwh, fig.hand_kwh + hand_kwh - eco_kwh
        self.pairs += 1
        late = self.pairs >= self.min_pairs and time.perf_counter() >= self.deadline
        if self.pairs >= self.max_pairs or late:
            state.stop("bench: enough segments")
            return
        if self.target_s:  # segments of about target_s seconds
            self.k = max(1, min(500, round(self.k * self.target_s / eco_s)))
        self.open_segment(state)

    def on_fit_end(self, state):
        # the loader books its wait every 64 batches (data/loader.py), and the rest at the loop's end: here
        self.fig.wait_per_step = state.counters.data_wait_seconds / max(state.step, 1)
        if self.compiled:  # fit's final evaluation: eager, no compilation for eval mode (outside the figures)
            torch.compiler.set_stance("force_eager")


def one_run(kind: str, compiled: bool, s: Sizes, path: Path, device: torch.device, deadline: float, quick: bool,
            tmp: Path) -> dict:
    """ecotrain and the hand loop interleaved in one `fit`; the figures of both sides."""
    cuda = device.type == "cuda"
    cfg = run_config(kind, s, path, device.type, compiled, s.warm + 3 * s.seg_steps if quick else 10**7)
    torch.manual_seed(1)
    hand = Hand(build_model(cfg.model, (s.seq,), s.vocab).to(device), path, s, device, compiled)
    pair = Pair(hand, s, cuda, compiled, deadline, min_pairs=3, max_pairs=3 if quick else math.inf,
                target_s=None if quick else 3.0)
    try:
        res = fit(cfg, run_dir=tmp / f"{kind}-{'compiled' if compiled else 'eager'}", quiet=True, callbacks=[pair])
    finally:
        if compiled:
            torch.compiler.set_stance("default")
    tokens = json.loads((res.run_dir / "ledger.json").read_text()).get("tokens") or {}
    f = pair.fig
    out = {"pairs": pair.pairs, "eco_tok_s": f.eco_tokens / f.eco_s, "hand_tok_s": f.hand_tokens / f.hand_s,
           "vs_hand": statistics.median(f.ratios), "spread": (min(f.ratios), max(f.ratios)),
           "peak_vs_hand": f.eco_peak / f.hand_peak if cuda and f.hand_peak > 0 else math.nan,
           "eco_peak": f.eco_peak, "hand_peak": f.hand_peak, "wait_share": f.wait_per_step * f.eco_steps / f.eco_s,
           "kwh_per_mtok": f.eco_kwh / f.eco_tokens * 1e6 if f.eco_kwh is not None else math.nan,
           "hand_kwh_per_mtok": f.hand_kwh / f.hand_tokens * 1e6 if f.hand_kwh is not None else math.nan,
           "flops_per_token": tokens.get("flops_per_token"), "kernel": hand.opt.defaults.get("fused"),
           "hand_loss": hand.loss}
    del res, pair, hand
    return out


def budget_fill(s: Sizes, path: Path, device: torch.device, tmp: Path) -> float:
    """An ecotrain run (nanogpt, eager) under memory.budget = half the card: its peak over the budget."""
    budget = torch.cuda.get_device_properties(device).total_memory // 2
    cfg = run_config("nanogpt", s, path, "cuda", False, 2 * s.log_every,
                     **{"memory.budget": budget, "ledger.energy": "off"})
    torch.cuda.reset_peak_memory_stats(device)  # summary.json's peak is the process's since its last reset
    res = fit(cfg, run_dir=tmp / "budget", quiet=True)
    peak, plan = res.summary["gpu_peak_memory_bytes"], res.summary.get("memory_plan") or {}
    chosen = plan.get("chosen") or {}
    gib, measured = 2**30, chosen.get("peak_bytes") or 0
    print(f"budget: {budget / gib:.1f} GiB; plan {chosen.get('plan')}, measured {measured / gib:.1f} GiB; "
          f"the run's peak {peak / gib:.1f} GiB", file=sys.stderr)
    return peak / budget


def free(cuda: bool) -> None:
    if "torch._dynamo" in sys.modules:  # a compiled run's graphs (importing it costs seconds otherwise)
        torch.compiler.reset()
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()


def fmt(v, spec: str) -> str:
    if isinstance(v, str):
        return v
    return "nan" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def figures(prefix: str, r, keys: tuple, fpt, peak) -> dict:
    """RESULT pairs of one run (`r`: its figures, or 'error' / 'skipped')."""
    if isinstance(r, str):
        return {prefix + k: r for k in keys}
    mfu = (lambda tok_s: tok_s * fpt / peak) if fpt and peak else (lambda tok_s: math.nan)
    every = {"tokens_per_s": fmt(r["eco_tok_s"], ".0f"), "tokens_per_s_vs_hand": fmt(r["vs_hand"], ".3f"),
             "mfu": fmt(mfu(r["eco_tok_s"]), ".3f"), "mfu_hand": fmt(mfu(r["hand_tok_s"]), ".3f"),
             "peak_mem_vs_hand": fmt(r["peak_vs_hand"], ".3f"), "data_wait_share": fmt(r["wait_share"], ".4f"),
             "kwh_per_mtok": fmt(r["kwh_per_mtok"], ".3g")}
    return {prefix + k: every[k] for k in keys}


def git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True,
                               timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + (" with uncommitted changes" if dirty else "")


def write(path: Path, line: str, device_name: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    cuda = torch.version.cuda or "none"
    path.write_text(f"# python bench/gpu_perf.py {' '.join(sys.argv[1:])}\n"
                    f"device: {device_name}\ntorch: {torch.__version__}\ncuda: {cuda}\n"
                    f"date: {datetime.now(timezone.utc).isoformat(timespec='seconds')}\n"
                    f"commit: {git_commit()}\n{line}\n")


def measure(runs: list, s: Sizes, device: torch.device, end: float, tmp: Path) -> tuple[dict, object]:
    """Each run in turn, a share of the time left each (--gpu-minutes); then the budget run on CUDA.
    Returns ({prefix: figures | 'error' | 'skipped'}, budget_fill)."""
    cuda, got = device.type == "cuda", {}
    has_hf = importlib.util.find_spec("transformers") is not None
    path = tmp / "tokens.bin"
    write_tokens(path, s)
    for i, (prefix, kind, comp) in enumerate(runs):
        left = end - time.perf_counter() - (BUDGET_RESERVE_S if cuda else 0)
        if kind == "causal_lm" and not has_hf:
            print(f"{kind}: transformers is not installed (the lm extra)", file=sys.stderr)
            got[prefix] = "skipped"
            continue
        if cuda and left < (90 if comp else 40):
            print(f"{kind} compile={comp}: {left:.0f} s of --gpu-minutes left, too few", file=sys.stderr)
            got[prefix] = "skipped"
            continue
        t = time.perf_counter()
        deadline = t + left / (len(runs) - i) - FINISH_S
        try:
            got[prefix] = one_run(kind, comp, s, path, device, deadline, not cuda, tmp)
        except Exception as exc:  # one failed run must not stop the rest
            traceback.print_exc()
            print(f"{kind}: {type(exc).__name__}: {exc}"[:300], file=sys.stderr)
            got[prefix] = "error"
        free(cuda)
        r = got[prefix]
        if isinstance(r, dict):
            r = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}
        print(f"{kind} compile={comp}: {time.perf_counter() - t:.0f} s {r}", file=sys.stderr, flush=True)
    if not cuda:
        return got, math.nan
    if end - time.perf_counter() < 30:
        return got, "skipped"
    try:
        fill = budget_fill(s, path, device, tmp)
    except Exception as exc:
        traceback.print_exc()
        print(f"budget: {type(exc).__name__}: {exc}"[:300], file=sys.stderr)
        fill = "error"
    free(cuda)
    return got, fill


def result_pairs(device_name: str, runs: list, got: dict, fill, peak) -> dict:
    fpt = {}  # FLOPs per token by model: the eager run's count, else the compiled one's
    for prefix, kind, comp in sorted(runs, key=lambda r: r[2]):
        r = got.get(prefix)
        if isinstance(r, dict) and r["flops_per_token"] and kind not in fpt:
            fpt[kind] = r["flops_per_token"]
    out = {"device": device_name.replace(" ", "_")}
    for prefix, kind, comp in runs:
        keys = HEADLINE if prefix in ("", "hf_") else EAGER_KEYS
        out.update(figures(prefix, got.get(prefix, "skipped"), keys, fpt.get(kind), peak))
        if prefix == "":
            out["budget_fill"] = fmt(fill, ".3f")
    return out


def main() -> int:
    start = time.perf_counter()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="tiny sizes on the CPU: the program runs; no GPU figure")
    ap.add_argument("--quick", action="store_true", help="the same as --cpu (CI's bench tier)")
    ap.add_argument("--gpu-minutes", type=float, default=8.0, help="the GPU run's wall time in all (default 8)")
    ap.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                    help="torch.compile runs beside the eager ones (auto: on a GPU only)")
    ap.add_argument("--write", type=Path, help="write the RESULT line, device, versions, date and commit here")
    args = ap.parse_args()
    cpu = args.cpu or args.quick
    if cpu and args.write and (ROOT / "bench" / "results") in args.write.resolve().parents:
        ap.error("--write into bench/results/ takes a GPU run's figures; write a --cpu run elsewhere")
    if not cpu and not torch.cuda.is_available():
        print("no CUDA device: the GPU figures need one (--cpu runs the same program on the CPU, tiny)")
        print("RESULT device=absent " + " ".join(f"{k}=absent" for k in (*HEADLINE, "budget_fill")))
        return 0
    device = torch.device("cpu" if cpu else "cuda")
    compiled = args.compile == "on" or (args.compile == "auto" and not cpu)
    device_name = "cpu" if cpu else torch.cuda.get_device_name(device)
    peak, why = peak_flops(device_name, "bf16")
    print(f"{device_name}: bf16 peak {why}", file=sys.stderr)
    runs = [("", "nanogpt", compiled), ("hf_", "causal_lm", compiled)]  # (prefix, model, compiled)
    if compiled:
        runs += [("eager_", "nanogpt", False), ("hf_eager_", "causal_lm", False)]
    with tempfile.TemporaryDirectory() as tmp:
        got, fill = measure(runs, TINY if cpu else GPT2, device, start + args.gpu_minutes * 60, Path(tmp))
    results = result_pairs(device_name, runs, got, fill, peak)
    results.update(compile=str(compiled).lower(), wall_s=f"{time.perf_counter() - start:.0f}")
    line = "RESULT " + " ".join(f"{k}={v}" for k, v in results.items())
    if args.write:
        write(args.write, line, device_name)
        print(f"wrote {args.write}", file=sys.stderr)
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
