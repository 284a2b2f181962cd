"""Continuing a run (`resume`) and starting one from another's weights (`init_from`).

Resume refuses a changed config or dataset unless asked (`allow_config_change`), and warns when
the environment differs in ways that break bit-exactness (torch version, device, threads)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ecotrain.base import safefile
from ecotrain.checkpoint import sharded
from ecotrain.checkpoint.format import load_state_dict_file, read_checkpoint, unflatten
from ecotrain.checkpoint.manager import latest_valid, list_checkpoints
from ecotrain.checkpoint.snapshot import environment, load_model_weights, restore
from ecotrain.config import build_config, diff_configs
from ecotrain.base.errors import CheckpointError, ConfigError
from ecotrain.base.log import log
from ecotrain.base.runfiles import CHECKPOINTS, CONFIG, MODEL, SUMMARY, RunFiles


WATCH_ONLY = ("tracking", "logging")  # top-level sections (or their keys) left out of the resume check
WATCH_ONLY += ("threads", "preemption")  # the thread count itself is checked below, as the environment's (a warning)
# how batches are fetched, never which: a run may resume with more workers (data/loader.py, docs/data.md)
WATCH_ONLY += ("data.workers", "data.prefetch", "data.pin_memory", "data.persistent_workers", "data.input_bound_share")


def with_defaults(saved: dict) -> dict:
    """A checkpoint's config with this version's defaults for the settings it predates (a new section
    is no change to a run that never set it); as saved when this version no longer accepts it."""
    try:
        return build_config(saved).to_dict()
    except ConfigError:
        return saved


def _warn(msg: str) -> None:
    log.warning(msg)


def resume_into(state, cbs, augment, folder: Path, dataset_hash: str, allow_config_change: bool) -> dict:
    tensors, meta = read_checkpoint(folder)
    # what only watches the run (trackers, the progress bar) may change freely; the rest breaks exactness
    changes = [c for c in diff_configs(with_defaults(meta["config"]), state.config.to_dict())
               if not c.startswith(WATCH_ONLY)]
    if meta.get("dataset_hash") != dataset_hash:
        changes.append(f"dataset content hash: {meta.get('dataset_hash')} -> {dataset_hash}")
    if changes and not allow_config_change:
        raise ConfigError(f"resume from {folder}: the config differs from the checkpoint's: " + "; ".join(changes)
                          + ". Pass --allow-config-change to resume anyway")
    if changes:
        _warn(f"resuming with changes (not bit-exact): {'; '.join(changes)}")
    saved_env, now = meta.get("env", {}), environment(state)
    drift = [f"{k}: {saved_env[k]} -> {now[k]}" for k in now if k in saved_env and saved_env[k] != now[k]]
    if drift:
        _warn(f"resume environment differs, so the result may not be bit-identical: {'; '.join(drift)}")
    return restore(state, cbs, augment, tensors, meta, folder, allow_missing=allow_config_change)


def steps_past(metrics: Path, offset: int | None, step: int) -> int:
    """Steps that the interrupted segment trained after the checkpoint at `step` and that the resumed
    one trains again: the furthest step metrics.jsonl recorded past the checkpoint's offset. A lower
    bound by up to `loop.log_every - 1` steps (lines are written every log_every steps)."""
    if offset is None or not metrics.is_file():
        return 0
    with safefile.open_regular(metrics, "metrics log") as f:
        f.seek(offset)
        tail = f.read()
    furthest = step
    for line in tail.splitlines():
        try:
            record = json.loads(line)
        except ValueError:  # a line cut by the kill
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            furthest = max(furthest, record["step"])
    return furthest - step


def auto(run_dir, overwrite: bool = False) -> tuple[Path | None, bool]:
    """`resume="auto"` (`--resume auto`): (the run folder's newest valid checkpoint or None, overwrite).
    A first try killed before its first checkpoint left only a partial run: it starts again."""
    if not run_dir:
        raise ConfigError("--resume auto: needs --run-dir (the folder a restarted job shares with its first try)")
    run_dir = Path(run_dir)
    resume = latest_valid(run_dir, log.warning) if run_dir.is_dir() else None
    if resume is None and RunFiles(run_dir).summary.is_file() and not overwrite:
        raise ConfigError(f"{run_dir}: holds a finished run without a valid checkpoint; nothing to resume. "
                          "Choose a fresh --run-dir, or pass --overwrite to replace it")
    log.info(f"resuming from {resume}" if resume else "no valid checkpoint found: starting fresh")
    return resume, overwrite or resume is None


def finished(run_dir, checkpoint, config) -> dict | None:
    """The run's summary when resuming `checkpoint` would train nothing: summary.json was written at
    that checkpoint's step (not by a preempted stop) and the config's loop budget is the checkpoint's.
    A finished run is then never rewritten by a resume (a restarted job, two resumers at once)."""
    if checkpoint is None or not run_dir:
        return None
    try:
        summary = safefile.read_json(RunFiles(run_dir).summary, "run summary", 64 * safefile.MiB)
        meta = safefile.read_json(Path(checkpoint) / "meta.json", "checkpoint meta.json", 64 * safefile.MiB)
        same_budget = with_defaults(meta["config"]).get("loop") == config.to_dict()["loop"]
        at = summary["steps"] == meta["position"]["step"] and summary["stopped_because"] != "preempted"
    except (OSError, ValueError, KeyError, TypeError, ConfigError):  # no summary yet, or a damaged one: not finished
        return None
    if at and same_budget and RunFiles(run_dir).model.is_file():
        return summary
    return None


def _run_folder_weights(path: Path, keep_optimizer: bool, checkpoint_only: bool = False, say: bool = True) -> Path:
    """--init-from a run folder: its best weights (model.safetensors), or its newest valid checkpoint
    when it has none, or when the optimizer state is wanted too. `say`: tell the user which."""
    tell = _warn if say else (lambda msg: None)
    best = RunFiles(path).model
    if best.is_file() and not (keep_optimizer or checkpoint_only):
        tell(f"--init-from {path}: a run folder; starting from its best weights {best}")
        return best
    ckpts = list_checkpoints(path)
    ckpt = latest_valid(path, tell) if ckpts else None
    if ckpt is None:
        why = "no valid checkpoint" if ckpts else "no checkpoints/"
        if keep_optimizer and best.is_file():
            raise CheckpointError(f"--init-from {path}: a run folder with {why}, so no optimizer state for "
                                  f"--keep-optimizer; drop it to start from {MODEL}")
        raise CheckpointError(f"--init-from {path}: a run folder with {why}"
                              + ("" if checkpoint_only else f" and no {MODEL}") + ": no weights to start from")
    tell(f"--init-from {path}: a run folder; starting from its newest valid checkpoint {ckpt}")
    return ckpt


def init_from(model: torch.nn.Module, optimizer, path: Path, keep_optimizer: bool) -> Path | None:
    """Load weights from a checkpoint folder, a run folder (its best weights), a .safetensors file or
    a plain state_dict file. Called twice: with `optimizer=None` on the bare model before the
    methods' transform and the wrap (the weights), then with the optimizer (its state, with
    `keep_optimizer`; an FSDP checkpoint's shards, whose path the first call returns)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"--init-from {path}: not found")
    if path.is_dir() and not (path / "MANIFEST.json").exists():
        if any((path / n).exists() for n in (MODEL, CHECKPOINTS, CONFIG, SUMMARY)):
            path = _run_folder_weights(path, keep_optimizer, say=optimizer is None)  # said once, not per stage
        elif path.name == CHECKPOINTS and any(p.name.startswith("step-") for p in path.iterdir()):
            path = _run_folder_weights(path.parent, keep_optimizer, checkpoint_only=True,  # its newest valid one
                                       say=optimizer is None)
    if path.is_dir():
        tensors, meta = read_checkpoint(path)
        skeleton = meta.pop("sharded", None)
        if optimizer is None:  # the weights stage: before the methods' transform and the DDP/FSDP wrap
            if skeleton is not None:
                return path  # FSDP shards load into the wrapped model: the caller does it after the wrap
            load_model_weights(model, unflatten(meta, tensors)["model"], path)
            return None
        new_hparams = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
        if skeleton is not None:  # an FSDP checkpoint: DCP reads the shards into this layout
            sharded.load_into(path, model, optimizer, skeleton)
            if not keep_optimizer:
                optimizer.state.clear()  # weights only: the optimizer starts afresh
        else:
            whole = unflatten(meta, tensors)
            if keep_optimizer:  # the weights were loaded at the weights stage
                optimizer.load_state_dict(whole["optimizer"])
        for group, hp in zip(optimizer.param_groups, new_hparams):
            group.update(hp)  # the new run's lr, betas, weight decay; only the moments are carried over
        return None
    if keep_optimizer:
        raise ConfigError(f"--keep-optimizer: {path} is a weights file; only a checkpoint folder holds optimizer state")
    if optimizer is None:
        load_model_weights(model, load_state_dict_file(path), path)
    return None
