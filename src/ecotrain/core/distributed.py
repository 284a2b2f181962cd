"""Data parallelism on PyTorch's own engine, launched by torchrun: DDP, or FSDP2 (`fully_shard`).

`setup()` reads torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) and returns
a `Dist`; a single process gets the no-op base class, so the loop calls the same lines either way:
`dist.grad_sync(model, last)` around each micro-batch (no all-reduce before the last one),
`dist.all_reduce_sum` for metrics, `dist.agreement()` to stop every rank at the same step,
`dist.is_main` for files, `dist.broadcast_object` for rank 0's decisions.

No collective runs on every step besides the gradient all-reduce itself. Stop requests that one rank
alone may see (a signal, a non-finite loss) are agreed by `Agreement` at agreement steps: one small
all-reduce every `AGREE_SECONDS` of training (at most every `AGREE_MAX_STEPS` steps, at least every
step), on a schedule that every rank computes from the same all-reduced numbers, so all ranks call
the collective, and stop, at the same step. A signal therefore stops the job about AGREE_SECONDS
(plus one step) after it arrives, at one step on every rank.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time

import torch
from torch import nn

from ecotrain.base.errors import ConfigError, EcotrainError
from ecotrain.core.stallwatch import StallWatch, nccl_timeout
from ecotrain.core.stepplan import step_batch_size

_NULL = contextlib.nullcontext()

AGREE_SECONDS = 0.5  # training time between two agreements (see Agreement)
AGREE_MAX_STEPS = 100  # and never more steps than this between two agreements


class Dist:
    """One process: every collective is the identity."""

    strategy = "none"
    rank, world_size, local_rank = 0, 1, 0
    is_main = True

    def grad_sync(self, model: nn.Module, last: bool):
        return _NULL

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def gather_objects(self, obj) -> list:
        return [obj]

    _agreement: "Agreement | None" = None

    def agreement(self) -> "Agreement":
        """This run's stop agreement, one per Dist, shared by every callback that stops all ranks."""
        if self._agreement is None:
            self._agreement = Agreement(self)
        return self._agreement

    def broadcast_object(self, obj):
        """Rank 0's `obj` on every rank (a picklable object: a run folder's path, a timestamp)."""
        return obj

    def from_main(self, obj):
        """Rank 0's `obj` on every rank once rank 0's own long work made it (memory.budget's plan): the
        others wait on the CPU, up to distributed.rank0_timeout_seconds, as at `barrier`."""
        return obj

    def wrap(self, model: nn.Module, cfg) -> nn.Module:
        return model

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model

    def full_state_dict(self, model: nn.Module) -> dict:
        return self.unwrap(model).state_dict()

    def eval_view(self, model: nn.Module, source):
        """(model, source, dist-to-reduce-with) for evaluating `source` on this rank."""
        return model, source, None

    def barrier(self) -> None:
        """Every rank waits here for the others (rank 0's own work: distributed.rank0_timeout_seconds)."""

    def shutdown(self) -> None: ...

    def mark(self, step: int) -> None:
        """The training thread got past `step`'s collectives' queueing (the stall watch, CUDA only)."""

    def stop_watch(self) -> None: ...

    def checkpoint_group(self):
        """A process group of its own for background checkpoint writes (None: one process)."""
        return None


