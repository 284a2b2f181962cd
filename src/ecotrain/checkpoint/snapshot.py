"""What "the whole state" of a run is, as one (tensors, meta) pair, and how to put it back.

Model, optimizer, LR schedule, precision (grad scaler), position (step, epoch, batch in epoch),
every RNG (Python, NumPy, torch CPU, CUDA, the augmentation generator), best weights and the
callbacks' own state, the log window, the resolved config and the dataset's content hash.
The sampler needs nothing: its order is a function of (seed, epoch); a user's stateful
DataLoader saves its own state under "data".
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from ecotrain.checkpoint import sharded
from ecotrain.checkpoint.format import flatten, unflatten
from ecotrain.base.errors import CheckpointError
from ecotrain.base.log import log


def rng_state() -> dict:
    np_state = np.random.get_state()
    py = random.getstate()
    return {
        "python": {"version": py[0], "state": list(py[1]), "gauss": py[2]},
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "gauss": float(np_state[4])},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(s: dict) -> None:
    random.setstate((s["python"]["version"], tuple(s["python"]["state"]), s["python"]["gauss"]))
    n = s["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(s["torch"])
    if s["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def capture(state, cbs, augment, metrics_offset: int, dataset_hash: str, copy: bool = True):
    """Snapshot the run as (tensors, meta, shards): shards are the FSDP parts (else None). With
    `copy`, tensors are copies, so a background writer may take its time while training goes on;
    a synchronous save writes before the next step and needs none."""
    window = torch.stack(state.window_losses).cpu() if state.window_losses else None  # this rank's own losses
    parts = {k: torch.stack(v).detach().cpu() for k, v in state.window_parts.items() if v}  # the loss terms' too
    data = state.data_source.state_dict() if state.data_source is not None else None
    ranks = state.dist.gather_objects({"rng": rng_state(), "augment": augment.state_dict(), "window": window,
                                       "window_parts": parts, "data": data})  # a stream split per rank: its own
    if state.dist.strategy == "fsdp":
        model_sd, optim_sd = sharded.model_optim_state(state.model, state.optimizer)
    else:
        model_sd, optim_sd = state.dist.unwrap(state.model).state_dict(), state.optimizer.state_dict()
    whole = {
        "model": model_sd,
        "ranks": ranks if len(ranks) > 1 else None,  # each rank's own RNG, augmentation and log window
        "optimizer": optim_sd,
        "scheduler": state.scheduler.state_dict(),
        "precision": state.precision.state_dict(),
        "rng": rng_state(),
        "augment": augment.state_dict(),
        "callbacks": cbs.state_dict(),
        "methods": state.methods.state_dict() if state.methods else {},
        "counters": {**state.counters.state_dict(), "micro_batches": state.plan.raised},  # stepplan.py
        "position": state.position(),
        "data": data,
        "best": {"metric": state.best_metric, "step": state.best_step, "evals_since": state.evals_since_best,
                 "weights": state.best_weights},
        "window_losses": window, "window_parts": parts,
        "last_log": state.last_log, "last_eval": state.last_eval,
        "train_seconds": state.elapsed(),
        "config": state.config.to_dict(), "dataset_hash": dataset_hash,
        "metrics_offset": metrics_offset, "env": environment(state),
    }
    big = None
    if state.dist.strategy == "fsdp":  # model, optimizer, best weights: one shard per rank, via DCP
        big, whole = sharded.split(whole)
    tensors: dict[str, torch.Tensor] = {}
    meta = flatten(whole, tensors)
    if copy:  # own the bytes: training mutates parameters and optimizer state in place
        tensors = {k: v.clone() for k, v in tensors.items()}
        big = {k: v.clone() for k, v in big.items()} if big is not None else None
    return tensors, meta, big


def environment(state) -> dict:
    """What, when it differs on resume, can break bit-exactness."""
    env = {"torch": torch.__version__, "device": state.device.type, "deterministic": state.config.deterministic,
           "threads": torch.get_num_threads(), "world_size": state.dist.world_size}
    if state.device.type == "cuda":  # another GPU model or CUDA/cuDNN picks other kernels: a warning on resume
        env.update(gpu=torch.cuda.get_device_name(state.device), cuda=torch.version.cuda,
                   cudnn=torch.backends.cudnn.version())
    return env


def _data_state(whole: dict, dist):
    """This rank's saved loader state. A loader keeping its own position (a stream split per rank)
    resumes only at the world size that saved it: its state cannot be resharded."""
    ranks = whole.get("ranks") or [{"data": whole.get("data")}]
    own = [r.get("data") for r in ranks]
    if len(own) != dist.world_size and any(d and d.get("loader") is not None for d in own):
        raise CheckpointError(f"data: the loader's own position was saved by {len(own)} rank(s); resume with "
                              f"{len(own)} (a stream's state cannot be resharded to {dist.world_size}; "
                              "data.name: shards:... can be, docs/data.md)")
    return own[dist.rank] if dist.rank < len(own) else own[0]


def restore(state, cbs, augment, tensors: dict, meta: dict, where: Path, allow_missing: bool = False) -> dict:
    """Load a captured state into freshly built parts. Returns the full (unflattened) state dict.
    `allow_missing`: a callback without saved state starts afresh (with a warning) instead of failing."""
    skeleton = meta.pop("sharded", None)  # refers to the shards, not to tensors.safetensors
    whole = unflatten(meta, tensors)
    if skeleton is not None:  # DCP reshards to this run's world size
        big = sharded.load_into(where, state.model, state.optimizer, skeleton)
        whole["best"]["weights"] = big["best_weights"]
    else:
        load_model_weights(state.dist.unwrap(state.model), whole["model"], where)
        state.optimizer.load_state_dict(whole["optimizer"])
    state.scheduler.load_state_dict(whole["scheduler"])
    state.precision.load_state_dict(whole["precision"])
    mine = (whole.get("ranks") or [{"rng": whole["rng"], "augment": whole["augment"], "window": whole["window_losses"],
                                    "window_parts": whole.get("window_parts")}])
    mine = mine[state.dist.rank] if state.dist.rank < len(mine) else mine[0]
    augment.load_state_dict(mine["augment"])
    missing = cbs.load_state_dict(whole["callbacks"], where, allow_missing)
    if missing:
        log.warning(f"callbacks without saved state start afresh: {', '.join(missing)}")
    if state.methods:
        state.methods.load_state_dict(whole.get("methods", {}), where)
    state.counters.load_state_dict(whole.get("counters", {}))
    if state.data_source is not None:  # a stateful loader: its position inside the epoch
        state.data_source.load_state_dict(_data_state(whole, state.dist))
    pos = whole["position"]
    state.step, state.epoch, state.batch_in_epoch, state.samples_seen = (
        pos["step"], pos["epoch"], pos["batch_in_epoch"], pos["samples_seen"])
    b = whole["best"]
    state.best_metric, state.best_step, state.evals_since_best, state.best_weights = (
        b["metric"], b["step"], b["evals_since"], b["weights"])
    wl = mine["window"]
    state.window_losses = list(wl.to(state.device).unbind()) if wl is not None else []
    state.window_parts = {k: list(v.to(state.device).unbind()) for k, v in (mine.get("window_parts") or {}).items()}
    state.last_log, state.last_eval = whole["last_log"], whole["last_eval"]
    state.train_seconds, state.last_checkpoint = whole["train_seconds"], str(where)
    set_rng_state(mine["rng"])  # last: nothing above may draw random numbers after it
    return whole


def tied_from(own: dict, saved: dict) -> dict:
    """{missing key: the saved tensor of the key it is tied to in the model} (same memory in `own`)."""
    first = {}
    for k, v in own.items():
        if k in saved and v.numel():
            first.setdefault((v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape)), k)
    out = {}
    for k, v in own.items():
        if k not in saved and v.numel():
            partner = first.get((v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape)))
            if partner is not None:
                out[k] = saved[partner]
    return out


def load_model_weights(model, saved: dict, where) -> None:
    """`model.load_state_dict(saved)`, or one clear error naming the keys that do not match."""
    own = model.state_dict()
    saved = {**saved, **tied_from(own, saved)}  # a file that stores a tied weight once (Hugging Face's)
    missing, unexpected = sorted(set(own) - set(saved)), sorted(set(saved) - set(own))
    if missing or unexpected:
        raise CheckpointError(f"{where}: weights are for a different model: missing keys {missing[:5]}, "
                              f"unexpected keys {unexpected[:5]} (model has {len(own)} tensors, file {len(saved)})")
    shapes = [f"{k}: {tuple(saved[k].shape)} in file vs {tuple(v.shape)} in model"
              for k, v in own.items() if tuple(saved[k].shape) != tuple(v.shape)]
    if shapes:
        raise CheckpointError(f"{where}: weights are for a different model: shape mismatch in {shapes[:5]}")
    model.load_state_dict(saved)
