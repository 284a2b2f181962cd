"""data/loader.py: loader workers give the same batches as the training process, fail in one line,
leave no process behind, and the feed's figures (data wait, samples/s, input-bound warning)."""

import os
import random
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from ecotrain import Callback, fit
from ecotrain.config import build_config
from ecotrain.data.sources import MapSource, Subset, seeded
from ecotrain.base.errors import DataError


class Noisy(torch.utils.data.Dataset):
    """Random augmentation from all three global generators, as user datasets do."""

    def __init__(self, n=320, fail_at=None, sleep=0.0):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 12, generator=g)
        self.y = (self.x[:, 0] > 0).long()
        self.fail_at, self.sleep = fail_at, sleep

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        if self.fail_at is not None and torch.utils.data.get_worker_info() is not None:  # in a worker only
            raise ValueError(f"corrupt record {self.fail_at}")
        if self.sleep:
            time.sleep(self.sleep)
        noise = torch.randn(12) * 0.1 + float(np.random.uniform(-0.05, 0.05)) + random.uniform(-0.05, 0.05)
        return self.x[i] + noise, self.y[i]


def _cfg(workers, steps=24, **data):
    return build_config({"seed": 5, "data": {"batch_size": 16, "workers": workers, **data},
                         "model": {"name": "mlp", "kwargs": {"hidden": [16]}, "dropout": 0.1},
                         "loop": {"max_steps": steps, "max_epochs": None, "log_every": 8},
                         "logging": {"progress": "off"}, "ledger": {"enabled": False}})


def _children() -> set[int]:
    """Live (not zombie) child processes of this process."""
    me, out = os.getpid(), set()
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                stat = (p / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == me and stat[0] != "Z":
                out.add(int(p.name))
    return out


def test_seeded_items_fix_each_item_and_leave_the_global_generators_alone():
    src = MapSource(Noisy(40))
    idx = torch.tensor([3, 7, 1])
    before = torch.get_rng_state()
    a, _ = seeded(src, 1, 2).take(idx)
    b, _ = seeded(src, 1, 2).take(idx.flip(0))
    assert torch.equal(torch.get_rng_state(), before)  # dropout in the training process sees no reseeding
    assert torch.equal(a, b.flip(0))  # an item's noise depends on its index, not its place in the batch
    c, _ = seeded(src, 1, 3).take(idx)
    assert not torch.equal(a, c)  # a new epoch, new augmentation
    d, _ = src.take(idx)
    e, _ = src.take(idx)
    assert not torch.equal(d, e)  # unseeded (evaluation, probes): the global generators as they run
    part = Subset(src, torch.tensor([10, 3, 7, 1]))
    f, _ = seeded(part, 1, 2).take(torch.tensor([1, 2, 3]))  # a Subset of a Dataset: its base's items seeded
    assert torch.equal(f, a)


class SigtermAt(Callback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, state):
        if state.step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def test_zero_one_and_two_workers_and_a_resume_give_bitwise_equal_weights(tmp_path):
    data = {"train": Noisy(), "val": Noisy(48)}
    runs = [fit(_cfg(0), data=data, run_dir=tmp_path / "w0", quiet=True),
            fit(_cfg(2, persistent_workers=True), data=data, run_dir=tmp_path / "w2", quiet=True)]
    cut = fit(_cfg(1), data=data, run_dir=tmp_path / "cut", quiet=True, callbacks=[SigtermAt(11)])
    assert cut.summary["stopped_because"] == "preempted" and not _children()
    # resumed mid-epoch with another worker count: allowed (not a config change), and exact
    runs.append(fit(_cfg(2), data=data, run_dir=tmp_path / "cut", quiet=True, resume=cut.state.last_checkpoint))
    ref = runs[0].model.state_dict()
    for r in runs[1:]:
        assert all(torch.equal(ref[k], v) for k, v in r.model.state_dict().items())
    for r in runs:
        assert r.summary["samples_per_second"] > 0 and 0 <= r.summary["data_wait_share"] < 1
    assert not _children()  # the workers are gone once fit() returns


def test_a_failing_worker_is_one_line_and_leaves_no_process(tmp_path):
    with pytest.raises(DataError, match=r"loader worker failed .*ValueError: corrupt record 33") as e:
        fit(_cfg(2), data={"train": Noisy(fail_at=33), "val": Noisy(48)}, run_dir=tmp_path / "r", quiet=True)
    assert "\n" not in str(e.value)
    deadline = time.time() + 5
    while _children() and time.time() < deadline:
        time.sleep(0.1)
    assert not _children()


def test_input_bound_warning_names_data_workers(tmp_path, ecotrain_log, monkeypatch):
    from ecotrain.data import loader

    monkeypatch.setattr(loader, "WINDOW_BATCHES", 4)
    r = fit(_cfg(0, steps=12), data={"train": Noisy(sleep=0.002), "val": Noisy(48)}, run_dir=tmp_path / "r",
            quiet=True)
    assert "input-bound" in ecotrain_log.text and "raise data.workers (now 0)" in ecotrain_log.text
    assert r.summary["data_wait_share"] > 0.3
    assert "samples/s, wait" in r.state.progress_fields["data"]  # what the progress bar shows


def test_the_input_bound_hint_is_a_function_of_the_measured_figures():
    """The promise without a clock (timing it under load is bench/input_bound.py's): a small in-memory
    Dataset's window (0.26 ms a batch, measured; even waiting 92% of a window a busy machine stretched)
    gets no hint; a reader slower than a worker's hand-over does, once past the warm-up window."""
    from ecotrain.data.loader import WARMUP_WINDOWS, WORKER_WORTH_SECONDS, input_bound

    judged = WARMUP_WINDOWS + 1
    assert not input_bound(0.92, 2.6e-4, judged, 0.3)  # cheap items: a worker would only slow them down
    assert input_bound(0.92, 5e-3, judged, 0.3)  # a slow reader: workers take it over
    assert input_bound(0.31, WORKER_WORTH_SECONDS, judged, 0.3)  # both thresholds are inclusive of the worth
    assert not input_bound(0.29, 5e-3, judged, 0.3)  # waited less than data.input_bound_share
    assert not input_bound(0.92, 5e-3, WARMUP_WINDOWS, 0.3)  # the warm-up window: worker start-up, first reads


def test_persistent_workers_need_workers():
    from ecotrain.base.errors import ConfigError

    with pytest.raises(ConfigError, match="persistent_workers needs data.workers > 0"):
        _cfg(0, persistent_workers=True)
