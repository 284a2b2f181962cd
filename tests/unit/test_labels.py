"""Label hygiene: normalisation of incoming labels, contradiction flags, the review queue's order."""

import json

import numpy as np
import pytest
import torch

from ecotrain.continual.labels import contradictions, load_label_map, normalise, review_rows
from ecotrain.base.errors import ConfigError, DataError


def test_normalise_maps_strings_and_aliases(tmp_path):
    f = tmp_path / "map.json"
    f.write_text(json.dumps({"cat": 3, "kitty": 3, "dog": 5}))
    mapping = load_label_map(f)
    y = normalise(np.array(["cat", "kitty ", "dog", "5"]), mapping, "new.npz 'y'")
    assert y.tolist() == [3, 3, 5, 5] and y.dtype == torch.int64
    assert normalise(np.array([1, 2, 0], dtype=np.int32), None, "w").tolist() == [1, 2, 0]
    assert normalise(np.array([1.0, 2.0]), None, "w").tolist() == [1, 2]
    assert normalise(np.array(["4", "7"]), None, "w").tolist() == [4, 7]


def test_unmapped_label_is_one_line(tmp_path):
    with pytest.raises(DataError, match=r"label 'cow' \(row 1\) is not a class id; add it to --label-map"):
        normalise(np.array(["cat", "cow"]), {"cat": 3}, "new.npz 'y'")
    with pytest.raises(DataError, match="give --label-map"):
        normalise(np.array(["cat"]), None, "w")
    with pytest.raises(DataError, match="label 2.5"):
        normalise(np.array([1.0, 2.5]), None, "w")


def test_bad_label_map(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text("cat: three\n")
    with pytest.raises(ConfigError, match="must map raw labels to class ids"):
        load_label_map(f)
    with pytest.raises(ConfigError, match="--label-map: .*missing.yaml not found"):
        load_label_map(tmp_path / "missing.yaml")


def test_contradictions_count_known_classes_only():
    probs = torch.tensor([[0.95, 0.05, 0.0],   # label 1: contradicted (0.95 on class 0)
                          [0.60, 0.40, 0.0],   # label 1: wrong but not confident
                          [0.97, 0.03, 0.0],   # label 2: a new class, never contradicted
                          [0.02, 0.98, 0.0]])  # label 1: agreed
    y = torch.tensor([1, 1, 2, 1])
    r = contradictions(probs, y, known={0, 1}, threshold=0.9)
    assert r["contradicted"] == 1 and r["checked"] == 3 and r["new_class_examples"] == 1
    assert r["fraction"] == pytest.approx(1 / 3)
    assert r["examples"] == [{"index": 0, "label": 1, "predicted": 0, "confidence": pytest.approx(0.95)}]
    assert contradictions(probs, y, known={0, 1}, threshold=0.99)["contradicted"] == 0


def test_review_rows_order():
    probs = torch.tensor([[0.99, 0.01], [0.55, 0.45], [0.2, 0.8], [0.7, 0.3]])
    y = torch.tensor([1, 0, 1, 1])  # 0: contradicted at 0.99; 3: contradicted at 0.7; 1: least confident
    rows = review_rows(probs, y, top=2)
    assert [(r["index"], r["reason"]) for r in rows] == [(0, "contradicted"), (3, "contradicted"),
                                                         (1, "low_confidence")]
    assert rows[0]["label_probability"] == pytest.approx(0.01)
    unlabelled = review_rows(probs, None, top=1)
    assert unlabelled == [{"index": 1, "reason": "low_confidence", "predicted": 0, "confidence": pytest.approx(0.55)}]


@pytest.fixture
def registry(tmp_path):
    """A registry with one version of a tiny MLP (40 inputs, 10 classes); no training needed."""
    from ecotrain.continual.registry import Registry, Slice
    from ecotrain.models.vision1d import MLP

    reg = Registry(tmp_path / "reg")
    model = MLP(40, 10, hidden=[8])
    meta = {"parent": None, "config": {"name": "b", "model": {"name": "mlp", "kwargs": {"hidden": [8]}}},
            "input_shape": [40], "num_classes": 10, "classes_seen": [0, 1], "learnt_at": {}, "metrics": {"tasks": {}}}
    reg.commit(model.state_dict(), meta, {}, [Slice("t0", torch.randn(6, 40), torch.tensor([0, 1] * 3))],
               lambda idx, name: reg.make_current(idx, name, "test"))
    return reg


@pytest.mark.parametrize("arrays, message", [
    ({"x": np.zeros((8, 40), np.float32), "y": np.array(["cat"] * 8)}, r"label 'cat' \(row 0\) is not a class id"),
    ({"x": np.zeros((8, 40), np.float32), "y": np.full(8, 12)}, "holds class 12; the base model has 10 classes"),
    ({"x": np.zeros((8, 7), np.float32), "y": np.zeros(8, np.int64)}, r"shape \(7,\), the base model takes \(40,\)"),
    ({"x": np.zeros((8, 40), np.float32)}, "missing array 'y'"),
    ({"x": np.zeros((8, 40), np.float32), "y": np.zeros(8, np.int64), "cohort": np.zeros(3, np.int64)},
     "'cohort' must be one integer cohort key per row"),
])
def test_update_refuses_bad_incoming_data_in_one_line(registry, tmp_path, arrays, message):
    from ecotrain.assembly.update import UpdateOptions, update

    f = tmp_path / "new.npz"
    np.savez(f, **arrays)
    with pytest.raises(DataError, match=message) as err:
        update(registry.root, "current", f, [], UpdateOptions())
    assert "\n" not in str(err.value)
    assert not (registry.root / "work").exists()  # refused before anything was written
    assert sorted(registry.index()["versions"]) == ["v0001"]


def test_update_refuses_bad_overrides_before_training(registry, tmp_path):
    from ecotrain.assembly.update import UpdateOptions, update

    f = tmp_path / "task_1.npz"
    np.savez(f, x=np.zeros((10, 40), np.float32), y=np.array(["two", "three"] * 5))
    m = tmp_path / "map.yaml"
    m.write_text("two: 2\nthree: 3\n")  # the string labels pass through the map; the overrides do not
    with pytest.raises(ConfigError, match="config key 'loop.max_stepz': unknown key"):
        update(registry.root, "current", f, ["loop.max_stepz=3"], UpdateOptions(label_map=str(m)))
    with pytest.raises(ConfigError, match="methods.0"):
        update(registry.root, "current", f, ["methods=[{name: bogus}]"], UpdateOptions(label_map=str(m)))
    assert not (registry.root / "work").exists()
