"""The loop's batch feed: the sampler's index batches turned into `(samples, batch)`, in the training
process (`data.workers: 0`, the fast path for in-memory data) or by a `torch.utils.data.DataLoader`
whose workers run `source.take` ahead of the loop.

The DataLoader is fed the sampler's batches as its batch sampler, so the order is still a function
of (seed, epoch) and a resume starts at the saved batch index: the position needs no loader state
(why not torchdata's StatefulDataLoader: docs/data.md). Workers fetch a batch with the items
seeded by (seed, epoch, sample index) (`sources.seeded`), so 0, 1 or 4 workers give the same
batches. The feed also owns two figures: the seconds the loop waited for data (a `Counters`
field, summed over resumed segments) and the throughput shown by the progress bar, with one
"input-bound" warning when the wait is too large a share of the time.
"""

from __future__ import annotations

import functools
import os
import signal
import time

import torch

from ecotrain.core.batch import MicroBatches, batch_size, describe as describe_batch, tree_map
from ecotrain.base.objects import describe
from ecotrain.data.items import item_shapes
from ecotrain.data import sources
from ecotrain.data.sources import LoaderSource, MapSource, seeded
from ecotrain.base.errors import DataError, EcotrainError
from ecotrain.base.log import log
from ecotrain.base.orphans import die_with_parent

WINDOW_BATCHES = 64  # batches per throughput window (progress bar, input-bound check)
WARMUP_WINDOWS = 1  # the first window holds worker start-up and first reads: not judged
WORKER_WORTH_SECONDS = 0.002  # a batch's read time below which a loader worker costs more than it saves


def pins(setting, device) -> bool:
    """`data.pin_memory` for this run: page-locked batches only for a CUDA device; `auto` is on there."""
    return getattr(device, "type", None) == "cuda" and setting in (True, "auto")


