"""Sharded checkpoints for FSDP, through torch.distributed.checkpoint (DCP).

Every rank writes its own shard of the model, optimizer and best weights with DCP's safetensors
storage (`HuggingFaceStorageWriter`, `save_distributed=True`); DCP's default FileSystemWriter is
not used because it pickles its `.metadata`. Everything else (RNGs, position, callbacks) is the
ordinary `tensors.safetensors` + `meta.json`, written by rank 0, and the MANIFEST lists the shards
too, so verification and atomicity work as for a single-process checkpoint. Loading goes through
DCP's planner, which reshards: a checkpoint saved by 2 ranks loads into 1 (or 4).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

import torch

from ecotrain.checkpoint.format import flatten, unflatten, write_checkpoint

SHARDS = "shards"


def model_optim_state(model, optimizer) -> tuple[dict, dict]:
    """FQN-keyed model and optimizer state (DTensors under FSDP), the same keys at any world size."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    return get_state_dict(model, optimizer)


def load_model_optim_state(model, optimizer, model_sd: dict, optim_sd: dict) -> None:
    from torch.distributed.checkpoint.state_dict import set_state_dict
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)


def write_sharded(folder: Path, tensors: dict, meta: dict, sharded: dict, dist) -> Path:
    """All ranks call this together. Shards go to a temporary folder, rank 0 adds the rest and the
    manifest, then renames: a kill at any point leaves the previous checkpoint as it was."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    folder = Path(folder)
    tmp = folder.with_name(f".tmp-{folder.name}-sharded")  # one name on every rank
    if dist.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / SHARDS).mkdir(parents=True)
    dist.barrier()
    dcp.save(sharded, storage_writer=HuggingFaceStorageWriter(str(tmp / SHARDS), save_distributed=True))
    dist.barrier()
    if dist.is_main:
        extra = sorted(str(p.relative_to(tmp)) for p in (tmp / SHARDS).rglob("*") if p.is_file())
        write_checkpoint(folder, tensors, meta, extra_files=extra, staged=tmp)
    dist.barrier()
    return folder


def write_sharded_async(folder: Path, tensors: dict, meta: dict, sharded: dict, dist, group) -> "Callable[[], None]":
    """`write_sharded` with the shards written by DCP's `async_save` on the process group `group`
    (its own, so the writes' collectives never interleave with training's): the loop is blocked
    only while this rank's shards are staged (copied to CPU memory). Returns `finish()`, to be called
    off the loop (a thread): it waits for the writes and, on rank 0, adds the rest and the manifest
    and renames; until then the previous checkpoint is the newest complete one."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    folder = Path(folder)
    tmp = folder.with_name(f".tmp-{folder.name}-sharded")
    if dist.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / SHARDS).mkdir(parents=True)
    dist.barrier()
    pending = dcp.async_save(sharded, storage_writer=HuggingFaceStorageWriter(str(tmp / SHARDS), save_distributed=True),
                             process_group=group)
    pending = getattr(pending, "upload_completion", pending)  # an AsyncSaveResponse wraps the future

    def finish() -> None:
        pending.result()  # rank 0's completes after every rank's shards are written (DCP's finish step)
        if dist.is_main:
            extra = sorted(str(p.relative_to(tmp)) for p in (tmp / SHARDS).rglob("*") if p.is_file())
            write_checkpoint(folder, tensors, meta, extra_files=extra, staged=tmp)

    return finish


def split(whole: dict) -> tuple[dict, dict]:
    """Take the sharded parts out of a captured state: (sharded tensors by path, the rest)."""
    big = {"model": whole.pop("model"), "optimizer": whole.pop("optimizer"),
           "best_weights": whole["best"].pop("weights")}
    tensors: dict[str, torch.Tensor] = {}
    whole["sharded"] = flatten(big, tensors)
    return tensors, whole


def load_into(folder: Path, model, optimizer, skeleton: dict) -> dict:
    """Read the shards into this process's current layout; returns {model, optimizer, best_weights}
    already loaded into `model` and `optimizer`."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    model_sd, optim_sd = model_optim_state(model, optimizer)  # initialises the optimizer state too
    has_best = skeleton.get("best_weights") is not None
    template = {"model": model_sd, "optimizer": optim_sd,
                "best_weights": {k: v.detach().clone() for k, v in model_sd.items()} if has_best else None}
    tensors: dict[str, torch.Tensor] = {}
    flatten(template, tensors, keep=True)
    dcp.load(tensors, storage_reader=HuggingFaceStorageReader(str(Path(folder) / SHARDS)))
    big = unflatten(skeleton, tensors)
    load_model_optim_state(model, optimizer, big["model"], big["optimizer"])
    return big
