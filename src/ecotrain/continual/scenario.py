"""Split MNIST-1D: the 10 classes of MNIST-1D cut into tasks of 2 classes each ({0,1}, {2,3}, ...),
learnt one after another. Class-incremental: one head over all 10 classes and no task id at test
time, so a model must tell 0 from 9 after having seen them in different tasks.

The data comes from the mnist1d built-in (data/builtin.py, cached by data/cache.py). `write_tasks`
stores each task as task_k.npz (x, y, x_test, y_test) that `data: {name: npz, path: ...,
num_classes: 10}` reads, and all.npz, every task together (joint training, the upper bound).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from ecotrain.config import Config, DataConfig
from ecotrain.data.builtin import mnist1d
from ecotrain.base.errors import ConfigError
from ecotrain.base.rundir import atomic_write

NUM_CLASSES = 10


@dataclass
class Task:
    classes: tuple[int, ...]
    x: np.ndarray  # float32 [n, 40]
    y: np.ndarray  # int64 [n]
    x_test: np.ndarray
    y_test: np.ndarray
    cohort: Optional[np.ndarray] = None  # an optional group key per training row (e.g. a user group)


def split_mnist1d(num_samples: int = 6250, tasks: int = 5, seed: int = 0) -> list[Task]:
    """The tasks in order; task k holds the classes of `class_order(tasks, seed)[k]`. mnist1d keeps
    80% of `num_samples` for training (6250: 5,000 training and 1,250 test examples)."""
    if tasks < 1 or NUM_CLASSES % tasks:
        raise ConfigError(f"split_mnist1d: tasks={tasks} must divide the {NUM_CLASSES} classes (1, 2, 5 or 10)")
    (x, y), (x_test, y_test), _ = mnist1d(Config(data=DataConfig(num_samples=num_samples)))
    x, y, x_test, y_test = x.numpy(), y.numpy(), x_test.numpy(), y_test.numpy()
    out = []
    for classes in class_order(tasks, seed):
        tr, te = np.isin(y, classes), np.isin(y_test, classes)
        out.append(Task(tuple(classes), x[tr], y[tr], x_test[te], y_test[te]))
    return out


def class_order(tasks: int = 5, seed: int = 0) -> list[tuple[int, ...]]:
    """seed 0: the classic split {0,1}, {2,3}, ...; another seed: a seeded permutation of the classes."""
    order = np.arange(NUM_CLASSES) if seed == 0 else np.random.default_rng(seed).permutation(NUM_CLASSES)
    per = NUM_CLASSES // tasks
    return [tuple(int(c) for c in order[k * per:(k + 1) * per]) for k in range(tasks)]


def joint(tasks: list[Task]) -> Task:
    """Every task's data together (joint training: the upper bound of any continual strategy)."""
    cat = np.concatenate
    cohorts = [t.cohort for t in tasks]
    return Task(tuple(c for t in tasks for c in t.classes), cat([t.x for t in tasks]), cat([t.y for t in tasks]),
                cat([t.x_test for t in tasks]), cat([t.y_test for t in tasks]),
                cat(cohorts) if all(c is not None for c in cohorts) else None)


def save_task(task: Task, path: Path) -> None:
    """One task as an .npz that `data.name: npz` reads, written atomically."""
    arrays = {"x": task.x, "y": task.y, "x_test": task.x_test, "y_test": task.y_test}
    if task.cohort is not None:
        arrays["cohort"] = task.cohort
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write(Path(path), buf.getvalue())


def write_tasks(out_dir, num_samples: int = 6250, tasks: int = 5, seed: int = 0) -> list[Path]:
    """task_0.npz ... task_{tasks-1}.npz and all.npz in `out_dir`; returns the task files in order."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    split = split_mnist1d(num_samples, tasks, seed)
    paths = []
    for k, t in enumerate(split):
        save_task(t, out / f"task_{k}.npz")
        paths.append(out / f"task_{k}.npz")
    save_task(joint(split), out / "all.npz")
    return paths
