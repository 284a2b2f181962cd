"""`memory.budget` under torchrun: the plans are measured by N processes, and the strategy is a lever.

A plan's peak under torchrun is per rank: each measurement starts a process group of N measuring
workers on this machine (assembly/memory_worker.py, `group_env`: gloo on CPU, nccl on CUDA, a free port of
its own) and the plan's peak is the largest rank's (measure.run_job). With `shard` in
`memory.budget_levers` the plans combine the other levers with the strategy, from the least sharded:
DDP (everything whole on every rank), ZeRO-2 (gradients and optimizer state sharded, parameters
whole: FSDP2 with reshard_after_forward=False) and FSDP (parameters sharded too, gathered block by
block). Each strategy gets its own search (planner.search: its baseline calibrates its predictions,
since what a rank holds differs per strategy), and the choice is made over every plan measured: the
fastest that fits. Once a strategy's least constrained plan fits, more sharding would only add
communication, so the strategies after it are not measured. Without the lever the configured
strategy is the only one.

Rank 0 searches; every rank trains with the plan it sends (measure.for_run, `Dist.from_main`).
"""

from __future__ import annotations

import os
import socket
from typing import Callable, Optional, Sequence

from torch import nn

from ecotrain.core.distributed import shard_units
from ecotrain.base.errors import ConfigError
from ecotrain.base.log import log
from ecotrain.memory.planner import STRATEGY_TEXT, Search, choose

class Refused(ConfigError):
    """The config refuses a strategy: its least constrained plan could not start (a method without FSDP support)."""


STRATEGIES = tuple(STRATEGY_TEXT)  # ddp, zero2, fsdp: least sharded first
# what torchrun's agent gives its workers: a measuring worker is no worker of that agent
AGENT_ENV = ("GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "LOCAL_WORLD_SIZE",
             "LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def configured(cfg) -> str:
    """The config's own strategy, by its lever name (zero2 is fsdp with reshard_after_forward=false)."""
    d = cfg.distributed
    if d.strategy == "fsdp" and not d.fsdp.reshard_after_forward:
        return "zero2"
    return d.strategy


def strategies_for(cfg, world: int, pinned: Optional[str] = None) -> list[Optional[str]]:
    """The strategies a budget measures at `world` ranks: none in one process; `pinned` (a resume's
    recorded one: the checkpoints' format); all three with the `shard` lever; else the configured one."""
    if world == 1:
        return [None]
    if pinned is not None:
        return [pinned]
    return list(STRATEGIES) if "shard" in cfg.memory.budget_levers else [configured(cfg)]


def search_strategies(strategies: Sequence[str], own: str,
                      search_one: Callable[[str, bool, Optional[float]], Search]) -> Search:
    """One search per strategy, least sharded first (`search_one(strategy, closest, beat)`), combined:
    every plan measured, the fastest that fits chosen. `beat`: the cost of the fastest plan that fits
    so far (planner.search measures only the baseline of a strategy slower than that). A strategy other than the configured `own` that the
    config refuses (`Refused`: a method that does not support FSDP) is left out with one line.
    Only the last search measures its most frugal plan when nothing fits (how close it came)."""
    parts: list[Search] = []
    for i, strategy in enumerate(strategies):
        best = choose([m for s in parts for m in s.measured], parts[0].usable) if parts else None
        try:
            found = search_one(strategy, i == len(strategies) - 1, best.cost if best is not None else None)
        except Refused as exc:
            if strategy == own or (i == len(strategies) - 1 and not parts):
                raise
            log.info(f"memory.budget: no {STRATEGY_TEXT[strategy]} plans ({exc})")
            continue
        parts.append(found)
        if found.chosen is not None and found.chosen is found.measured[0]:
            break  # its least constrained plan fits: more sharding only adds communication
    first = parts[0]
    measured = [m for s in parts for m in s.measured]
    return Search(first.budget, first.margin, measured, choose(measured, first.usable), sum(s.seconds for s in parts),
                  first.state_bytes, optim_bytes=first.optim_bytes, ranks=first.ranks)


def strategy_bytes(model: nn.Module, strategy: Optional[str]) -> int:
    """The bytes a rank's strategy holds during forward and backward beside its own model state, what a
    plan's prediction adds to it (planner.held): DDP its gradient buckets (one more copy of the
    gradients); ZeRO-2 every parameter gathered whole (from forward to backward) and one block's whole
    gradients before their reduce-scatter; FSDP the root's own parameters, two blocks' (one gathered,
    the next prefetched) and one block's gradients."""
    def size(params) -> int:
        return sum(p.nelement() * p.element_size() for p in params)  # a DTensor's whole size

    if strategy == "ddp":
        return size(p for p in model.parameters() if p.requires_grad)
    if strategy not in ("zero2", "fsdp"):
        return 0
    units = [size(u.parameters()) for u in shard_units(model)]
    block = max(units, default=0)
    if strategy == "zero2":
        return size(model.parameters()) + block
    return size(model.parameters()) - sum(units) + 3 * block


def one_machine(world: int) -> None:
    """The measuring groups run on this machine: a job over several nodes is refused, in one line."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if local != world:
        raise ConfigError(f"memory.budget: plans are measured by {world} processes on one machine, and this job has "
                          f"{local} of its {world} ranks here; set the levers by hand (`ecotrain plan RECIPE "
                          "--budget ...` shows them) or run on one node")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def group_env(env: dict, rank: int, world: int, port: int) -> dict:
    """`env` for rank `rank` of a measuring group of `world` processes on this machine, not torchrun's."""
    out = {k: v for k, v in env.items() if k not in AGENT_ENV and not k.startswith("TORCHELASTIC_")}
    return {**out, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