class TorchDist(Dist):
    def __init__(self, strategy: str, device: torch.device, timeout_s: float, rank0_timeout_s: float = 3600):
        import torch.distributed as td

        self.td, self.strategy, self.device = td, strategy, device
        # on CUDA both: FSDP's CPU offload clips and checks for inf on CPU DTensors, which NCCL cannot reduce
        backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
        self.rank, self.world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.is_main = self.rank == 0
        if device.type == "cuda":
            torch.cuda.set_device(self.local_rank)
        self._watch, self._step = None, 0
        if device.type == "cuda":  # one line before NCCL's watchdog aborts the process (stallwatch.py)
            self._watch = StallWatch(timeout_s, self.rank, _recorded_event,
                                     prepare=lambda: torch.cuda.set_device(self.local_rank))
            timeout_s = nccl_timeout(timeout_s)
        if not td.is_initialized():  # a second fit() in the same process reuses the group
            timeout = datetime.timedelta(seconds=timeout_s)
            td.init_process_group(backend, timeout=timeout, **attempt_store(td, self.rank, self.world_size, timeout))
        # barriers on a gloo group of their own: ranks waiting for rank 0's work (a checkpoint write, the
        # final files) wait on the CPU for up to rank0_timeout_s, with no collective pending that
        # timeout_s (or NCCL's watchdog, which aborts the process) would end
        self._barrier_group = td.new_group(backend="gloo", timeout=datetime.timedelta(seconds=rank0_timeout_s))

    def grad_sync(self, model, last):
        if last:
            return _NULL
        if self.strategy == "ddp":
            return model.no_sync()  # skip the gradient all-reduce on non-final micro-batches
        return _FsdpNoSync(model)

    def all_reduce_sum(self, t):
        t = t.clone()
        self.td.all_reduce(t, op=self.td.ReduceOp.SUM)
        self.mark(self._step)  # before the caller reads the sum (a host sync that a dead peer would hang)
        return t

    def gather_objects(self, obj):
        out = [None] * self.world_size
        self.td.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj):
        box = [obj if self.is_main else None]
        self.td.broadcast_object_list(box, src=0)
        return box[0]

    def from_main(self, obj):
        box = [obj if self.is_main else None]
        self.td.broadcast_object_list(box, src=0, group=self._barrier_group)
        return box[0]

    def wrap(self, model, cfg):
        if self.strategy == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP
            ids = [self.local_rank] if self.device.type == "cuda" else None
            return DDP(model, device_ids=ids)
        from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
        kw = {"reshard_after_forward": cfg.fsdp.reshard_after_forward}
        if cfg.fsdp.cpu_offload:
            kw["offload_policy"] = CPUOffloadPolicy()
        for block in shard_units(model):
            fully_shard(block, **kw)
        fully_shard(model, **kw)
        if not cfg.fsdp.reshard_after_forward:  # ZeRO-2: gathered parameters wait for a backward
            model.register_forward_hook(_reshard_without_backward)
            model._ecotrain_zero2 = True  # one_gather: an evaluation pass gathers once
        return model

    def unwrap(self, model):
        return model.module if self.strategy == "ddp" else model

    def full_state_dict(self, model):
        if self.strategy == "ddp":
            return model.module.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def eval_view(self, model, source):
        if self.strategy == "ddp":  # the bare module (no buffer broadcast) on this rank's shard, sums reduced
            if hasattr(source, "loader"):  # a user's loader: its DistributedSampler shards it (or each rank reads it all)
                return model.module, source, self
            from ecotrain.data import subset
            return model.module, subset(source, torch.arange(self.rank, len(source), self.world_size)), self
        return model, source, None  # FSDP: every forward is a collective, so every rank runs them all

    def barrier(self):
        self.td.barrier(group=self._barrier_group)

    _ckpt_group = None

    def checkpoint_group(self):
        # every rank creates it at the same (first background) save; gloo: the writes stage on CPU
        if self._ckpt_group is None:
            self._ckpt_group = self.td.new_group(backend="gloo")
        return self._ckpt_group

    def mark(self, step):
        if self._watch is not None:
            self._step = step
            self._watch.mark(step)

    def stop_watch(self):
        if self._watch is not None:
            self._watch.stop()
            self._watch = None

    def shutdown(self):
        # Wait for every rank, but leave the group up: destroying gloo's group as a worker ends made
        # about 1 run in 20 abort in C++ ("terminate called without an active exception") after all
        # files were written. The CLI ends a torchrun worker with os._exit instead (cli.main).
        self.stop_watch()
        if self.td.is_initialized():
            self.barrier()


def _recorded_event():
    event = torch.cuda.Event()
    event.record()  # on the current stream, behind the collectives queued before it
    return event


