"""The training loop and the evaluation loop, one screen each. Every hook call is a visible line.

A "batch" from the sampler is the effective batch of one optimizer step; `train_step` cuts it
into `loop.accumulate` micro-batches and normalises the loss by the whole batch's unit count, so
accumulation is exactly one big batch.
"""

from __future__ import annotations

import gc
import time

import torch

from ecotrain.data.loader import Feed
from ecotrain.memory import recover_from_oom


def micro_batches(x, y, n_micro: int):
    if n_micro == 1:
        return ((x, y),)
    size = -(-len(y) // n_micro)  # ceil: the last micro-batch may be smaller
    return zip(x.split(size), y.split(size))


def backward_micro_batches(state, x, y, n_micro: int) -> torch.Tensor:
    """Forward and backward of one effective batch in `n_micro` pieces; returns the summed loss
    (and leaves the summed named loss terms in `state.loss_parts` when methods add any)."""
    model, prec, dist, objective = state.model, state.precision, state.dist, state.objective
    if n_micro == 1:  # the common case: one forward and backward; DDP/FSDP sync as usual
        with prec.autocast():
            loss, state.loss_parts = objective(model, x, y, None, state)
        prec.backward(loss)
        return loss.detach()
    total_units = state.task.units(y)
    loss_sum = parts_sum = None
    for i, (xm, ym) in enumerate(micro_batches(x, y, n_micro)):
        with dist.grad_sync(model, last=i == n_micro - 1):  # DDP/FSDP: all-reduce on the last only
            with prec.autocast():
                loss, parts = objective(model, xm, ym, total_units, state)
            prec.backward(loss)
        loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
        if parts is not None:
            parts_sum = parts if parts_sum is None else {k: parts_sum[k] + v for k, v in parts.items()}
    state.loss_parts = parts_sum
    return loss_sum


def train_step(state, x, y, cbs) -> None:
    model, opt, prec, loop_cfg = state.model, state.optimizer, state.precision, state.config.loop
    n_micro = state.counters.micro_batches or loop_cfg.accumulate  # raised by OOM recovery
    if state.objective.batch_methods:
        x, y = state.objective.prepare(state, x, y)  # methods' batch changes (resize, selective backprop)
    try:
        if n_micro == 1 and state.objective.plain and prec.dtype is None:
            # fp32, the task loss alone, one micro-batch: a hand-written loop's step, written as one
            # (each layer of calls between torch ops costs ~1% of a small model's step on CPU)
            loss = state.objective.task.loss(model(x), y)
            loss.backward()
            state.loss, state.loss_parts = loss.detach(), None
        else:
            state.loss = backward_micro_batches(state, x, y, n_micro)
    except torch.OutOfMemoryError as exc:  # retry in smaller micro-batches, same maths (memory.py)
        state.loss = recover_from_oom(state, x, y, n_micro, exc, backward_micro_batches)
    state.skip_step = False
    cbs.on_after_backward(state)  # the divergence guard may set skip_step here
    if not state.skip_step:
        if loop_cfg.grad_clip:
            prec.unscale(opt)  # clip true gradients, not scaled ones
            torch.nn.utils.clip_grad_norm_(model.parameters(), loop_cfg.grad_clip)
        prec.step(opt)
    opt.zero_grad(set_to_none=True)


def set_train_mode(state) -> None:
    """`model.train()`, then the methods' `train_mode` (a BatchNorm freeze must survive it)."""
    state.model.train()
    if state.methods:
        state.methods.train_mode(state.model)


def train(state, sampler, source, cbs, augment, evaluate_fn) -> None:
    """Run until a budget is spent or a callback asks to stop. Resumes from `state`'s position."""
    cfg = state.config.loop
    per_step_schedule = state.config.schedule.interval == "step"
    to_device = state.device.type != "cpu"
    augment = augment if augment.active else None
    cbs.on_fit_start(state)
    gc_was_enabled = gc.isenabled()
    gc.collect(1)  # the young generations only: a full collection costs ~0.5 s after importing torch
    gc.freeze()  # set-up objects (modules, imports) leave the GC's scans until the loop ends
    gc.disable()  # tensors die by refcount; automatic collections mid-step cost ~5% on small models
    state.segment_start = time.perf_counter()
    feed = Feed(state, sampler, source)
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
            for idx, x, y in feed.epoch(state.epoch, state.batch_in_epoch):  # data/loader.py: in-process or workers
                cbs.on_step_start(state)
                if augment:
                    x = augment(x)
                if to_device:
                    x, y = x.to(state.device, non_blocking=True), y.to(state.device, non_blocking=True)
                train_step(state, x, y, cbs)
                state.step += 1
                state.batch_in_epoch += 1
                state.samples_seen += idx.shape[0]
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
    """Mean loss and metrics of `model` over `source`, in eval mode; one host sync at the end.
    With `dist`, each rank evaluates its shard and the sums are all-reduced."""
    was_training = model.training
    model.eval()
    sums: dict[str, torch.Tensor] = {}
    units, n = 0, len(source)
    take_range = getattr(source, "take_range", None)  # in-memory arrays: contiguous views, no gather
    to_device = device.type != "cpu"
    for start in range(0, n, batch_size):
        stop = min(start + batch_size, n)
        x, y = take_range(start, stop) if take_range else source.take(torch.arange(start, stop))
        if to_device:
            x, y = x.to(device), y.to(device)
        with precision.autocast() if precision else torch.autocast(device.type, enabled=False):
            out = model(x)
        batch = {"loss": task.loss(out, y, "sum"), **task.metric_sums(out, y)}
        for k, v in batch.items():
            sums[k] = sums[k] + v.detach() if k in sums else v.detach()
        units += task.units(y)
    model.train(was_training)
    keys = list(sums)
    packed = torch.stack([sums[k].float() for k in keys] + [torch.tensor(float(units), device=device)])
    if dist is not None:
        packed = dist.all_reduce_sum(packed)
    *values, units = packed.tolist()
    return {f"{prefix}_{k}": v / units for k, v in zip(keys, values)}