class Feed:
    def __init__(self, state, sampler, source):
        self.state, self.sampler, self.source = state, sampler, source
        self.cfg, self.seed = state.config.data, state.config.seed
        self.pin = pins(self.cfg.pin_memory, state.device)
        self.loader = None
        self._iter = None
        self._batches = _EpochBatches(sampler, self.seed)
        self._window_start = time.perf_counter()  # of the current throughput window
        self._windows = 0
        self._carry = (0.0, 0, 0)  # the current window's wait, samples and batches so far
        self.warned = False
        self.warned_skip = False
        self.last_items = None  # the sample indices of the batch in the step (errors name them)
        if isinstance(source, LoaderSource) and not source.stateful and (why := sources.replay_warning(source.loader)):
            log.warning(why)  # at the start, not after a resume that already went wrong

    def epoch(self, epoch: int, start: int):
        """`(samples, batch)` for batches `start, start+1, ...` of `epoch`."""
        if isinstance(self.source, LoaderSource):
            return self._from_loader(epoch, start)
        if self.cfg.workers == 0:
            return self._inline(epoch, start)
        return self._workers(epoch, start)

    def _inline(self, epoch: int, start: int):
        clock, take = time.perf_counter, seeded(self.source, self.seed, epoch).take  # a Dataset's items seeded
        skipping = self.cfg.on_bad_shard == "skip"  # damaged samples may leave a batch short
        wait, samples, count = self._carry  # a window spans epochs: an epoch may be shorter than one
        try:
            for idx in self.sampler.batches(epoch, start):
                t = clock()
                self.last_items = idx
                try:
                    batch = take(idx)
                except EcotrainError:
                    raise
                except Exception as exc:  # the user's __getitem__ or the collation of its items
                    raise self.failure(exc, None) from None
                if self.pin:  # else the loop's non_blocking copy of pageable memory waits for the GPU
                    batch = tree_map(lambda t: t.pin_memory(), batch)
                wait += clock() - t
                n = idx.shape[0]
                if skipping and (gone := sources.dropped(self.source)):
                    n -= gone
                    self.state.counters.skipped_samples += gone
                samples += n
                count += 1
                if count == WINDOW_BATCHES:  # the figures every window: no per-step bookkeeping
                    self._account(wait, samples, count)
                    wait, samples, count = 0.0, 0, 0
                yield n, batch
        finally:
            self._carry = (wait, samples, count)

    def _workers(self, epoch: int, start: int):
        if self.loader is None:
            self.loader = self._make_loader()
        if not self.cfg.persistent_workers:
            self._close_iter()  # a rollback or an early break left one open (persistent: iter() resets it)
        self._batches.epoch, self._batches.start = epoch, start
        clock = time.perf_counter
        wait, samples, count = self._carry
        self._iter = it = iter(self.loader)
        try:
            while True:
                t = clock()
                try:
                    idx, batch, gone = next(it)
                except StopIteration:
                    return
                except EcotrainError as exc:  # ours, from a worker: torch put the worker's traceback in its text
                    raise type(exc)(_last_line(exc).split(f"{type(exc).__name__}: ", 1)[-1]) from None
                except Exception as exc:  # the worker's exception, re-raised with its traceback as text
                    raise DataError(f"data: a loader worker failed reading a batch of epoch {epoch}: "
                                    f"{_last_line(exc)}") from None
                wait += clock() - t
                self.last_items = idx
                n = len(idx) - gone
                self.state.counters.skipped_samples += gone
                samples += n
                count += 1
                if count == WINDOW_BATCHES:
                    self._account(wait, samples, count)
                    wait, samples, count = 0.0, 0, 0
                yield n, batch
        finally:
            self._carry = (wait, samples, count)
            if not self.cfg.persistent_workers:
                self._close_iter()

    def _from_loader(self, epoch: int, start: int):
        """A user's loader: `loop.accumulate` of its batches make one step (MicroBatches). A stateful
        loader resumes mid-epoch by its own state (restored from the checkpoint); another one is
        re-read from the epoch's start with its generators rewound to that start (`begin_pass`), the
        trained batches skipped: exact for torch's samplers (said once, as information)."""
        src, group, clock = self.source, self.state.config.loop.accumulate, time.perf_counter
        wait, samples, count = self._carry
        it, by_state = src.begin_pass(start, epoch)
        self._iter = it
        try:
            if start and not by_state:
                if not self.warned_skip:
                    self.warned_skip = True
                    log.info(f"data: the DataLoader keeps no state, so resume re-reads epoch {epoch} from its "
                             f"start, its generators set back to that epoch's start, and skips the {start} "
                             "steps already trained")
                for _ in range(start * group):
                    if src.read(next, it, None) is None:
                        return
            src.resumed_by_state = False  # only the first pass after a restore starts mid-epoch by itself
            while True:
                t = clock()
                pieces: list = []
                try:
                    while len(pieces) < group:
                        pieces.append(src.read(next, it))
                except StopIteration:
                    if not pieces:
                        return
                except EcotrainError:
                    raise
                except Exception as exc:
                    raise DataError(f"data: the DataLoader failed reading a batch of epoch {epoch}: "
                                    f"{_last_line(exc)}") from None
                n = sum(batch_size(p) for p in pieces)
                wait += clock() - t
                samples += n
                count += 1
                if count == WINDOW_BATCHES:
                    self._account(wait, samples, count)
                    wait, samples, count = 0.0, 0, 0
                yield n, (pieces[0] if group == 1 else MicroBatches(pieces))
                if len(pieces) < group:  # the stream ended inside this step's group
                    return
        finally:
            self._carry = (wait, samples, count)
            self._iter = None

    def failure(self, exc: Exception, batch) -> Exception:
        """What to raise when the step failed on `batch` (None: reading it failed): a DataError when items of a Dataset differ
        in shape from item 0 (said with the items and shapes); else `exc` with a note naming the
        batch's shapes and its items."""
        items = None if self.last_items is None else [int(i) for i in self.last_items]
        if isinstance(self.source, MapSource) and items:
            try:
                first = item_shapes(self.source.ds[0])
                odd = next(((i, sh) for i in items if (sh := item_shapes(self.source.ds[i])) != first), None)
            except Exception:  # re-reading failed too: the note below still names the batch
                odd = None
            if odd is not None:
                what = "collating" if batch is None else "the model on"
                return DataError(f"data: item {odd[0]} of the Dataset holds {odd[1]} where item 0 holds {first} "
                                 f"({what} the batch holding it raised {type(exc).__name__}); make every "
                                 "item the same shape, or give a DataLoader whose collate_fn pads them")
        where = f"items {items[:8]}{' ...' if len(items) > 8 else ''} of the Dataset" if items else ""
        if batch is None:
            exc.add_note(f"on the batch of {where or 'the data'}, while reading it")
        else:
            exc.add_note(f"on the batch {describe_batch(batch)}{f' ({where})' if where else ''}")
        return exc

    def _make_loader(self):
        cfg = self.cfg
        return torch.utils.data.DataLoader(
            _TakeBatch(self.source, self.seed), batch_sampler=self._batches, collate_fn=_identity,
            num_workers=cfg.workers, prefetch_factor=cfg.prefetch, persistent_workers=cfg.persistent_workers,
            pin_memory=self.pin, worker_init_fn=functools.partial(_worker_init, parent=os.getpid()),
            generator=torch.Generator().manual_seed(self.seed))  # else the loader draws its seed from the global RNG

    def _account(self, wait: float, samples: int, batches: int) -> None:
        """One window's figures: the data-wait counter, the progress bar's field, the warning."""
        self.state.counters.data_wait_seconds += wait
        now = time.perf_counter()
        secs = max(now - self._window_start, 1e-9)
        share, rate = wait / secs, samples / secs
        self._windows += 1
        self.state.progress_fields["data"] = f"{rate:,.0f} samples/s, wait {share:.0%}"
        if input_bound(share, wait / max(batches, 1), self._windows, self.cfg.input_bound_share) and not self.warned:
            self.warned = True
            log.warning(f"input-bound: the loop waited for data {share:.0%} of the last {batches} steps "
                        f"(data.input_bound_share {self.cfg.input_bound_share:.0%}); raise data.workers "
                        f"(now {self.cfg.workers})")
        self._window_start = now

    def _close_iter(self) -> None:
        it, self._iter = self._iter, None
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()  # joins the workers now, not whenever the iterator is collected

    def close(self) -> None:
        """Stop every worker (end of training, preemption, an error); count the last window's wait."""
        self._close_iter()
        self.state.counters.data_wait_seconds += self._carry[0]
        self._carry = (0.0, 0, 0)
        if self.loader is not None:
            self.loader = None  # persistent workers: their iterator was the one closed above