class Agreement:
    """Stop requests that one rank alone may see, acted on by every rank at the same step, without
    a collective per step.

    A callback calls `request(flag)` on the rank that saw something (a signal, a non-finite loss),
    and `poll(step)` at the end of every step on every rank. `poll` returns the empty set except at
    an agreement step, where one all-reduce of a small int64 tensor carries every rank's flags and
    its measured microseconds per step; it returns the flags requested on any rank since the last
    agreement: the same set, at the same step, on every rank. The next agreement step follows from
    the all-reduced numbers alone (the same integers on every rank): about AGREE_SECONDS of training
    later, at least 1 and at most AGREE_MAX_STEPS steps. The first poll is an agreement step.
    With one process every step is an agreement step and nothing is communicated.
    """

    FLAGS = ("preempted", "nonfinite_loss", "checkpoint")

    def __init__(self, dist: Dist):
        self.dist = dist
        self.requested: set[str] = set()
        self.next_step: int | None = None  # None: the next poll agrees
        self._mark: tuple[int, float] | None = None  # (step, clock) at the latest agreement
        self._last: tuple[int, frozenset] = (-1, frozenset())  # the latest poll: idempotent within a step

    def request(self, flag: str) -> None:
        if flag not in self.FLAGS:
            raise ValueError(f"unknown agreement flag {flag!r}; known: {self.FLAGS}")
        self.requested.add(flag)

    def poll(self, step: int) -> frozenset:
        if self._last[0] == step:
            return self._last[1]
        agreed = frozenset()
        if self.dist.world_size == 1:
            agreed, self.requested = frozenset(self.requested), set()
        elif self.next_step is None or step >= self.next_step:
            agreed = self._agree(step)
        self._last = (step, agreed)
        return agreed

    def _agree(self, step: int) -> frozenset:
        us = 0
        if self._mark is not None and step > self._mark[0]:
            us = max(1, int((time.perf_counter() - self._mark[1]) * 1e6 / (step - self._mark[0])))
        flags = [int(f in self.requested) for f in self.FLAGS]
        t = torch.tensor([*flags, us], dtype=torch.int64, device=getattr(self.dist, "device", None))
        t = self.dist.all_reduce_sum(t).tolist()  # integers: an exact sum, the same on every rank
        counts, us_sum = t[:-1], t[-1]
        interval = 1 if us_sum == 0 else int(AGREE_SECONDS * 1e6) * self.dist.world_size // us_sum
        self.next_step = step + max(1, min(AGREE_MAX_STEPS, interval))
        self._mark = (step, time.perf_counter())
        self.requested = set()
        return frozenset(f for f, c in zip(self.FLAGS, counts) if c)


