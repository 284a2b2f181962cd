"""What the registry tests share: the CLI's `main` in this process with its output, and a base run on
Split MNIST-1D's first task (tiny), trained once per module."""

from pathlib import Path

from ecotrain import Config, fit
from ecotrain.cli import main
from ecotrain.continual.scenario import write_tasks


def ecotrain(capsys, *args):
    """(exit code, stdout, stderr) of `ecotrain ARGS` run through the CLI's main in this process."""
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def base_world(root: Path, steps: int = 30, methods: list | None = None) -> list[Path]:
    """Split MNIST-1D's task files under ROOT/tasks, and an MLP trained on task 0 in ROOT/base."""
    tasks = write_tasks(root / "tasks", num_samples=2000, tasks=5)
    cfg = Config.model_validate({
        "name": "base", "data": {"name": "npz", "path": str(tasks[0]), "num_classes": 10, "batch_size": 32},
        "model": {"name": "mlp", "kwargs": {"hidden": [64]}},
        "loop": {"max_steps": steps, "max_epochs": None, "log_every": 10},
        "methods": methods or [], "logging": {"progress": "off"}, "ledger": {"enabled": False}})
    fit(cfg, run_dir=root / "base", quiet=True)
    return tasks
