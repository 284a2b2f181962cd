"""The "raise data.workers" hint's timed promise: a small in-memory Dataset (cheap items, no workers)
gets no hint, though the loop waits for it a large share of each window. The decision is tested on
its figures in tests/unit/test_loader.py; whether the clock gives it those figures depends on the
machine's load, which is why this is a bench and not a test. Windows of 4 batches, as a long run's
of 64 are judged.

    python bench/input_bound.py [--quick]

Prints `RESULT runs_with_hint=H/N median_wait_share=... median_wait_per_batch_ms=...`.
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from ecotrain import Config, fit  # noqa: E402
from ecotrain.data import loader  # noqa: E402


def one(folder: str) -> tuple[bool, float, list[float]]:
    """(hint said, the run's data_wait_share, each judged window's wait per batch)."""
    seen, decide = [], loader.input_bound

    def spy(share, wait_per_batch, windows, threshold):
        seen.append(wait_per_batch)
        return decide(share, wait_per_batch, windows, threshold)

    said = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    logging.getLogger("ecotrain").addHandler(handler)
    loader.input_bound, loader.WINDOW_BATCHES = spy, 4
    try:
        ds = torch.utils.data.TensorDataset(torch.randn(2048, 4), torch.randint(0, 2, (2048,)))
        cfg = Config.model_validate({"loop": {"max_steps": 60, "max_epochs": None}, "data": {"batch_size": 8},
                                     "ledger": {"enabled": False}, "logging": {"progress": "off"}})
        r = fit(cfg, model=nn.Linear(4, 2), data=ds, run_dir=folder, quiet=True)
    finally:
        loader.input_bound = decide
        logging.getLogger("ecotrain").removeHandler(handler)
    return any("input-bound" in m for m in said), r.summary["data_wait_share"], seen


def main() -> None:
    n = 2 if "--quick" in sys.argv else 10
    hints, shares, waits = 0, [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(n):
            said, share, seen = one(os.path.join(tmp, f"run-{i}"))
            hints += said
            shares.append(share)
            waits += seen
    print(f"RESULT runs_with_hint={hints}/{n} median_wait_share={statistics.median(shares):.2f} "
          f"median_wait_per_batch_ms={1e3 * statistics.median(waits):.3f}")


if __name__ == "__main__":
    main()
