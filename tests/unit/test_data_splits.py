"""load_data checks every split against the training one before anything trains (data/builtin.py
`_check_splits`): a test set of another width, test labels past the head, ids instead of class ids.
Each of these used to load, train, and then fail with a RuntimeError (or an allocation error) as
`fit failed`, exit 1."""

import numpy as np
import pytest
import torch

from ecotrain import Config
from ecotrain.data.builtin import load_data
from ecotrain.base.errors import DataError

RNG = np.random.default_rng(0)
X = RNG.normal(size=(60, 4)).astype(np.float32)
Y = np.arange(60) % 3


def _load(tmp_path, num_classes=None, **arrays):
    path = tmp_path / "d.npz"
    np.savez(path, **arrays)
    data = {"name": "npz", "path": str(path), "val_split": 0.1, "test_split": 0.2, "num_classes": num_classes}
    return load_data(Config.model_validate({"data": data}))


def test_a_test_set_of_another_width_is_refused(tmp_path):
    with pytest.raises(DataError, match=r"d\.npz: the test samples have shape \(7,\), the training samples \(4,\)"):
        _load(tmp_path, x=X, y=Y, x_test=np.zeros((10, 7), np.float32), y_test=Y[:10])


def test_a_test_set_of_another_shape_is_refused(tmp_path):
    """(2, 2) holds 4 numbers as (4,) does, but eval refuses it: fit must agree."""
    with pytest.raises(DataError, match=r"the test samples have shape \(2, 2\)"):
        _load(tmp_path, x=X, y=Y, x_test=X[:10].reshape(10, 2, 2), y_test=Y[:10])


def test_test_labels_past_the_training_classes(tmp_path):
    with pytest.raises(DataError, match=r"the test data: label 3 at row 3 is out of range .*from 0 to 2\).*"
                                        r"set data.num_classes"):
        _load(tmp_path, x=X, y=Y, x_test=X[:10], y_test=np.arange(10) % 5)
    bundle = _load(tmp_path, num_classes=5, x=X, y=Y, x_test=X[:10], y_test=np.arange(10) % 5)
    assert bundle.num_classes == 5


def test_ids_instead_of_class_ids(tmp_path):
    """One label of 1e9 made a 1e9-row output layer: a 64 GB allocation error after start-up."""
    with pytest.raises(DataError, match=r"label 1000000000 at row 3 would make a head of 1,000,000,001 classes "
                                        r"for 4 distinct labels.*return_inverse"):
        _load(tmp_path, x=X, y=np.where(np.arange(60) == 3, 10**9, Y))


def test_sparse_but_plausible_class_ids_still_load(tmp_path):
    bundle = _load(tmp_path, x=X, y=Y * 100, x_test=X[:6], y_test=np.array([0, 100, 200, 0, 100, 200]))
    assert bundle.num_classes == 201
    assert bundle.test.take(torch.arange(6))[0].shape == (6, 4)


def test_a_relative_data_path_not_found_names_the_folder_it_was_read_from(tmp_path, monkeypatch):
    """A run's config.yaml keeps data.path as given: `resume`/`eval` from another folder said only
    "data.path: d.npz not found", of a file the user can see."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as err:
        load_data(Config.model_validate({"data": {"name": "npz", "path": "d.npz"}}))
    assert str(err.value) == (f"data.path: d.npz not found (a relative path is read from the current folder, {tmp_path}); "
                              "give the .npz file")


def test_a_data_path_that_is_a_device_is_not_said_to_be_missing():
    with pytest.raises(DataError, match=r"^data.path: /dev/null is a device, not a regular file; give the .npz file$"):
        load_data(Config.model_validate({"data": {"name": "npz", "path": "/dev/null"}}))
