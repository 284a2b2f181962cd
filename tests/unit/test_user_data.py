"""A user's own model and data, as a new user brings them: dict batches, items with metadata, two
inputs, regression arrays, an IterableDataset, a DataLoader, user optimizers and schedulers,
torch.compile; and one line for what cannot work."""

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from ecotrain import Callback, Config, fit
from ecotrain.base.errors import ConfigError, DataError


def cfg(**over):
    tree = {"data": {"batch_size": 16}, "loop": {"max_steps": 6, "max_epochs": None, "log_every": 2},
            "ledger": {"enabled": False}, "checkpoint": {"at_end": True}}
    for k, v in over.items():
        tree[k] = {**tree.get(k, {}), **v} if isinstance(v, dict) else v
    return Config.model_validate(tree)


class DictItems(torch.utils.data.Dataset):
    def __init__(self, n=64):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 5, generator=g), torch.randint(0, 3, (n,), generator=g)
        self.labels = self.y.tolist()

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"features": self.x[i], "mask": torch.ones(5), "label": self.y[i]}


class KwModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 3)

    def forward(self, features, mask):
        return self.fc(features * mask)


def test_dict_batches_go_to_the_model_as_keywords(tmp_path):
    r = fit(cfg(), model=KwModel(), data={"train": DictItems(), "val": DictItems(32)}, run_dir=tmp_path / "r")
    assert r.state.task.name == "classification" and r.summary["steps"] == 6
    assert 0.0 <= r.summary["val_accuracy"] <= 1.0


class WithMeta(torch.utils.data.Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        return torch.full((4,), float(i % 2)), i % 2, {"id": f"item-{i}"}


class TwoInputs(torch.utils.data.Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        return torch.full((3,), float(i % 2)), torch.full((2,), 1.0), i % 2


class Sum2(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 2), nn.Linear(2, 2)

    def forward(self, x1, x2):
        return self.a(x1) + self.b(x2)


def test_items_with_metadata_and_two_inputs_train(tmp_path):
    r = fit(cfg(), model=nn.Linear(4, 2), data=WithMeta(), run_dir=tmp_path / "meta")
    assert r.summary["steps"] == 6
    r = fit(cfg(), model=Sum2(), data=TwoInputs(), run_dir=tmp_path / "two")
    assert r.summary["steps"] == 6


def test_regression_from_arrays_with_a_user_loss(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 3)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5], dtype=np.float32)).astype(np.float32)
    r = fit(cfg(loop={"max_steps": 150}, optim={"lr": 3e-2}), model=nn.Linear(3, 1),
            data={"train": (x[:160], y[:160]), "val": (x[160:], y[160:])},
            loss_fn=lambda out, t: torch.nn.functional.mse_loss(out.squeeze(-1), t), run_dir=tmp_path / "u")
    assert r.summary["val_loss"] < 0.05
    r = fit(cfg(loop={"max_steps": 150}, optim={"lr": 3e-2}), model=nn.Linear(3, 1),
            data={"train": (x[:160], y[:160]), "val": (x[160:], y[160:])}, run_dir=tmp_path / "auto")
    assert r.state.task.name == "regression" and r.summary["val_r2"] > 0.95


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        g = torch.Generator().manual_seed(1)
        for _ in range(50):
            y = int(torch.randint(0, 2, (), generator=g))
            yield torch.randn(4, generator=g) + y, y


def test_an_iterable_dataset_needs_max_steps_then_trains(tmp_path):
    with pytest.raises(ConfigError, match="loop.max_steps") as e:
        fit(cfg(loop={"max_steps": None, "max_epochs": 2}), model=nn.Linear(4, 2), data=Stream(), run_dir=tmp_path / "a")
    assert "\n" not in str(e.value)
    r = fit(cfg(loop={"max_steps": 7}), model=nn.Linear(4, 2), data=Stream(), run_dir=tmp_path / "b")
    assert r.summary["steps"] == 7 and r.summary["epochs"] == 1  # 50 samples: 4 steps a pass


def test_a_users_dataloader_with_accumulation_counts_its_batches(tmp_path):
    ds = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    loader = torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(0))
    r = fit(cfg(loop={"max_steps": None, "max_epochs": 2, "accumulate": 2}), model=nn.Linear(4, 2),
            data={"train": loader, "val": loader}, run_dir=tmp_path / "r")
    assert r.summary["steps"] == 8 and r.summary["samples_seen"] == 128  # 8 batches a pass, 2 per step