class _EpochBatches:
    """The DataLoader's batch sampler: the sampler's batches of `epoch` from `start`, tagged with
    the epoch so that a worker seeds the items by it; set before each `iter(loader)`."""

    def __init__(self, sampler, seed: int):
        self.sampler, self.epoch, self.start = sampler, 0, 0

    def __len__(self) -> int:
        return len(self.sampler) - self.start

    def __iter__(self):
        epoch = self.epoch
        for idx in self.sampler.batches(epoch, self.start):
            # a list, not a tensor: a tensor crosses to a worker (and back) as a shared-memory file
            # descriptor, a socket handshake each way (4.7 ms apiece in the loop under cProfile)
            yield epoch, idx.tolist()


class _TakeBatch(torch.utils.data.Dataset):
    """What a worker runs: one `source.take` per batch (`__getitems__`), items seeded by epoch."""

    def __init__(self, source, seed: int):
        self.source, self.seed = source, seed

    def __len__(self) -> int:
        return len(self.source)

    def __getitems__(self, tagged):
        epoch, idx = tagged
        batch = seeded(self.source, self.seed, epoch).take(torch.as_tensor(idx))
        # idx goes back as the list it came as (see _EpochBatches); with it the damaged samples left out
        return idx, batch, sources.dropped(self.source)

    def __getitem__(self, i):  # the DataLoader only calls __getitems__; here for the Dataset protocol
        return self.__getitems__((0, [i]))


def input_bound(share: float, wait_per_batch: float, windows: int, threshold: float) -> bool:
    """Whether one window's measured figures call for the "raise data.workers" hint: past the warm-up
    windows, the loop waited more than `threshold` of the time, and reading a batch costs more than a
    worker's hand-over of it (an in-memory Dataset's cheap items would only slow down). A function of
    the figures alone, so its promise is tested without timing anything (tests/unit/test_loader.py)."""
    return windows > WARMUP_WINDOWS and share > threshold and wait_per_batch >= WORKER_WORTH_SECONDS


def _identity(batch):
    return batch


def _worker_init(_worker_id: int, parent: int | None = None) -> None:
    # the training process handles SIGTERM/SIGINT (checkpoint, then shut the workers down); a worker
    # killed by a signal sent to the whole process group would fail the loader instead
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Linux: the kernel kills this worker when the training process dies (SIGKILL, OOM killer), so no
    # orphan outlives it (torch's own watchdog notices only after seconds); `parent` is that process
    die_with_parent(signal.SIGKILL, parent)


def _last_line(exc: BaseException) -> str:
    """A worker's exception carries the worker's traceback in its message: keep its last line."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    if len(lines) > 1:
        return lines[-1][:300]
    return describe(exc)
