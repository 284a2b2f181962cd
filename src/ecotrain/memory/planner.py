"""`memory.budget`: measure a few exactly-equivalent plans and train with the fastest that fits.

A plan combines levers that leave the maths of a step unchanged (`memory.budget_levers` may leave
some out): which blocks are checkpointed (core/levers.py: off, every K-th block, all) and under
which per-op policy (core/selective.py: `checkpoint` keeps attention outputs and recomputes the
rest, `selective` keeps every matmul output and recomputes pointwise ops), whether the other blocks'
saved activations are offloaded (core/offload.py: host memory on CUDA, a file on CPU; lossless),
how many micro-batches the effective batch is cut into (exact accumulation:
`loop.backward_micro_batches` normalises by the whole batch's units; the same count OOM recovery
raises), whether the LM head and cross-entropy run over token chunks (core/chunked_loss.py: the
logits never whole; equal within float rounding), whether the optimizer state leaves memory between
steps (core/optim_offload.py: bit-identical) and, only with `memory.allow_precision_change`, fp32
vs bf16 autocast and bf16 offload.
Evaluation reads as many samples at a time as a training micro-batch (`memory.eval_batch_size`), and
its peak is measured with the plan's: a plan fits when both do. In one process, when no plan fits
the last line says how far ZeRO-2 (gradients and optimizer state sharded) or FSDP (parameters too)
over N ranks would go (`shard_hint`). Under torchrun every plan is measured by N processes (one per
rank, on this machine) and its peak is the largest rank's; with the `shard` lever the plans combine
the levers above with the strategy, DDP, ZeRO-2 or FSDP (memory/shard.py: one search per strategy).

Each measured plan runs a few real training steps of the real model and batch in a fresh process
(assembly/memory_worker.py): on CPU, peak RSS (`ru_maxrss`) only ever grows within a process, so one
process per plan is the only honest per-plan peak; on CUDA, the allocator's
`max_memory_allocated`. The first measurement (no checkpointing, fewest micro-batches) also
reports `ecotrain plan`'s saved-tensor estimate of every candidate's activations, calibrated on it
to predict every other candidate's peak; only the least-constrained candidates predicted to fit
are measured, and the choice is made on measured peaks alone: the fastest measured step whose peak
is within `budget * (1 - budget_margin)`.

The choice and every measurement go to `memory_plan.json` in the run folder and `memory_plan` in
summary.json; a resume reads memory_plan.json back and does not measure again.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from ecotrain.base import safefile
from ecotrain.base.errors import ConfigError
from ecotrain.base.log import log
from ecotrain.base.units import fmt_bytes, parse_bytes  # noqa: F401  (the planner's sizes)
from ecotrain.base.stats import pareto_front
from ecotrain.base.runfiles import MEMORY_PLAN

PLAN_FILE = MEMORY_PLAN
PREDICT_SLACK = 1.05  # measure a candidate predicted up to 5% over the usable budget: predictions are rough
# step costs within 3% are a tie: one plan's CPU seconds per step spread by ~2% between fresh processes on
# a shared 2-core machine (docs/memory.md); a tie goes to the plan that fills more of the budget
TIE = 0.03
FULL = 0.95  # a plan that fits at 95% of the usable budget (0.9 of the budget at the default margin) ends the search


# ---------------------------------------------------------------- candidates


# memory.budget_levers' names
LEVERS = ("checkpoint", "selective", "offload", "micro_batches", "chunked_loss", "optimizer_offload", "shard")
# distributed.strategy as a lever (under torchrun): how each reads in a plan
STRATEGY_TEXT = {"ddp": "DDP", "zero2": "ZeRO-2", "fsdp": "FSDP"}


@dataclass(frozen=True)
class Candidate:
    checkpointing: str  # "off", "all", "every_n:K" or "modules" (the user's own list)
    micro_batches: int  # pieces of the effective batch (exact accumulation)
    precision: str
    n_checkpointed: int = 0  # blocks checkpointed (for ordering and display)
    policy: str = "attention"  # what a checkpointed block keeps: "attention" or "matmuls" (core/selective.py)
    offload: str = "off"  # the other blocks' saved activations: "off", "on" (lossless) or "bf16"
    n_offloaded: int = 0  # blocks offloaded (for display)
    eval_batch: Optional[int] = None  # evaluation's batch (memory.eval_batch_size); None: the config's
    offload_blocks: Optional[int] = None  # offload only the first K of the other blocks; None: all of them
    chunked: bool = False  # the LM head + cross-entropy over token chunks (memory.chunked_loss)
    optim_offload: bool = False  # the optimizer state out of memory between steps (memory.optimizer_offload)
    strategy: Optional[str] = None  # under torchrun: "ddp", "zero2" or "fsdp" (STRATEGY_TEXT); None: one process
    ranks: int = 1  # the processes that measured it (and train with it); batches are cut per rank

    @property
    def key(self) -> str:
        selective = "+matmuls" if self.policy == "matmuls" and self.checkpointing != "off" else ""
        offload = {"off": "", "on": "/offload", "bf16": "/offload-bf16"}[self.offload]
        if offload and self.offload_blocks is not None:
            offload += f":{self.offload_blocks}"
        extra = ("/chunked" if self.chunked else "") + ("/optim-offload" if self.optim_offload else "")
        extra += f"/{self.strategy}" if self.strategy else ""
        return f"{self.checkpointing}{selective}/{self.micro_batches}/{self.precision}{offload}{extra}"

    @property
    def group(self) -> tuple:
        """Every lever but the micro-batch count."""
        return self.family + (self.offload_blocks,)

    @property
    def family(self) -> tuple:
        """Every lever but the micro-batch count and how many blocks are offloaded: plans whose
        estimates err alike (planner.corrected)."""
        return (self.checkpointing, self.policy, self.offload, self.precision, self.chunked, self.optim_offload,
                self.strategy)

    def describe(self, batch: int) -> str:
        """`batch`: the step's samples (data.batch_size * loop.accumulate), each rank's share cut in micro-batches."""
        how = "selective recompute of" if self.policy == "matmuls" else "checkpointing"
        ck = {"off": "no checkpointing", "all": f"{how} every block"}.get(self.checkpointing)
        if ck is None:
            ck = (f"{how} {self.n_checkpointed} block{'s' if self.n_checkpointed > 1 else ''} "
                  f"({self.checkpointing.replace(':', '=')})"
                  if self.checkpointing.startswith("every_n") else f"{how} memory.activation_checkpointing.modules")
        if self.offload != "off":
            whose = ("every block" if self.checkpointing == "off" else f"the other {self.n_offloaded}")
            if self.offload_blocks is not None:
                whose = f"{self.offload_blocks} of {'the' if self.checkpointing == 'off' else 'the other'} blocks"
            ck += f", offload{' (bf16)' if self.offload == 'bf16' else ''} of {whose}"
        ck += ", chunked loss" if self.chunked else ""
        ck += ", optimizer state offloaded" if self.optim_offload else ""
        size = -(-(batch // self.ranks) // self.micro_batches)
        out = f"{ck}, {self.micro_batches} micro-batch{'es' if self.micro_batches > 1 else ''} of {size}"
        if self.strategy is None:
            return f"{out}, {self.precision}"
        return f"{out} per rank, {self.precision}, {STRATEGY_TEXT[self.strategy]} over {self.ranks} ranks"

    def ac_spec(self, configured):
        """The `memory.activation_checkpointing` value of this candidate."""
        if self.checkpointing.startswith("every_n:"):
            return {"every_n": int(self.checkpointing.split(":")[1])}
        return configured if self.checkpointing == "modules" else self.checkpointing


def checkpoint_levels(n_blocks: int, named: bool) -> list[tuple[str, int]]:
    """(level, blocks checkpointed), from none to all: every K-th block for each distinct count."""
    if named:  # the user named the modules: those, or none
        return [("off", 0), ("modules", 0)]
    if n_blocks == 0:
        return [("off", 0)]
    by_count: dict[int, str] = {}
    for k in range(2, n_blocks + 1):  # the smallest K of each count: the checkpointed blocks spread evenly
        by_count.setdefault(-(-n_blocks // k), f"every_n:{k}")
    every = [(level, count) for count, level in sorted(by_count.items()) if count < n_blocks]
    return [("off", 0), *every, ("all", n_blocks)]


def micro_counts(batch: int, accumulate: int, min_micro: int) -> list[int]:
    """The configured count (`loop.accumulate`), doubled while a micro-batch keeps >= `min_micro` samples."""
    out, n = [], accumulate
    while n <= batch and -(-batch // n) >= min_micro:
        out.append(n)
        if -(-batch // (2 * n)) == -(-batch // n):
            break
        n *= 2
    return out or [accumulate]


def eval_batch_of(default: int, batch: int, micro_batches: int) -> int:
    """Evaluation's batch under a plan: a training micro-batch's samples (an inference forward holds
    nothing for backward, so it stays under the training step's peak; measured with it), at most
    the configured one."""
    return min(default, -(-batch // micro_batches))


def candidates(n_blocks: int, named: bool, batch: int, accumulate: int, min_micro: int, precision: str,
               allow_precision_change: bool, levers: Sequence[str] = LEVERS,
               eval_default: Optional[int] = None, chunkable: bool = False,
               has_optim_state: bool = False, strategy: Optional[str] = None, ranks: int = 1) -> list[Candidate]:
    """Every exactly-equivalent plan with the `levers` allowed (bf16 ones with `allow_precision_change`);
    the first is the least constrained (the baseline measured first). Within a group (every lever but
    the micro-batches) the micro-batch count rises. `chunkable`: the model has an LM head and the task
    is ecotrain's cross-entropy (chunked_loss.applies); `has_optim_state`: the optimizer keeps state.
    `strategy` and `ranks` (under torchrun): every plan's; each rank cuts its share, `batch // ranks`.
    ZeRO-2 and FSDP shard the optimizer state as DTensors, which optimizer offload refuses: not theirs;
    nor is the chunked loss FSDP's (it reads the LM head's weight outside the head's forward, resharded)."""
    batch //= ranks
    precisions = [precision]
    if allow_precision_change:
        precisions += [p for p in ("bf16-mixed", "fp32") if p != precision]
    policies = [p for p, lever in (("attention", "checkpoint"), ("matmuls", "selective")) if lever in levers]
    levels = checkpoint_levels(n_blocks, named) if policies else [("off", 0)]
    offloads = ["off"]
    if "offload" in levers and n_blocks:  # offload wraps the repeated blocks (memory/levers.offload_targets)
        offloads += ["on", "bf16"] if allow_precision_change else ["on"]
    micros = micro_counts(batch, accumulate, min_micro) if "micro_batches" in levers else [accumulate]
    chunks = [False, True] if "chunked_loss" in levers and chunkable and strategy != "fsdp" else [False]
    optims = ([False, True] if "optimizer_offload" in levers and has_optim_state and strategy not in ("zero2", "fsdp")
              else [False])
    out = []
    for p, chunked, optim in ((p, ch, o) for p in precisions for ch in chunks for o in optims):
        for level, count in levels:
            for policy in (["attention"] if level == "off" else policies):
                for off in offloads:
                    n_off = n_blocks - count if level != "modules" else n_blocks
                    if off != "off" and n_off <= 0:
                        continue
                    # offload of the first K of the other blocks, K < all: the finest step in memory
                    # (one block's activations), so a plan can fill the budget
                    parts = [None] if off == "off" or level == "modules" else [*range(1, n_off), None]
                    out += [Candidate(level, n, p, count, policy, off,
                                      0 if off == "off" else (k or n_off),
                                      eval_batch_of(eval_default, batch, n) if eval_default else None, k,
                                      chunked, optim, strategy, ranks)
                            for k in parts for n in micros]
    return out


# ---------------------------------------------------------------- measurements and the choice


@dataclass
class Measured:
    candidate: Candidate
    peak_bytes: int
    step_seconds: float  # the fastest timed step (the least disturbed by neighbours)
    seconds: float = 0.0  # wall time of the measuring process, start-up included
    predicted_bytes: Optional[int] = None
    cpu_seconds: Optional[float] = None  # CPU runs: all threads' CPU seconds of that fastest step
    eval_peak_bytes: Optional[int] = None  # the peak once evaluation ran too (CPU: RSS never drops, so >= peak)
    rank_peaks: Optional[list] = None  # under torchrun: each rank's training peak (peak_bytes is the largest)

    @property
    def top(self) -> int:
        """The plan's peak, training and evaluation together: what the budget bounds."""
        return max(self.peak_bytes, self.eval_peak_bytes or 0)

    @property
    def cost(self) -> float:
        """What "fastest" compares: on CPU the step's CPU seconds (same thread count for every plan, and
        far less disturbed by neighbours on a shared machine than wall time); on CUDA the wall time."""
        return self.cpu_seconds if self.cpu_seconds is not None else self.step_seconds


@dataclass
class Baseline:
    """What the first measurement adds: the pieces that predict every other candidate's peak."""

    start_bytes: int  # memory in use when training starts (process, data, model)
    start_peak_bytes: int  # the peak before training (data loading may pass the training peak)
    state_bytes: int  # gradients + optimizer state, allocated during the first steps
    activations: dict  # candidate key -> estimated activation bytes (memory/estimate.py's saved-tensor figure)
    n_blocks: int = 0  # the model's repeated blocks (memory.find_blocks)
    optim_bytes: int = 0  # the optimizer state's share of state_bytes (what optimizer offload moves out)
    chunkable: bool = False  # the chunked loss applies (an LM head, ecotrain's cross-entropy: chunked_loss.applies)
    strategy_bytes: int = 0  # under torchrun: what the strategy holds besides the model state (shard.strategy_bytes)


def held(info: Baseline, c: Candidate) -> int:
    """The bytes a plan holds through forward and backward besides activations: the process, the
    model state (this rank's) and what its strategy holds (buckets, gathered parameters), less the
    optimizer state when it is offloaded."""
    return info.start_bytes + info.state_bytes + info.strategy_bytes - (info.optim_bytes if c.optim_offload else 0)


def predict(base: Measured, info: Baseline, c: Candidate) -> Optional[int]:
    """A candidate's peak from the baseline's: the measured activation share scaled by the estimates.
    With the optimizer state offloaded, its step (the state back, the activations gone) may be the peak."""
    act_base, act = info.activations.get(base.candidate.key), info.activations.get(c.key)
    if not act_base or act is None:
        return None
    scale = max(0.0, base.peak_bytes - held(info, base.candidate)) / act_base
    # the step: the state back, and the foreach Adam's temporaries, about one more gradient's bytes
    step = info.start_bytes + 2 * info.state_bytes - info.optim_bytes if c.optim_offload else 0
    return int(max(info.start_peak_bytes, held(info, c) + scale * act, step))


def fits(m: Measured, usable: float) -> bool:
    return m.top <= usable


def choose(measured: Sequence[Measured], usable: float) -> Optional[Measured]:
    """The fastest measured plan whose peak (evaluation's included) is within `usable`; among plans
    within TIE of the fastest, the fullest: the step costs are equal within what one measurement can
    tell, and the fuller plan recomputes, offloads and cuts less."""
    ok = [m for m in measured if fits(m, usable)]
    if not ok:
        return None
    fastest = min(m.cost for m in ok)
    return max((m for m in ok if m.cost <= fastest * (1 + TIE)), key=lambda m: (m.top, -m.cost))


def to_measure(cands: Sequence[Candidate], predicted: dict, usable: float, done: set,
               measured: Sequence[Measured] = (), above: float = 0.0,
               slack: float = PREDICT_SLACK) -> list[Candidate]:
    """Per group of levers (all but the micro-batches), the fewest micro-batches predicted to fit
    (within `slack`) and to peak over `above`: the plans that nothing cheaper dominates (a plan with
    more micro-batches than a measured one that fits is not one of them). Those predicted to fit first,
    then those within the slack; largest predicted peak first within each: the plans that use most of
    the budget recompute, offload and cut the least."""
    fitted = {}
    for m in measured:
        if fits(m, usable):
            fitted[m.candidate.group] = min(fitted.get(m.candidate.group, m.candidate.micro_batches),
                                            m.candidate.micro_batches)
    best: dict[tuple, Candidate] = {}
    for c in cands:
        p = predicted.get(c.key)
        group = c.group
        if c.key in done or group in best or c.micro_batches >= fitted.get(group, c.micro_batches + 1):
            continue
        if p is not None and above < p <= usable * slack:
            best[group] = c  # candidates come in rising micro-batch order within a group
    # plans predicted to fit outright before those only within the slack
    return sorted(best.values(), key=lambda c: (predicted[c.key] > usable, -predicted[c.key]))


def corrected(raw: dict, cands: Sequence[Candidate], measured: Sequence[Measured], fixed: int,
              optim_bytes: int = 0) -> dict:
    """The predictions, each group's scaled by how far its measured plans' activations were from their
    own predictions (the estimate misses per-lever effects: allocator slack, a micro-batch's loss
    buffers); a family of levers not measured yet takes the median of the measured ones' ratios.
    `fixed`: the bytes no lever changes (process, model state), less `optim_bytes` for a plan that
    offloads the optimizer state."""
    def fixed_of(c: Candidate) -> int:
        return fixed - (optim_bytes if c.optim_offload else 0)

    ratio: dict[tuple, float] = {}
    for m in measured[1:]:  # the baseline calibrated the raw predictions: its ratio is 1
        p, f = raw.get(m.candidate.key), fixed_of(m.candidate)
        if p is not None and p > f:
            ratio[m.candidate.family] = max(0.0, m.peak_bytes - f) / (p - f)
    shared = statistics.median(ratio.values()) if ratio else None  # part of the error is every plan's (allocator)
    out = dict(raw)
    for c in cands:
        r = ratio.get(c.family, shared)
        if r is not None and raw.get(c.key) is not None:
            out[c.key] = int(fixed_of(c) + r * max(0, raw[c.key] - fixed_of(c)))
    return out


def smallest_first(cands: Sequence[Candidate], predicted: dict, done: set) -> list[Candidate]:
    return sorted((c for c in cands if c.key not in done and predicted.get(c.key) is not None),
                  key=lambda c: predicted[c.key])


def search(first: Candidate, expand: Callable, budget: int, margin: float, measure: Callable,
           limit: int, closest: bool = True, beat: Optional[float] = None) -> "Search":
    """Measure `first` (the least constrained plan), then up to `limit` more. `measure(candidate,
    first)` returns a Measured, and with `first` a Baseline too; `expand(baseline)`: every candidate.
    `closest`: when nothing fits, measure the most frugal plan too, to say how close it came. `beat`:
    the step cost of a plan that fits already (another strategy's); when `first`, the fastest plan
    here (every lever adds work), costs more than a tie with it, nothing more is measured."""
    usable = budget * (1 - margin)
    t0 = time.perf_counter()
    base, info = measure(first, True)
    cands = expand(info)
    measured, done = [base], {base.candidate.key}
    raw = {c.key: predict(base, info, c) for c in cands}
    fixed = info.start_bytes + info.state_bytes + info.strategy_bytes
    predicted = raw
    if not fits(base, usable) and (beat is None or base.cost <= beat * (1 + TIE)):
        nxt: list = []
        while len(measured) <= limit:
            predicted = corrected(raw, cands, measured, fixed, info.optim_bytes)  # each measurement sharpens its family's
            best = choose(measured, usable)
            if best is not None and best.top >= FULL * usable:
                break
            # once a plan fits, only fuller plans predicted to fit are worth a measurement
            queue = nxt or to_measure(cands, predicted, usable, done, measured, *(
                (best.top, 1.0) if best is not None else (0.0, PREDICT_SLACK)))
            if not queue:
                break
            c = queue[0]
            m = measure(c, False)
            m.predicted_bytes = predicted.get(c.key)
            measured.append(m)
            done.add(c.key)
            # over while nothing fits: the prediction was too low. A partial offload has a finer step
            # (one more block offloaded), which the corrected predictions find; otherwise the next
            # micro-batch count of its group is measured next
            nxt = [] if choose(measured, usable) is not None or c.offload_blocks is not None else [
                d for d in cands if d.group == c.group and d.micro_batches > c.micro_batches and d.key not in done][:1]
        if closest and choose(measured, usable) is None:  # nothing fits: the most frugal plan, to say how close
            rest = smallest_first(cands, predicted, done)
            if rest:
                m = measure(rest[0], False)
                m.predicted_bytes = predicted.get(rest[0].key)
                measured.append(m)
    base.predicted_bytes = raw.get(base.candidate.key)
    return Search(budget, margin, measured, choose(measured, usable), time.perf_counter() - t0, info.state_bytes,
                  optim_bytes=info.optim_bytes, ranks=first.ranks)


@dataclass
class Search:
    budget: int
    margin: float
    measured: list
    chosen: Optional[Measured]
    seconds: float
    state_bytes: Optional[int] = None  # gradients + optimizer state: what sharding would divide
    reused: bool = False  # read back from the run folder (a resume): nothing measured this time
    optim_bytes: Optional[int] = None  # the optimizer state's share of state_bytes
    ranks: int = 1  # the processes each plan was measured with (torchrun's world size)

    @property
    def usable(self) -> float:
        return self.budget * (1 - self.margin)

    def record(self, batch: int) -> dict:
        """memory_plan.json and summary.json's `memory_plan`."""
        def row(m: Measured) -> dict:
            return {**asdict(m.candidate), "plan": m.candidate.describe(batch), "peak_bytes": m.peak_bytes,
                    "step_seconds": round(m.step_seconds, 4), "seconds": round(m.seconds, 2),
                    "cpu_seconds": None if m.cpu_seconds is None else round(m.cpu_seconds, 4),
                    "eval_peak_bytes": m.eval_peak_bytes, "rank_peaks": m.rank_peaks,
                    "predicted_bytes": m.predicted_bytes, "fits": fits(m, self.usable)}
        return {"budget_bytes": self.budget, "margin": self.margin, "usable_bytes": int(self.usable),
                "search_seconds": round(self.seconds, 2), "measured": [row(m) for m in self.measured],
                "chosen": row(self.chosen) if self.chosen else None,
                "state_bytes": self.state_bytes, "optim_bytes": self.optim_bytes, "ranks": self.ranks}


def from_record(rec: dict) -> Search:
    def m(r: dict) -> Measured:
        c = Candidate(r["checkpointing"], int(r["micro_batches"]), r["precision"], int(r.get("n_checkpointed", 0)),
                      r.get("policy", "attention"), r.get("offload", "off"), int(r.get("n_offloaded", 0)),
                      r.get("eval_batch"), r.get("offload_blocks"), bool(r.get("chunked", False)),
                      bool(r.get("optim_offload", False)), r.get("strategy"),
                      int(r.get("ranks", 1)))  # older records: the defaults
        return Measured(c, int(r["peak_bytes"]), float(r["step_seconds"]), float(r.get("seconds", 0)),
                        r.get("predicted_bytes"), r.get("cpu_seconds"), r.get("eval_peak_bytes"), r.get("rank_peaks"))
    measured = [m(r) for r in rec["measured"]]
    chosen = m(rec["chosen"]) if rec.get("chosen") else None
    return Search(int(rec["budget_bytes"]), float(rec["margin"]), measured, chosen, float(rec["search_seconds"]),
                  rec.get("state_bytes"), reused=True, optim_bytes=rec.get("optim_bytes"),
                  ranks=int(rec.get("ranks", 1)))


def pareto(measured: Sequence[Measured]) -> list[Measured]:
    """The measured plans no other beats on both peak and step time, by rising peak."""
    return pareto_front(measured, x=lambda m: m.top, y=lambda m: m.cost)


def shard_hint(smallest: Measured, usable: float, state_bytes: Optional[int]) -> str:
    """Which lever goes further when no plan fits: sharding the model state over N ranks, ZeRO-2 first
    (distributed.strategy=zero2: gradients and optimizer state sharded, parameters whole; the step is
    the same as one process's), FSDP when that is not enough (parameters too, gathered block by block)."""
    over = smallest.top - usable
    sharded = state_bytes or 0  # what ZeRO-2 divides by N: gradients + optimizer state
    if sharded > over:
        n = 2
        while sharded * (1 - 1 / n) < over:
            n *= 2
        return (f"sharding gradients and optimizer state over {n} ranks (distributed.strategy=zero2 under torchrun; "
                f"fsdp shards the parameters too) would save ~{fmt_bytes(sharded * (1 - 1 / n))} per rank")
    return (f"sharding over ranks (distributed.strategy=zero2 or fsdp) saves at most the model state "
            f"(~{fmt_bytes(sharded)} of gradients and optimizer state, as much again of parameters with fsdp), "
            f"against the {fmt_bytes(over)} over; use a smaller data.batch_size (changes the maths) or a machine "
            "with more memory")


def ranks_hint(smallest: Measured, strategies: set) -> str:
    """Under torchrun, when no plan fits: the strategy lever if it was left out, else more ranks."""
    if len(strategies) == 1 and smallest.candidate.strategy != "fsdp":
        return ("add shard to memory.budget_levers (ZeRO-2 and FSDP shard the model state over the ranks), or use "
                "a smaller data.batch_size (changes the maths)")
    return (f"more ranks than {smallest.candidate.ranks} shard the model state further; or use a smaller "
            "data.batch_size (changes the maths) or machines with more memory")


def none_fits_line(s: Search, batch: int) -> str:
    smallest = min(s.measured, key=lambda m: m.top)
    hint = (shard_hint(smallest, s.usable, s.state_bytes) if smallest.candidate.strategy is None
            else ranks_hint(smallest, {m.candidate.strategy for m in s.measured}))
    return (f"memory.budget={fmt_bytes(s.budget)}: no plan fits (usable {fmt_bytes(s.usable)} with "
            f"memory.budget_margin={s.margin:g}); the smallest peak measured was {fmt_bytes(smallest.top)} "
            f"({smallest.candidate.describe(batch)}); {hint}")


def format_search(s: Search, batch: int) -> str:
    w = max([62] + [len(m.candidate.describe(batch)) for m in s.measured])
    lines = [f"memory budget {fmt_bytes(s.budget)} (usable {fmt_bytes(s.usable)}, margin {s.margin:g}): "
             f"{len(s.measured)} plan(s) measured in {s.seconds:.1f} s",
             f"  {'plan':<{w}} {'peak':>10} {'+eval':>10} {'predicted':>10} {'s/step':>8} {'CPU-s':>7}"]
    front = {id(m) for m in pareto(s.measured)}
    for m in s.measured:
        mark = "*" if m is s.chosen else "p" if id(m) in front else " "
        pred = fmt_bytes(m.predicted_bytes) if m.predicted_bytes else "-"
        ev = fmt_bytes(m.eval_peak_bytes) if m.eval_peak_bytes else "-"
        lines.append(f"{mark} {m.candidate.describe(batch):<{w}} {fmt_bytes(m.peak_bytes):>10} {ev:>10} {pred:>10} "
                     f"{m.step_seconds:8.2f} {m.cpu_seconds if m.cpu_seconds is not None else float('nan'):7.2f}"
                     f"{'' if fits(m, s.usable) else '  over'}")
    if s.chosen:
        lines.append(f"pick: {s.chosen.candidate.describe(batch)} (peak {fmt_bytes(s.chosen.top)}, "
                     f"{s.chosen.step_seconds:.2f} s/step)   [* pick, p Pareto front: peak vs step time"
                     f"{' (CPU-s)' if s.chosen.cpu_seconds is not None else ''}]")
        second = runner_up(s)
        if second is not None:
            lines.append(f"runner-up: {second.candidate.describe(batch)}: {why_not(second, s.chosen, s.usable)}")
    else:
        lines.append(none_fits_line(s, batch))
    return "\n".join(lines)


# ---------------------------------------------------------------- the run folder


def read_record(*folders: Optional[Path]) -> Optional[dict]:
    """The first memory_plan.json among `folders` (the run folder; a resumed checkpoint's run folder)."""
    for folder in folders:
        p = Path(folder) / PLAN_FILE if folder is not None else None
        if p is not None and p.is_file():
            try:
                return safefile.read_json(p, "memory plan", 64 * safefile.MiB, fix="delete it to measure the plans again")
            except OSError as exc:
                raise ConfigError(f"{p}: cannot be read ({exc}); delete it to measure the plans again") from None
    return None


def names_modules(cfg) -> bool:
    """The user's `memory.activation_checkpointing` is a list of modules (not off/all/every_n)."""
    return hasattr(cfg.memory.activation_checkpointing, "modules")


def applied(cfg, c: Candidate):
    """`cfg` with the candidate's checkpointing, policy, offload, chunked loss, optimizer offload,
    evaluation batch, precision and strategy (its micro-batch count goes in the counters)."""
    d = cfg.to_dict()
    d["memory"]["activation_checkpointing"] = c.ac_spec(cfg.memory.activation_checkpointing.model_dump()
                                                        if hasattr(cfg.memory.activation_checkpointing, "model_dump")
                                                        else cfg.memory.activation_checkpointing)
    d["memory"].update(checkpoint_policy=c.policy, activation_offload=c.offload, offload_blocks=c.offload_blocks)
    if c.chunked:  # a lever the plan pulls; off in the plan: as the user configured it
        d["memory"]["chunked_loss"] = "on"
    if c.optim_offload:
        d["memory"]["optimizer_offload"] = "on"
    if c.eval_batch is not None:
        d["memory"]["eval_batch_size"] = c.eval_batch
    if c.strategy is not None:  # zero2 is read as fsdp with reshard_after_forward=false (config/run.py)
        d["distributed"]["strategy"] = c.strategy
        if c.strategy == "fsdp":
            d["distributed"]["fsdp"]["reshard_after_forward"] = True
    d["precision"] = c.precision
    try:
        return type(cfg).model_validate(d)
    except ValueError as exc:  # pydantic's ValidationError: the user's settings refuse this plan's strategy or
        # lever (chunked_loss=on under ZeRO-3); a ConfigError, so a strategy's search leaves it out in one line
        why = next((e.get("msg", "") for e in getattr(exc, "errors", lambda: [])()), str(exc)).removeprefix("Value error, ")
        raise ConfigError(f"the plan '{c.key}' is refused by the config: {why}") from None


def log_choice(s: Search, batch: int) -> None:
    if s.chosen is None:
        return
    how = f"read from the run folder's {PLAN_FILE}, not measured again" if s.reused else f"chosen in {s.seconds:.1f} s"
    log.info(f"memory.budget={fmt_bytes(s.budget)}: {s.chosen.candidate.describe(batch)}, measured peak "
             f"{fmt_bytes(s.chosen.top)} (evaluation's included), {s.chosen.step_seconds:.2f} s/step ({how})")


def runner_up(s: Search) -> Optional[Measured]:
    """The plan that came closest: the fastest other plan that fits, else the fastest other one."""
    rest = [m for m in s.measured if m is not s.chosen]
    ok = [m for m in rest if fits(m, s.usable)]
    return min(ok or rest, key=lambda m: m.cost) if rest else None


def why_not(m: Measured, chosen: Measured, usable: float) -> str:
    """Why `m` lost to `chosen`, in the terms `choose` decided by."""
    if not fits(m, usable):
        return f"peak {fmt_bytes(m.top)} is over the usable {fmt_bytes(usable)}"
    ratio = m.cost / chosen.cost
    if ratio > 1 + TIE:
        return f"fits (peak {fmt_bytes(m.top)}) but its step costs {ratio:.2f}x the pick's"
    return (f"as fast within {TIE:.0%} ({ratio:.2f}x), and the tie goes to the fuller plan "
            f"(peak {fmt_bytes(m.top)} vs {fmt_bytes(chosen.top)}: less recomputed, offloaded or cut)")
