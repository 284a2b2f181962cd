"""data_formats.py: one table of the data formats, which the config's kwargs check, load_data and a
language model's NEW_DATA all consult; one CSV reading for training data and for files to predict."""

import subprocess
import sys

import pytest
import torch
from pydantic import ValidationError

from ecotrain.export import contract
from ecotrain.config import Config
from ecotrain.assembly.update_lm import data_name
from ecotrain.data import load_data
from ecotrain.data.builtin import reader
from ecotrain.base.data_formats import FILES, FORMATS, data_format
from ecotrain.base.errors import ConfigError, DataError
from ecotrain.export.inference import data_config


def test_every_format_names_a_reader_and_a_name_finds_its_format():
    assert len({f.name for f in FORMATS}) == len(FORMATS)
    for fmt in FORMATS:
        assert callable(reader(fmt)), fmt.reader
    assert data_format("csv").name == "csv" and data_format("tokens:runs/a.bin").name == "tokens:"
    assert data_format("hf:some/folder").name == "hf:" and data_format("shards:b-{0..2}.bin").name == "shards:"
    assert data_format("csvs") is None and data_format("mypkg.data:Rows") is None  # an import path


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_the_config_refuses_kwargs_exactly_where_the_table_says_a_format_takes_none(fmt):
    name = fmt.name + ("some/path" if fmt.name.endswith(":") else "")
    tree = {"data": {"name": name, "kwargs": {"seq_len": 8}}}
    if fmt.kwargs:
        assert Config.model_validate(tree).data.kwargs == {"seq_len": 8}
    else:
        with pytest.raises(ValidationError, match=rf"data.name={name} takes none"):
            Config.model_validate(tree)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_new_data_of_a_language_model_is_any_token_format_of_the_table(fmt):
    name = fmt.name + ("some/path" if fmt.name.endswith(":") else "")
    if fmt.tokens:
        assert data_name(name) == name
    else:
        with pytest.raises(ConfigError, match="a language model's new data is token data"):
            data_name(name)


def test_training_and_predicting_read_a_csv_alike(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("b,label,a\n1,0,2.5\n3,1,4\n5,1,6\n")
    cfg = Config.model_validate({"data": {"name": "csv", "path": str(path), "features": ["a", "b"],
                                          "val_split": 0.0, "test_split": 0.0}})
    bundle = load_data(cfg)
    x, y = bundle.train.take(torch.arange(3))
    assert bundle.extra["inputs"] == {"columns": ["a", "b"]}
    fx, fy = contract.read_file(path, ["a", "b"], True, "label", "--data", path)
    assert torch.equal(fx, x) and torch.equal(fy, y) and fx.tolist() == [[2.5, 1], [4, 3], [6, 5]]
    unlabelled, none = contract.read_file(path, ["a", "b"], True, "target", "--data", path)  # no column 'target'
    assert none is None and torch.equal(unlabelled, x)


def test_the_table_imports_no_reader_and_no_torch():
    code = ("import sys\nfrom ecotrain.base.data_formats import FORMATS\n"
            "loaded = [m for m in sys.modules if m == 'torch' or m.startswith('ecotrain.data.')]\n"
            "assert not loaded, loaded")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_a_data_file_is_a_file_format_of_the_table(tmp_path):
    assert FILES == ("npz", "csv")
    path = tmp_path / "rows.csv"
    path.write_text("a,label\n1,0\n2,1\n")
    dcfg, label = data_config(Config(), [str(path)])
    assert dcfg.data.name == "csv" and dcfg.data.path == str(path) and label == "rows"
    with pytest.raises(DataError, match=r"not a \.npz or \.csv file"):
        data_config(Config(), [str(tmp_path / "rows.parquet")])
