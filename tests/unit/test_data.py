import numpy as np
import pytest
import torch

from ecotrain.config import Config
from ecotrain.data import EpochSampler, load_data, stratified_split
from ecotrain.data.augment import SignalAugment
from ecotrain.data.builtin import validate_arrays
from ecotrain.base.errors import DataError


def test_stratified_split_keeps_class_ratios_and_is_seeded():
    y = torch.tensor([0] * 80 + [1] * 20)
    keep, held = stratified_split(y, 0.25, seed=3)
    assert len(held) == 25 and (y[held] == 1).sum() == 5
    assert set(keep.tolist()) | set(held.tolist()) == set(range(100)) and not set(keep.tolist()) & set(held.tolist())
    assert torch.equal(held, stratified_split(y, 0.25, seed=3)[1])
    assert not torch.equal(held, stratified_split(y, 0.25, seed=4)[1])


def test_sampler_order_is_a_function_of_seed_and_epoch_and_resumes():
    s = EpochSampler(10, 3, seed=1)
    assert len(s) == 4
    full = torch.cat(list(s.batches(0)))
    assert sorted(full.tolist()) == list(range(10))
    assert torch.equal(torch.cat(list(s.batches(0, start=2))), full[6:])
    assert not torch.equal(full, torch.cat(list(s.batches(1))))


@pytest.mark.parametrize("x, y, words", [
    (torch.zeros(3, 2), torch.tensor([0, 1]), "3 feature rows but 2 labels"),
    (torch.tensor([[0.0], [float("nan")]]), torch.tensor([0, 1]), "NaN/Inf (first at row 1)"),
    (torch.zeros(2, 1), torch.tensor([0, -1]), "label -1 at row 1"),
    (torch.zeros(2, 1), torch.tensor([0.0, 0.5]), "integer class ids"),
])
def test_bad_data_is_refused(x, y, words):
    with pytest.raises(DataError, match=words.replace("(", r"\(").replace(")", r"\)")):
        validate_arrays(x, y, "train")


def test_label_out_of_range_for_known_classes():
    with pytest.raises(DataError, match="label 10 at row 0 is out of range"):
        validate_arrays(torch.zeros(1, 2), torch.tensor([10]), "train", num_classes=10)


def test_npz_and_csv_sources(tmp_path):
    x = np.random.default_rng(0).normal(size=(60, 4)).astype(np.float32)
    y = np.arange(60) % 3
    np.savez(tmp_path / "d.npz", x=x, y=y)
    b = load_data(Config.model_validate({"data": {"name": "npz", "path": str(tmp_path / "d.npz")}}))
    assert b.num_classes == 3 and b.input_shape == (4,) and len(b.train) + len(b.val) + len(b.test) == 60
    rows = ["a,b,label"] + [f"{i},{i * 2},{i % 2}" for i in range(20)]
    (tmp_path / "d.csv").write_text("\n".join(rows))
    b = load_data(Config.model_validate({"data": {"name": "csv", "path": str(tmp_path / "d.csv")}}))
    assert b.input_shape == (2,) and b.num_classes == 2
    (tmp_path / "bad.csv").write_text("a,label\n1,0\nx,1\n")
    with pytest.raises(DataError, match="bad.csv:3: not a number"):
        load_data(Config.model_validate({"data": {"name": "csv", "path": str(tmp_path / "bad.csv")}}))


def test_empty_split_is_refused(tmp_path):
    np.savez(tmp_path / "d.npz", x=np.zeros((1, 2), np.float32), y=np.zeros(1, int))
    with pytest.raises(DataError, match="empty"):
        load_data(Config.model_validate({"data": {"name": "npz", "path": str(tmp_path / "d.npz"), "test_split": 0.0}}))


def test_mnist1d_offline_and_hash_is_stable():
    cfg = Config.model_validate({"data": {"num_samples": 500}})
    a, b = load_data(cfg), load_data(cfg)
    assert a.input_shape == (40,) and a.num_classes == 10 and len(a.test) == 100
    assert a.content_hash == b.content_hash and a.content_hash.startswith("sha256:")


def test_augment_is_seeded_and_preserves_shape():
    from ecotrain.config import AugmentConfig
    x = torch.randn(8, 40)
    a1, a2 = SignalAugment(AugmentConfig(shift=3, scale=0.1, noise=0.05), 0), SignalAugment(AugmentConfig(shift=3, scale=0.1, noise=0.05), 0)
    assert torch.equal(a1(x), a2(x)) and a1(x).shape == x.shape and not torch.equal(a1(x), x)


def _csv_cfg(path, **data):
    return Config.model_validate({"data": {"name": "csv", "path": str(path), **data}})


def test_csv_columns_are_read_by_name(tmp_path):
    """The feature columns' names (and order) are the model's input contract: kept in the bundle for
    summary.json, and data.features picks them by name in its order."""
    rows = ["b,label,a"] + [f"{i},{i % 2},{-i}" for i in range(20)]
    (tmp_path / "d.csv").write_text("\n".join(rows))
    b = load_data(_csv_cfg(tmp_path / "d.csv", val_split=0.0, test_split=0.0))
    assert b.extra["inputs"] == {"columns": ["b", "a"]} and torch.equal(b.train.x[:3, 0], torch.tensor([0., 1, 2]))
    b = load_data(_csv_cfg(tmp_path / "d.csv", val_split=0.0, test_split=0.0, features=["a", "b"]))
    assert b.extra["inputs"] == {"columns": ["a", "b"]} and torch.equal(b.train.x[:3, 0], torch.tensor([0., -1, -2]))
    with pytest.raises(DataError, match=r"d.csv: no feature column 'c' \(columns: \['b', 'label', 'a'\]\)"):
        load_data(_csv_cfg(tmp_path / "d.csv", features=["a", "c"]))


@pytest.mark.parametrize("header, said", [
    ("a,label,b,label", "column 'label' is named 2 times in the header (columns 2, 4)"),
    ("a,a,label", "column 'a' is named 2 times in the header (columns 1, 2)"),
])
def test_a_csv_column_named_twice_is_refused(tmp_path, header, said):
    width = len(header.split(","))
    (tmp_path / "d.csv").write_text(header + "\n" + "\n".join(",".join(["1"] * width) for _ in range(10)))
    with pytest.raises(DataError) as err:
        load_data(_csv_cfg(tmp_path / "d.csv"))
    assert str(err.value) == f"{tmp_path / 'd.csv'}: {said}; columns are read by name: rename or drop all but one"


def test_npz_features_of_width_0_are_refused(tmp_path):
    np.savez(tmp_path / "d.npz", x=np.zeros((30, 0), np.float32), y=np.arange(30) % 3)
    with pytest.raises(DataError) as err:
        load_data(Config.model_validate({"data": {"name": "npz", "path": str(tmp_path / "d.npz")}}))
    assert str(err.value) == (f"{tmp_path / 'd.npz'} x/y: features have shape (30, 0), so each sample has no "
                              "features at all; save at least one feature per sample")
