"""TensorBoard: `torch.utils.tensorboard.SummaryWriter` event files, RUN/tensorboard by default
(`tensorboard --logdir runs` shows every run).

Scalars, at each record's step: `train/loss`, `train/lr`, `train/loss_<term>`, `val/<metric>`,
`cost/flops`, `cost/energy_kwh`, `cost/co2e_g`; at the end `final/<key>` for summary.json's figures.
Text: `config` (the resolved config) at the start. A resumed run opens the writer with
`purge_step` = the checkpoint's step + 1, so readers drop what the killed segment wrote after it; a
fresh run in a reused folder first removes the folder's old event files (default log_dir only).
"""

from __future__ import annotations

from pathlib import Path

from ecotrain.tracking.base import Tracker, numeric
from ecotrain.base.runfiles import TENSORBOARD, RunFiles

COST = ("flops", "energy_kwh", "co2e_g")


def tag(key: str) -> str:
    if key.startswith("val_"):
        return f"val/{key[4:]}"
    if key.startswith("test_"):
        return f"test/{key[5:]}"
    if key in COST:
        return f"cost/{key}"
    return f"train/{key}"


class TensorboardTracker(Tracker):
    def __init__(self, cfg, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter  # imported during assembly: a broken install fails early

        self._writer_cls = SummaryWriter
        self.default = cfg.log_dir is None
        self.log_dir = RunFiles(run_dir) / TENSORBOARD if self.default else Path(cfg.log_dir)
        self.writer = None

    def on_fit_start(self, state):
        if state.step == 0 and self.default and self.log_dir.is_dir():  # --overwrite: the old run's events go
            for old in self.log_dir.glob("events.out.tfevents.*"):
                old.unlink()
        # a resume: the checkpoint holds step N's log and evaluation, so what was written after N goes
        self.writer = self._writer_cls(str(self.log_dir), purge_step=state.step + 1 if state.step else None)
        if state.step == 0:
            import yaml

            text = yaml.safe_dump(state.config.to_dict(), sort_keys=False)
            self.writer.add_text("config", "```\n" + text + "\n```", 0)

    def _add(self, record: dict) -> None:
        step = int(record.get("step", 0))
        for k, v in numeric(record).items():
            self.writer.add_scalar(tag(k), v, step)

    def on_log(self, state, record):
        self._add(record)

    def on_eval_end(self, state, record):
        self._add(record)
        self.writer.flush()

    def on_fit_end(self, state):
        self.writer.flush()
        if state.stopped_because == "preempted":  # no run_finished follows
            self.close()

    def on_exception(self, state, exc):
        self.close()

    def run_finished(self, run_dir: Path, summary: dict) -> None:
        if self.writer is None:
            return
        step = int(summary.get("steps", 0))
        for k, v in numeric(summary).items():
            self.writer.add_scalar(f"final/{k}", v, step)
        self.close()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
