"""A recipe's `pkg.module:Dataset` with items of any structure (data/items.py): dicts, per-token
targets; checked like the Python API's, in one line; `ecotrain plan` and training take them."""

import pytest

from ecotrain import Config, fit
from ecotrain.data import load_data
from ecotrain.base.errors import DataError
from ecotrain.memory.estimate import make_plan

DS = "tests.helpers.lm_items:"


def _cfg(name="TokenDicts", **kwargs):
    return Config.model_validate({
        "seed": 1, "data": {"name": DS + name, "kwargs": kwargs, "batch_size": 8, "val_split": 0.125, "test_split": 0.125},
        "model": {"name": DS + "TinyLM"}, "task": {"name": "language_model"},
        "loop": {"max_steps": 6, "max_epochs": None, "eval_every": 3}, "logging": {"progress": "off"}})


def test_dict_items_load_split_by_item_and_keep_their_structure():
    b = load_data(_cfg())
    assert (len(b.train), len(b.val), len(b.test)) == (48, 8, 8)
    assert set(b.sample) == {"input_ids", "labels", "attention_mask"} and b.sample["labels"].shape == (1, 12)
    assert b.num_classes == 32 and b.input_shape == (12,)
    assert b.content_hash == load_data(_cfg()).content_hash


@pytest.mark.parametrize("name", ["TokenDicts", "TokenPairs"])
def test_a_recipe_trains_on_them(tmp_path, name):
    r = fit(_cfg(name), run_dir=tmp_path / "run")
    assert r.summary["steps"] == 6 and r.summary["test_loss"] > 0


def test_plan_measures_a_dict_batch():
    plan, _ = make_plan(_cfg())
    assert plan.act_bytes > 0


@pytest.mark.parametrize("bad, words", [
    ("shape", r"item 4 holds dict\(input_ids: int64\[13\].* where item 0 holds dict\(input_ids: int64\[12\]"),
    ("label", r"item 0: 'labels' holds -7 at position 3; targets must be ids 0 to 31, or -100"),
    ("vocab", r"item 0: 'labels' holds 32 at position 2"),
    ("nan", r"item 0: 'weights' holds NaN/Inf")])
def test_bad_items_are_one_line(bad, words):
    with pytest.raises(DataError, match=words):
        load_data(_cfg(bad=bad))


def test_too_few_items_for_the_splits():
    with pytest.raises(DataError, match="2 items are too few"):
        load_data(_cfg(n=2))


def test_a_users_model_by_import_path_trains_on_data_that_does_not_say_its_vocabulary(tmp_path):
    """`model.name: pkg.module:Class` sizes itself: the check that the built-in classifiers need class
    labels does not apply to it (it used to refuse this documented recipe)."""
    cfg = _cfg("UnsizedDicts")
    r = fit(cfg, run_dir=tmp_path / "run")
    assert r.summary["steps"] == 6 and r.summary["test_loss"] > 0
