"""Split MNIST-1D: tasks of two classes each from the mnist1d built-in, written as .npz files that
`data.name: npz` reads with a 10-way head (data.num_classes)."""

import numpy as np
import pytest

from ecotrain.config import build_config
from ecotrain.continual.scenario import class_order, split_mnist1d, write_tasks
from ecotrain.data import load_data
from ecotrain.base.errors import ConfigError, DataError


def test_split_and_files_read_back_as_a_ten_way_task(tmp_path):
    tasks = split_mnist1d(num_samples=500)
    assert [t.classes for t in tasks] == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]
    assert sum(len(t.y) for t in tasks) == 400 and sum(len(t.y_test) for t in tasks) == 100
    for t in tasks:
        assert set(np.unique(t.y)) == set(t.classes) == set(np.unique(t.y_test))
    paths = write_tasks(tmp_path, num_samples=500)
    assert [p.name for p in paths] == [f"task_{k}.npz" for k in range(5)] and (tmp_path / "all.npz").is_file()
    cfg = build_config({"data": {"name": "npz", "path": str(paths[1]), "num_classes": 10}})
    bundle = load_data(cfg)
    assert bundle.num_classes == 10 and set(bundle.test.labels().tolist()) == {2, 3}
    cfg = build_config({"data": {"name": "npz", "path": str(paths[4]), "num_classes": 5}})
    with pytest.raises(DataError, match="data.num_classes=5: the train data: label [89] .* out of range"):
        load_data(cfg)


def test_class_order_and_bad_task_count():
    assert class_order(2) == [(0, 1, 2, 3, 4), (5, 6, 7, 8, 9)]
    shuffled = class_order(5, seed=3)
    assert sorted(c for t in shuffled for c in t) == list(range(10)) and shuffled != class_order(5)
    with pytest.raises(ConfigError, match="tasks=3 must divide"):
        split_mnist1d(num_samples=500, tasks=3)