class _FsdpNoSync:
    def __init__(self, model):
        self.model = model

    def __enter__(self):
        self.model.set_requires_gradient_sync(False)  # FSDP2's no_sync: keep unsharded grads local

    def __exit__(self, *exc):
        self.model.set_requires_gradient_sync(True)


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The blocks FSDP shards one by one: the children of every ModuleList/Sequential that hold
    parameters (transformer blocks, MLP layers); the root takes whatever is left."""
    units: list[nn.Module] = []

    def visit(m: nn.Module) -> None:
        for c in m.children():
            if isinstance(m, (nn.ModuleList, nn.Sequential)) and any(True for _ in c.parameters()):
                units.append(c)  # outermost blocks only: a block's own insides are sharded with it
            else:
                visit(c)

    visit(model)
    return units


def attempt_store(td, rank: int, world: int, timeout) -> dict:
    """init_process_group's store for a worker that torchrun's elastic agent restarted.

    With the c10d rendezvous, the agent's TCPStore is shared with the workers and outlives every
    restart, while the process group's keys (the gloo/NCCL peers' addresses) carry no restart number:
    a restarted worker may read a peer address of the attempt before, whose socket is gone, and the
    group fails to connect (pytorch/pytorch#135712, #167288). Each attempt's keys go under their own
    prefix. The restart count is the same on every worker of one agent; with several agents it can
    differ (torch's own caveat), so there the launch files set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1,
    which gives every attempt a fresh store instead (docs/distributed.md)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or os.environ.get("GROUP_WORLD_SIZE", "1") != "1":
        return {}
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    agent = td.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                        timeout=timeout)
    return {"store": td.PrefixStore(f"ecotrain/attempt-{attempt}", agent), "rank": rank, "world_size": world}


def micro_batches_for(cfg, world: int) -> int | None:
    """`loop.micro_batch_size`: the micro-batches each rank's share of a step is cut into at this
    world size (4 ranks x 1 -> 2 ranks x 2 for one global batch); None when it is not set."""
    size = cfg.loop.micro_batch_size
    if size is None:
        return None
    step = step_batch_size(cfg)
    if step % (world * size):
        raise ConfigError(f"loop.micro_batch_size: {size} does not divide a rank's share of the step "
                          f"({step} samples over {world} ranks = {step / world:g}); choose a size that divides "
                          f"{step // world if step % world == 0 else step}")
    return step // (world * size)


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def setup(cfg, device: torch.device) -> Dist:
    strategy = cfg.distributed.strategy
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if strategy == "none":
        if world > 1:
            raise ConfigError(f"distributed.strategy: none, but torchrun started {world} processes; "
                              "set distributed.strategy=ddp or fsdp")
        return Dist()
    if not under_torchrun():
        raise ConfigError(f"distributed.strategy={strategy}: needs torchrun, e.g. "
                          f"`torchrun --nproc-per-node 2 -m ecotrain fit RECIPE distributed.strategy={strategy}`")
    if cfg.data.batch_size % world:
        raise ConfigError(f"data.batch_size: {cfg.data.batch_size} (the global batch) is not divisible by the "
                          f"world size {world}; use a multiple of {world}")
    return TorchDist(strategy, device, cfg.distributed.timeout_seconds, cfg.distributed.rank0_timeout_seconds)


def collective_error(exc: BaseException, dist: Dist) -> EcotrainError | None:
    """A collective that timed out or lost its peer: one clear line instead of a gloo traceback."""
    text = str(exc)
    if dist.world_size > 1 and any(w in text.lower() for w in ("timed out", "timeout", "connection", "peer", "closed")):
        return EcotrainError(f"rank {dist.rank}: lost contact with the other ranks ({text.splitlines()[0][:160]}); "
                             "another rank probably died. Restart the job with --resume auto")
    return None


class ShardedSampler:
    """Rank `r`'s share of each full global batch of an EpochSampler or BucketSampler: a contiguous
    slice of `batch/world` indices, so every rank steps on an equal, non-empty share (DDP averages
    gradients, which is only the global mean for equal shares). The short global batch is dropped
    wherever it falls: last in an EpochSampler's order, anywhere in a BucketSampler's shuffled one.
    Positions count full batches only, so `batches(epoch, start)` resumes on the same shards."""

    def __init__(self, base, rank: int, world: int):
        self.base, self.rank, self.world = base, rank, world
        self.per_rank = base.batch_size // world

    def __len__(self) -> int:  # full batches: every batch of both base samplers is full but one
        return self.base.n // self.base.batch_size

    def batches(self, epoch: int, start: int = 0):
        lo, hi, size = self.rank * self.per_rank, (self.rank + 1) * self.per_rank, self.base.batch_size
        if getattr(self.base, "short_batch_last", False):  # full batch b is batch b: seek, as on one process
            for idx in self.base.batches(epoch, start):
                if len(idx) == size:
                    yield idx[lo:hi]
            return
        full = (idx for idx in self.base.batches(epoch) if len(idx) == size)
        for b, idx in enumerate(full):
            if b >= start:
                yield idx[lo:hi]


def _reshard_without_backward(model, _args, _out) -> None:
    """ZeRO-2 (`reshard_after_forward=False`): a forward with no backward to follow (evaluation) would
    leave every block's parameters gathered until the next training step, the memory ZeRO-2 spares
    between steps; shard them again (`FSDPModule.reshard`), as a backward would have. Inside an
    evaluation pass (`one_gather`) that waits for the pass's end."""
    if not torch.is_grad_enabled() and not getattr(model, "_ecotrain_in_pass", False):
        _reshard(model)


def _reshard(model) -> None:
    for m in model.modules():
        if hasattr(m, "reshard"):
            m.reshard()


@contextlib.contextmanager
def one_gather(model):
    """An evaluation pass over a ZeRO-2 model: the parameters the first batch gathers stay gathered
    until the pass ends, then are sharded again once. Sharding them after every batch made each batch
    gather the whole model again over the network (a 34M-parameter MLP on 2 gloo ranks: ~40 s of
    evaluation for 3 training steps); training's own forward keeps them gathered as long, so the
    pass's peak is no higher. Any other model: nothing to do."""
    if not getattr(model, "_ecotrain_zero2", False):
        yield
        return
    model._ecotrain_in_pass = True
    try:
        yield
    finally:
        model._ecotrain_in_pass = False
        _reshard(model)
