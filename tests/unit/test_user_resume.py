"""Exact resume with the user's own loader (tests/helpers/user_program.py's kinds): resumed from a
checkpoint in epoch 0 and from one in epoch 2, the final checkpoint is the uninterrupted run's
byte for byte (tensors.safetensors; meta.json but for its history fields). The same program killed
by real signals, from an installed wheel: tests/integration/test_user_programs.py."""

import shutil

import pytest
import torch
from torch import nn

from tests.helpers import user_program as up
from ecotrain import Config, fit
from ecotrain.data.sources import LoaderSource, replay_warning


@pytest.mark.parametrize("kind", up.KINDS)
def test_resumed_in_epoch_0_and_2_the_final_checkpoint_is_the_whole_runs(tmp_path, kind):
    up.run(kind, tmp_path / "whole")
    for k in (3, 14):  # 6 steps an epoch
        cut = tmp_path / f"from-{k}"
        shutil.copytree(tmp_path / "whole" / "checkpoints" / f"step-{k:08d}", tmp_path / f"ck-{k}")
        up.run(kind, cut, resume=tmp_path / f"ck-{k}")
        assert up.final_checkpoint_differences(tmp_path / "whole", cut) == []


def test_the_differences_are_seen_when_the_order_is_not_replayed(tmp_path, monkeypatch):
    """The comparison can fail: with the generators not rewound (the old behaviour), it does."""
    up.run("shuffle0", tmp_path / "whole")
    monkeypatch.setattr(LoaderSource, "_set_states", lambda self, states: None)
    up.run("shuffle0", tmp_path / "cut", resume=tmp_path / "whole" / "checkpoints" / "step-00000014")
    diffs = up.final_checkpoint_differences(tmp_path / "whole", tmp_path / "cut")
    assert any("model/" in d for d in diffs)


def test_a_sampler_ecotrain_cannot_replay_is_named_at_the_start(tmp_path, caplog):
    class Mine(torch.utils.data.Sampler):
        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

        def __iter__(self):
            return iter(torch.randperm(self.n).tolist())

    ds = torch.utils.data.TensorDataset(*up.arrays())
    loader = torch.utils.data.DataLoader(ds, batch_size=16, sampler=Mine(len(ds)))
    assert "Mine" in replay_warning(loader)
    assert replay_warning(torch.utils.data.DataLoader(ds, batch_size=16, shuffle=True)) is None
    with caplog.at_level("WARNING", logger="ecotrain"):
        fit(Config.model_validate({"loop": {"max_steps": 2, "max_epochs": None}, "ledger": {"enabled": False}}),
            model=nn.Linear(6, 3), data=loader, run_dir=tmp_path / "r", quiet=True)
    said = [r.getMessage() for r in caplog.records if "Mine" in r.getMessage()]
    assert len(said) == 1 and "\n" not in said[0] and "state_dict" in said[0]