def test_forgetting_data_is_one_line(tmp_path):
    with pytest.raises(DataError, match="without data=") as e:
        fit(cfg(), model=nn.Linear(4, 2), run_dir=tmp_path / "r")
    assert "\n" not in str(e.value) and not (tmp_path / "r").exists()


class CountingDataset(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n, self.reads = n, 0
        self.labels = [i % 3 for i in range(n)]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.reads += 1
        return torch.full((4,), float(i % 5)), self.labels[i]


class ReadsAtFirstStep(Callback):
    def __init__(self, ds):
        self.ds, self.reads = ds, None

    def on_after_backward(self, state):
        if self.reads is None:
            self.reads = self.ds.reads


def test_a_big_dataset_is_not_read_whole_before_the_first_step(tmp_path):
    ds = CountingDataset(5000)
    probe = ReadsAtFirstStep(ds)
    fit(cfg(data={"batch_size": 64}, loop={"max_steps": 1}, checkpoint={"at_end": False}), model=nn.Linear(4, 3),
        data=ds, callbacks=[probe], run_dir=tmp_path / "r")
    assert probe.reads == 1 + 16 + 64  # the first item (the task's shape), 16 sampled for the fingerprint, the batch


def test_user_optimizer_and_scheduler_factories_get_the_groups(tmp_path):
    got = {}

    def make_opt(groups):
        got["groups"] = groups
        return torch.optim.SGD(groups, lr=0.1, momentum=0.9)

    def make_sched(opt):
        return torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)

    x, y = torch.randn(64, 4), torch.randint(0, 2, (64,))
    r = fit(cfg(optim={"weight_decay": 0.01}), model=nn.Linear(4, 2), data=(x, y), optimizer=make_opt,
            scheduler=make_sched, run_dir=tmp_path / "r")
    assert isinstance(r.state.optimizer, torch.optim.SGD)
    assert [g["weight_decay"] for g in got["groups"]] == [0.01, 0.0]  # decay on weights, none on the bias
    assert r.state.optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5 ** 3)  # 6 steps, halved every 2


def test_compile_keeps_the_checkpoint_keys(tmp_path):
    x, y = torch.randn(64, 4), torch.randint(0, 2, (64,))
    r = fit(cfg(compile=True, loop={"max_steps": 2}), model=nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)),
            data=(x, y), run_dir=tmp_path / "r")
    keys = set(load_file(str(r.run_dir / "model.safetensors")))
    assert keys == {"0.weight", "0.bias", "2.weight", "2.bias"}


def test_a_method_that_needs_xy_is_refused_on_regression_in_one_line(tmp_path):
    x, y = torch.randn(64, 4), torch.randn(64)
    c = cfg(methods=[{"name": "selective_backprop", "keep": 0.5}, {"name": "dedup"}])
    with pytest.raises(ConfigError, match="methods: 'dedup' needs") as e:
        fit(c, model=nn.Linear(4, 1), data=(x, y), run_dir=tmp_path / "r")
    assert "\n" not in str(e.value)


def test_a_plain_dataloader_resumes_by_skipping_and_says_so(tmp_path, caplog):
    """No loader state: the epoch is re-read and the trained steps skipped; exact for an order that
    depends on the epoch alone (shuffle off), and said once in one line."""
    ds = torch.utils.data.TensorDataset(torch.randn(80, 4, generator=torch.Generator().manual_seed(1)),
                                        torch.randint(0, 2, (80,), generator=torch.Generator().manual_seed(2)))

    def run(run_dir, resume=None):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.2), nn.Linear(8, 2))
        c = cfg(loop={"max_steps": 8}, checkpoint={"every_n_steps": 3, "keep_last": 5})
        return fit(c, model=model, data=torch.utils.data.DataLoader(ds, batch_size=16), run_dir=run_dir,
                   resume=resume)

    whole = run(tmp_path / "whole")
    with caplog.at_level("INFO", logger="ecotrain"):
        resumed = run(tmp_path / "part", resume=None)  # a first run to take a checkpoint from
        again = run(tmp_path / "again", resume=tmp_path / "part" / "checkpoints" / "step-00000003")
    said = [r.getMessage() for r in caplog.records if "keeps no state" in r.getMessage()]
    assert len(said) == 1 and "\n" not in said[0]
    for a, b in zip(whole.model.state_dict().values(), again.model.state_dict().values()):
        assert torch.equal(a, b)
    assert resumed.summary["steps"] == again.summary["steps"] == 8
