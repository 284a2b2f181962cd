"""The training loop and the evaluation loop, one screen each. Every hook call is a visible line.

A "batch" from the sampler is the effective batch of one optimizer step; `train_step` cuts it
into `loop.accumulate` micro-batches and normalises the loss by the whole batch's unit count, so
accumulation is exactly one big batch.
"""

from __future__ import annotations

import gc
import time

import torch

from ecotrain.base import startup
from ecotrain.core.batch import MicroBatches, iter_batches, split, to_device
from ecotrain.core.distributed import one_gather
from ecotrain.base.errors import EcotrainError
from ecotrain.core.levers import is_oom, recover_from_oom
from ecotrain.core.metrics import SumMetric, scalar
from ecotrain.core.task import unit_count, unit_counts


def micro_batches(batch, n_micro: int) -> list:
    if isinstance(batch, MicroBatches):  # a loader's batches; OOM recovery cuts each piece further
        if n_micro <= len(batch):
            return batch
        return [p for piece in batch for p in split(piece, -(-n_micro // len(batch)))]
    if n_micro == 1:
        return [batch]
    return split(batch, n_micro)  # batch.py: any structure, cut along the first dimension


def backward_micro_batches(state, batch, n_micro: int) -> torch.Tensor:
    """Forward and backward of one effective batch in `n_micro` pieces; returns the summed loss
    (and leaves the summed named loss terms in `state.loss_parts` when methods add any)."""
    model, prec, dist, objective = state.model, state.precision, state.dist, state.objective
    if n_micro == 1 and not isinstance(batch, MicroBatches):  # one forward and backward; DDP/FSDP sync as usual
        with prec.autocast():
            loss, state.loss_parts = objective(model, batch, None, state)
        prec.backward(loss)
        return loss.detach()
    pieces = micro_batches(batch, n_micro)
    counts = unit_counts(state.task, pieces)  # every piece's token count in one host sync
    total_units = sum(counts)
    loss_sum = parts_sum = None
    halves = HalfSums(model, len(pieces)) if dist.strategy == "ddp" and dist.world_size == 1 else None
    for i, (piece, n) in enumerate(zip(pieces, counts)):
        if halves is not None:
            halves.before(i)
        with dist.grad_sync(model, last=i == len(pieces) - 1):  # DDP/FSDP: all-reduce on the last only
            with prec.autocast():
                loss, parts = objective(model, piece, total_units, state, n)
            prec.backward(loss)
        loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
        if parts is not None:
            parts_sum = parts if parts_sum is None else {k: parts_sum[k] + v for k, v in parts.items()}
    if halves is not None:
        halves.finish()
    state.loss_parts = parts_sum
    return loss_sum


class HalfSums:
    """A DDP run on one rank sums its micro-batch gradients as 2 ranks do: each half in order, then
    the two halves (a 2-rank all-reduce is one addition, a + b). A run resized between 2 ranks and 1
    then takes bit-for-bit the steps it takes on 2 (loop.micro_batch_size), where summing all pieces
    in one row rounds differently, and a ReLU at its kink turns that into a different run
    (docs/distributed.md). Costs one copy of the gradients, only on a DDP run with one rank."""

    def __init__(self, model, n_pieces: int):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.split = n_pieces // 2 if n_pieces >= 4 and n_pieces % 2 == 0 else None  # 2 pieces: a + b already
        self.first = None

    def before(self, i: int) -> None:
        if i == self.split:  # the first half is summed: set it aside, the second starts from zero
            self.first = [p.grad for p in self.params]
            for p in self.params:
                p.grad = None

    def finish(self) -> None:
        if self.first is None:
            return
        for p, a in zip(self.params, self.first):
            if a is not None:
                p.grad = a if p.grad is None else a.add_(p.grad)
        self.first = None


def train_step(state, batch, cbs) -> None:
    model, opt, prec, loop_cfg = state.model, state.optimizer, state.precision, state.config.loop
    n_micro = state.plan.micro_batches  # stepplan.py: raised by OOM recovery
    if state.objective.batch_methods:
        batch = state.objective.prepare(state, batch)  # methods' batch changes (resize, selective backprop)
    try:
        if n_micro == 1 and state.objective.plain and prec.dtype is None:
            # fp32, the task loss alone, one micro-batch: a hand-written loop's step, written as one
            # (each layer of calls between torch ops costs ~1% of a small model's step on CPU)
            objective = state.objective
            task = objective.task
            if objective.xy and type(batch) is tuple and len(batch) == 2 and type(batch[0]) is torch.Tensor:
                # (x, y): model(x), no forward() layer
                loss = task.loss(model(batch[0]), batch)
            else:
                loss = task.loss(task.forward(model, batch), batch)
            loss.backward()
            state.loss, state.loss_parts = loss.detach(), None
        else:
            state.loss = backward_micro_batches(state, batch, n_micro)
    except (torch.OutOfMemoryError, RuntimeError) as exc:  # retry in smaller micro-batches, same maths (core/levers.py)
        if not is_oom(exc):  # cuBLAS/cuDNN allocation failures are OOM too; any other error is not
            raise
        loss = None  # the failed graph and its activations go before the retry, not after it
        state.loss = recover_from_oom(state, batch, n_micro, exc, backward_micro_batches)
    state.dist.mark(state.step)  # CUDA under torchrun: the stall watch's event, behind the gradients' collectives
    state.skip_step = False
    cbs.on_after_backward(state)  # the divergence guard may set skip_step here
    optimizer_step(model, opt, prec, loop_cfg.grad_clip, skip=state.skip_step)
    state.dist.mark(state.step)  # ... and behind clipping's (FSDP: an all-reduce of the norm)


def optimizer_step(model, opt, prec, grad_clip, skip: bool = False) -> None:
    """The one optimizer step (the loop's and lr-find's): clip the true gradients (unscaled first),
    step through the precision's scaler, and zero the gradients; `skip`: zero them only."""
    if not skip:
        if grad_clip:
            prec.unscale(opt)  # clip true gradients, not scaled ones
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        prec.step(opt)
    opt.zero_grad(set_to_none=True)


def set_train_mode(state) -> None:
    """`model.train()`, then the methods' `train_mode` (a BatchNorm freeze must survive it)."""
    state.model.train()
    if state.methods:
        state.methods.train_mode(state.model)


def train(state, feed, cbs, augment, evaluate_fn) -> None:
    """Run until a budget is spent or a callback asks to stop. Resumes from `state`'s position. `feed`
    (data/loader.py's Feed, built by the assembly) yields each epoch's batches from a position."""
    cfg = state.config.loop
    per_step_schedule = state.config.schedule.interval == "step"
    on_device = state.device.type != "cpu"
    augment = augment if augment.active else None
    cbs.on_fit_start(state)
    startup.resume()  # the program's start-up ran without the collector (startup.py): the loop's from here
    gc_was_enabled = gc.isenabled()
    gc.collect(1)  # the young generations only: a full collection costs ~0.5 s after importing torch
    gc.freeze()  # set-up objects (modules, imports) leave the GC's scans until the loop ends
    gc.disable()  # tensors die by refcount; automatic collections mid-step cost ~5% on small models
    state.segment_start = time.perf_counter()
    try:
        while not state.should_stop:
            state.rewound = False
            if cfg.max_steps and state.step >= cfg.max_steps:  # checked first: a resumed run may be done
                state.stop("max_steps")
                break
            if cfg.max_epochs and state.epoch >= cfg.max_epochs:
                state.stop("max_epochs")
                break
            cbs.on_epoch_start(state)
            set_train_mode(state)
            for n, batch in feed.epoch(state.epoch, state.batch_in_epoch):  # data/loader.py: in-process or workers
                cbs.on_step_start(state)
                if augment:
                    batch = (augment(batch[0]), *batch[1:])  # 1-D signals: (x, y) arrays only (config checks)
                if on_device:
                    batch = to_device(batch, state.device)  # batch.py: any structure
                try:
                    train_step(state, batch, cbs)
                except EcotrainError:
                    raise
                except Exception as exc:  # the model or the user's loss on this batch: name its shapes
                    raise feed.failure(exc, batch) from None
                state.step += 1
                state.batch_in_epoch += 1
                state.samples_seen += n
                if per_step_schedule:
                    state.scheduler.step()
                state.window_losses.append(state.loss)  # summed at log time: no tensor op per step
                if state.loss_parts is not None:
                    for k, v in state.loss_parts.items():
                        state.window_parts.setdefault(k, []).append(v)
                if state.step % cfg.log_every == 0:
                    cbs.on_log(state, log_record(state))
                    gc.collect(1)  # reclaim any reference cycles, at a time of our choosing
                if cfg.eval_every and state.step % cfg.eval_every == 0:
                    record = evaluate_fn(state)
                    set_train_mode(state)
                    cbs.on_eval_end(state, record)
                if cfg.max_steps and state.step >= cfg.max_steps:
                    state.stop("max_steps")
                cbs.on_step_end(state)  # after the step's log and eval: a checkpoint here is complete
                if state.should_stop or state.rewound:  # rewound: read the batches from the restored position
                    break
            else:  # the epoch ran to its end
                state.epoch += 1
                state.batch_in_epoch = 0
                if not per_step_schedule:
                    state.scheduler.step()
                if not cfg.eval_every:
                    record = evaluate_fn(state)
                    set_train_mode(state)
                    cbs.on_eval_end(state, record)
                cbs.on_epoch_end(state)
    finally:  # a raising step must not leave the process without its garbage collector, nor its workers
        feed.close()
        state.train_seconds, state.segment_start = state.elapsed(), None
        gc.unfreeze()
        if gc_was_enabled:
            gc.enable()
    cbs.on_fit_end(state)


def log_record(state) -> dict:
    names = list(state.window_parts)  # the methods' named loss terms, each a mean over the interval
    means = [torch.stack(state.window_losses).mean().float()]
    means += [torch.stack(state.window_parts[k]).float().mean() for k in names]
    # one collective and one host sync per log interval, the loss and every term together
    loss, *values = (v / state.dist.world_size for v in state.dist.all_reduce_sum(torch.stack(means)).tolist())
    state.window_losses, state.window_parts = [], {}
    state.last_log = {"step": state.step, "epoch": state.epoch, "loss": loss, "lr": state.lr}
    state.last_log.update({f"loss_{k}": v for k, v in zip(names, values)})
    return state.last_log


@torch.inference_mode()
def evaluate(model, source, task, batch_size: int, device, precision=None, prefix: str = "val", dist=None) -> dict:
    """Mean loss and metrics of `model` over `source`, in eval mode. The loss and every sum-state
    metric (metrics.py) are reduced in one collective and one host sync at the end; other metric
    objects (torchmetrics) compute, and sync, on their own. With `dist`, each rank evaluates its
    shard."""
    was_training = model.training
    model.eval()
    metrics = task.metrics()
    loss_sum, units = None, 0
    on_device = device.type != "cpu"
    with one_gather(model):  # ZeRO-2: gathered once for the pass, not once per batch
        for batch in iter_batches(source, batch_size):
            if on_device:
                batch = to_device(batch, device)
            with precision.autocast() if precision else torch.autocast(device.type, enabled=False):
                out = task.forward(model, batch)
            loss = task.loss(out, batch, "sum").detach().float()
            loss_sum = loss if loss_sum is None else loss_sum + loss
            units = units + unit_count(task, batch)  # a tensor on the device: read with the loss below
            if metrics:
                preds, target = task.predictions(out), task.targets(batch)
                for m in metrics.values():
                    m.update(preds, target)
    model.train(was_training)
    if loss_sum is None:
        loss_sum = torch.zeros((), device=device)
    dev = loss_sum.device
    states = []  # every SumMetric's sums, in the metrics' order, packed with the loss below
    for m in metrics.values():
        if isinstance(m, SumMetric):
            sums = m.sums
            states.append(torch.zeros(m.size, dtype=torch.float64) if sums is None else sums)
    packed = torch.cat([loss_sum.reshape(1).double(), torch.as_tensor(units, dtype=torch.float64, device=dev).reshape(1),
                        *(v.to(dev) for v in states)])
    if dist is not None:
        packed = dist.all_reduce_sum(packed)
    packed = packed.cpu()
    record = {f"{prefix}_loss": float(packed[0] / packed[1]) if float(packed[1]) else float("nan")}
    offset = 2
    for name, m in metrics.items():
        if isinstance(m, SumMetric):
            record[f"{prefix}_{name}"] = m.value(packed[offset:offset + m.size])
            offset += m.size
        else:  # torchmetrics and the like: computed (and synced) by the object itself
            record[f"{prefix}_{name}"] = scalar(m.compute())
    return record


def evaluate_split(state, source, prefix: str, final: bool = False) -> dict:
    """`loop.evaluate` on this rank's view of `source` (its shard under DDP), reduced across ranks.
    During training it evaluates `methods.eval_model` (EMA's average); `final`: the model itself,
    which `finish` has loaded with the final weights."""
    model, src, reduce_with = state.dist.eval_view(state.model, source)
    if state.methods and not final:
        model = state.methods.eval_model(model)
    return evaluate(model, src, state.task, state.plan.eval_batch, state.device, state.precision,
                         prefix, reduce_with)


def make_evaluate(bundle):
    def evaluate_fn(state) -> dict:
        record = {"step": state.step, "epoch": state.epoch}
        if bundle.val is not None:
            record.update(evaluate_split(state, bundle.val, "val"))
        state.last_eval = record
        return record
    return evaluate_fn
