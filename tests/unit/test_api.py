"""The Python API: the user's own module, data, loss and metrics through the same loop."""

import json

import torch
from torch import nn

from ecotrain import Callback, Config, fit


class Counter(Callback):
    def __init__(self):
        self.steps, self.evals = 0, 0

    def on_step_end(self, state):
        self.steps += 1

    def on_eval_end(self, state, record):
        self.evals += 1


def test_user_model_data_loss_metrics(tmp_path):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 3, generator=g)
    y = (x[:, 0] > 0).long()
    cfg = Config.model_validate({"optim": {"lr": 0.05}, "loop": {"max_epochs": 5, "max_steps": None},
                                 "data": {"batch_size": 20}, "logging": {"progress": "off"}})
    cb = Counter()
    mae = lambda out, t: (out.argmax(-1) != t).float().mean()  # noqa: E731
    r = fit(cfg, model=nn.Linear(3, 2), data={"train": (x[:300], y[:300]), "val": (x[300:350], y[300:350]),
                                             "test": (x[350:], y[350:])},
            loss_fn=nn.functional.cross_entropy, metrics={"err": mae}, callbacks=[cb], run_dir=tmp_path)
    assert r.summary["stopped_because"] == "max_epochs" and r.summary["epochs"] == 5
    assert cb.steps == 75 and cb.evals == 5
    assert r.summary["test_err"] < 0.1
    assert (tmp_path / "model.safetensors").exists()
    lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines if "val_loss" in l] == [15, 30, 45, 60, 75]


def test_torch_dataset_by_object(tmp_path):
    class DS(torch.utils.data.Dataset):
        def __init__(self):
            self.x = torch.randn(100, 4)
            self.y = (self.x.sum(1) > 0).long()

        def __len__(self):
            return 100

        def __getitem__(self, i):
            return self.x[i], self.y[i]

    cfg = Config.model_validate({"model": {"name": "mlp"}, "loop": {"max_steps": 30, "max_epochs": None},
                                 "data": {"batch_size": 10}, "logging": {"progress": "off"}})
    r = fit(cfg, data={"train": DS(), "val": DS()}, run_dir=tmp_path)
    assert r.summary["steps"] == 30 and "val_accuracy" in r.summary
