"""User files, import paths and datasets that cannot be used: each is one DataError/ConfigError line.
(The same inputs through the real CLI: tests/hostile.)"""

import numpy as np
import pytest
import torch

from ecotrain.accounting.compare import load_run
from ecotrain.accounting.report import read_ledger
from ecotrain.config import Config
from ecotrain.base.objects import describe, import_object
from ecotrain.data.builtin import load_data, validate_arrays
from ecotrain.data.split import stratified_split
from ecotrain.base.errors import ConfigError, DataError


def cfg(**data):
    return Config.model_validate({"data": {"batch_size": 8, **data}, "model": {"name": "mlp"}})


def test_label_range_is_stated():
    x = torch.zeros(4, 2)
    with pytest.raises(DataError, match=r"label 7 at row 2 is out of range \(labels must be class ids from 0 to 4\)"):
        validate_arrays(x, torch.tensor([0, 1, 7, 2]), "d", 5)
    with pytest.raises(DataError, match=r"label -2 at row 1 .*class ids 0 or more\)"):
        validate_arrays(x, torch.tensor([0, -2, 1, 2]), "d")


def test_describe_is_one_short_line():
    text = describe(RuntimeError("a\nb\n\n  c" + "x" * 1000))
    assert "\n" not in text and text.startswith("RuntimeError: a b c") and len(text) < 330


def test_unreadable_npz_is_a_data_error(tmp_path, monkeypatch):
    np.savez(tmp_path / "ok.npz", x=np.zeros((20, 3), np.float32), y=np.arange(20) % 2)

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr("ecotrain.base.safefile.os.open", denied)  # as a non-root user would see it (safefile opens it)
    with pytest.raises(DataError, match=r"ok.npz: cannot read the .npz file \(Permission denied\)"):
        load_data(cfg(name="npz", path=str(tmp_path / "ok.npz")))


def test_object_arrays_are_refused_without_unpickling(tmp_path):
    np.savez(tmp_path / "o.npz", x=np.array([object()] * 4, dtype=object), y=np.arange(4))
    with pytest.raises(DataError, match="dtype=object.*never unpickles"):
        load_data(cfg(name="npz", path=str(tmp_path / "o.npz")))


def test_csv_in_another_encoding(tmp_path):
    (tmp_path / "l.csv").write_bytes("label,caf\u00e9\n1,2\n".encode("latin-1"))
    with pytest.raises(DataError, match="not UTF-8 text"):
        load_data(cfg(name="csv", path=str(tmp_path / "l.csv")))


def test_a_byte_order_mark_is_not_part_of_the_header(tmp_path):
    rows = "label,a,b\n" + "".join(f"{i % 2},{i},{-i}\n" for i in range(40))
    (tmp_path / "bom.csv").write_bytes(rows.encode("utf-8-sig"))
    assert load_data(cfg(name="csv", path=str(tmp_path / "bom.csv"), test_split=0.2)).num_classes == 2


def test_import_paths_whose_module_fails(tmp_path, monkeypatch):
    (tmp_path / "explodes.py").write_text("import sys\nsys.exit(3)\n")
    (tmp_path / "raises.py").write_text("raise OSError('no GPU here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(DataError, match=r"importing module 'raises' .*raised OSError: no GPU here"):
        import_object("raises:X", "data.name")
    with pytest.raises(DataError, match="raised SystemExit"):
        import_object("explodes:X", "model.name")
    with pytest.raises(DataError, match="not an import path"):
        import_object("raises:", "data.name")


class _Items(torch.utils.data.Dataset):
    def __init__(self, bad=None):
        self.bad = bad

    def __len__(self):
        return 20

    def __getitem__(self, i):
        if i == 3 and self.bad == "raise":
            raise IndexError("gone")
        if i == 3 and self.bad == "nan":
            return torch.tensor([float("nan"), 0.0]), 1
        if i == 3 and self.bad == "label":
            return torch.zeros(2), torch.zeros(2)
        return torch.full((2,), float(i % 2)), i % 2


@pytest.mark.parametrize("bad, words", [("raise", "item 3 raised IndexError: gone"), ("nan", "item 3: x holds NaN"),
                                        ("label", "item 3: y must be one integer class id")])
def test_every_dataset_item_is_checked_once(bad, words, monkeypatch):
    import sys
    import types

    mod = types.ModuleType("fake_ds_mod")
    mod.make = lambda: _Items(bad)
    monkeypatch.setitem(sys.modules, "fake_ds_mod", mod)
    with pytest.raises(DataError, match=words):
        load_data(cfg(name="fake_ds_mod:make"))


def test_good_dataset_labels_read_once(monkeypatch):
    import sys
    import types

    mod = types.ModuleType("fake_ds_ok")
    mod.make = lambda: _Items()
    monkeypatch.setitem(sys.modules, "fake_ds_ok", mod)
    bundle = load_data(cfg(name="fake_ds_ok:make", test_split=0.2, val_split=0.2))
    assert bundle.num_classes == 2 and len(bundle.train) + len(bundle.val) + len(bundle.test) == 20


def test_empty_labels_split_to_nothing():
    keep, held = stratified_split(torch.zeros(0, dtype=torch.long), 0.5, 0)
    assert len(keep) == 0 and len(held) == 0


def test_val_split_that_empties_train(tmp_path):
    np.savez(tmp_path / "t.npz", x=np.zeros((3, 2), np.float32), y=np.arange(3))
    with pytest.raises(DataError, match="leaves the train split empty"):
        load_data(cfg(name="npz", path=str(tmp_path / "t.npz"), test_split=0, val_split=0.6))


def test_compare_and_ledger_name_what_they_looked_for(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match=r"not a run folder \(no summary.json"):
        load_run(str(tmp_path))
    with pytest.raises(ConfigError, match=r"not a run folder \(no ledger.json"):
        read_ledger(tmp_path)
    (tmp_path / "config.yaml").write_text("name: x\n")
    (tmp_path / "ledger.json").write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="ledger.json: not readable JSON"):
        read_ledger(tmp_path)
    (tmp_path / "ledger.json").write_text("[1]")
    with pytest.raises(ConfigError, match="not an ecotrain ledger"):
        read_ledger(tmp_path)
