"""hf:PATH (data/hf.py): a `datasets` dataset saved with save_to_disk, read memory-mapped."""

import numpy as np
import pytest
import torch

datasets = pytest.importorskip("datasets")

from ecotrain.config import build_config  # noqa: E402
from ecotrain.data import load_data  # noqa: E402
from ecotrain.base.errors import DataError  # noqa: E402


def _make(n=200, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 2, 4)).astype(np.float32)
    y = (x[:, 0, 0] > 0).astype(np.int64)
    feats = datasets.Features({"img": datasets.Array2D((2, 4), "float32"),
                               "label": datasets.ClassLabel(num_classes=3), "note": datasets.Value("string")})
    return datasets.Dataset.from_dict({"img": x, "label": y, "note": ["n"] * n}, features=feats), x, y


def _load(path, **data):
    return load_data(build_config({"data": {"name": f"hf:{path}", "features": ["img"], **data}}))


def test_a_saved_dataset_dict_keeps_its_splits_and_classes(tmp_path):
    ds, x, y = _make()
    datasets.DatasetDict({"train": ds.select(range(150)), "validation": ds.select(range(150, 180)),
                          "test": ds.select(range(180, 200))}).save_to_disk(str(tmp_path / "dd"))
    b = _load(tmp_path / "dd")
    assert (len(b.train), len(b.val), len(b.test)) == (150, 30, 20)
    assert b.input_shape == (2, 4) and b.num_classes == 3  # the ClassLabel's count, not max + 1
    bx, by = b.train.take(torch.tensor([7, 3]))
    assert np.array_equal(bx.numpy(), x[[7, 3]]) and by.tolist() == y[[7, 3]].tolist()
    bx, _ = b.val.take(torch.tensor([0]))
    assert np.array_equal(bx.numpy(), x[[150]])


def test_a_saved_dataset_is_split_and_hashed_from_metadata(tmp_path):
    ds, _, _ = _make()
    ds.save_to_disk(str(tmp_path / "d"))
    b = _load(tmp_path / "d", val_split=0.1, test_split=0.2)
    assert len(b.train) + len(b.val) + len(b.test) == 200
    assert _load(tmp_path / "d", val_split=0.1, test_split=0.2).content_hash == b.content_hash
    _make(seed=1)[0].save_to_disk(str(tmp_path / "e"))
    assert _load(tmp_path / "e", val_split=0.1, test_split=0.2).content_hash != b.content_hash


@pytest.mark.parametrize("case, expect", [
    ("missing_feature", r"no feature column 'pixels'"),
    ("missing_label", r"no label column 'y'"),
    ("text_feature", r"column 'note' is string, not numbers"),
    ("not_saved", r"not a saved dataset"),
    ("truncated", r"cannot open the saved dataset"),
])
def test_bad_hf_input_fails_in_one_line(tmp_path, case, expect):
    ds, _, _ = _make()
    d = tmp_path / "d"
    ds.save_to_disk(str(d))
    over = {"missing_feature": {"features": ["pixels"]}, "missing_label": {"target": "y"},
            "text_feature": {"features": ["note"]}}.get(case, {})
    if case == "not_saved":
        d = tmp_path / "empty"
        d.mkdir()
    if case == "truncated":
        arrow = next(d.glob("*.arrow"))
        arrow.write_bytes(arrow.read_bytes()[:200])
    with pytest.raises(DataError, match=expect) as e:
        _load(d, **over)
    assert "\n" not in str(e.value)
