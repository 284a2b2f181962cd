"""A test-only callback that counts the Python-issued collectives of the training loop per rank
(DDP's own gradient all-reduce runs in C++ and is not counted) and writes the count to
`<run_dir>/collectives-<rank>.json` at the end of the fit."""

import json
from pathlib import Path

import torch.distributed as td

from ecotrain import Callback

NAMES = ("all_reduce", "all_gather", "all_gather_object", "broadcast", "broadcast_object_list", "barrier")


class CountCollectives(Callback):
    def __init__(self):
        self.count, self.saved = 0, {}

    def on_fit_start(self, state):
        for name in NAMES:
            original = self.saved[name] = getattr(td, name)

            def counted(*a, _original=original, **k):
                self.count += 1
                return _original(*a, **k)
            setattr(td, name, counted)

    def on_fit_end(self, state):
        for name, original in self.saved.items():
            setattr(td, name, original)
        Path(state.run_dir, f"collectives-{state.dist.rank}.json").write_text(
            json.dumps({"collectives": self.count, "steps": state.step}))
