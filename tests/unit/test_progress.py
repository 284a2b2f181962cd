"""The progress bar draws one line per redraw (epoch, count, speed, time left, loss, metrics), keeps
log lines above it, and ends on the final step."""

import io
import logging
import re

import torch
from rich.console import Console

from ecotrain import Config, fit
from ecotrain.callbacks import Callback, ProgressBar
from ecotrain.base.log import _Stderr


class Warns(Callback):
    def on_step_end(self, state):
        if state.step == 20:
            logging.getLogger("ecotrain").warning("a message in the middle of the run")


def _run(tmp_path, width: int) -> str:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=width, color_system=None)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(200, 8, generator=g), torch.randint(0, 3, (200,), generator=g)
    cfg = Config.model_validate({"data": {"batch_size": 20}, "loop": {"max_steps": 40, "max_epochs": None,
                                                                      "log_every": 10},
                                 "ledger": {"enabled": False}, "logging": {"progress": "off"}})
    logging.getLogger("ecotrain").addHandler(handler := _Stderr())  # the CLI's: whatever sys.stderr is then
    try:
        fit(cfg, model=torch.nn.Linear(8, 3), data={"train": (x[:160], y[:160]), "val": (x[160:], y[160:])},
            callbacks=[ProgressBar(console=console, refresh_seconds=0.0), Warns()], run_dir=tmp_path / "run")
    finally:
        logging.getLogger("ecotrain").removeHandler(handler)
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue())  # cursor moves and line clears


def _frames(out: str) -> list[str]:
    return [f.strip("\n") for f in out.split("\r") if "epoch" in f]


def test_the_bar_ends_on_the_last_step_with_its_figures(tmp_path):
    out = _run(tmp_path, width=200)
    frames = _frames(out)
    last = frames[-1]
    assert "40/40" in last and "steps/s" in last, last
    assert "loss " in last and "val_loss " in last and "val_accuracy " in last, last
    assert any("16/40" in f for f in frames), frames  # redrawn on the way, every 16 steps here
    # the bar's Live takes sys.stderr while it runs: the message lands in its console, above the bar
    assert "a message in the middle of the run" in out


def test_a_narrow_terminal_cuts_the_line_not_wraps_it(tmp_path):
    out = _run(tmp_path, width=60)
    last = _frames(out)[-1]
    assert "\n" not in last and len(last) <= 60, repr(last)
    assert "40/40" in last and "steps/s" in last  # the metrics are cut, the count and speed stay
