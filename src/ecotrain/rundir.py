"""The run folder: config.yaml, metrics.jsonl, summary.json, model.safetensors (and checkpoints/).

Files that must never be half-written go through `atomic_write`: temp name, fsync, rename."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import yaml


def default_run_dir(name: str) -> Path:
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def atomic_write(path: Path, data: bytes) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: Path, obj) -> None:
    atomic_write(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def write_config(run_dir: Path, config_dict: dict) -> None:
    atomic_write(run_dir / "config.yaml", yaml.safe_dump(config_dict, sort_keys=False).encode())


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
