import pytest

from ecotrain.config import Config, diff_configs, load_config, parse_overrides
from ecotrain.errors import ConfigError

RECIPE = "recipes/mnist1d_cnn.yaml"


def test_recipe_loads_with_named_keys():
    cfg = load_config(RECIPE, ["optim.lr=3e-3", "loop.max_epochs=5", "seed=7", "data.batch_size=64", "loop.max_steps=10"])
    assert cfg.optim.lr == 3e-3 and cfg.loop.max_epochs == 5 and cfg.seed == 7
    assert cfg.data.batch_size == 64 and cfg.loop.max_steps == 10 and cfg.name == "mnist1d_cnn"


def test_overrides_parse_yaml_scalars():
    assert parse_overrides(["a.b=3", "a.c=true", "d=null", "e=[1, 2]", "f=text"]) == \
        {"a": {"b": 3, "c": True}, "d": None, "e": [1, 2], "f": "text"}


@pytest.mark.parametrize("override, key, words", [
    ("optim.lrr=1", "optim.lrr", "unknown key"),
    ("optim.lr=-1", "optim.lr", "greater than 0"),
    ("data.batch_size=0", "data.batch_size", "greater than 0"),
    ("data.val_split=1.0", "data.val_split", "less than 1"),
    ("data.batch_size=abc", "data.batch_size", "integer"),
    ("schedule.name=wavy", "schedule.name", "constant"),
])
def test_bad_values_name_the_key(override, key, words):
    with pytest.raises(ConfigError) as e:
        load_config(RECIPE, [override])
    msg = str(e.value)
    assert f"'{key}'" in msg and words in msg and "\n" not in msg


def test_needs_a_budget():
    with pytest.raises(ConfigError, match="max_steps or loop.max_epochs"):
        load_config(None, ["loop.max_epochs=null"])


def test_missing_recipe_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_diff_configs_lists_dotted_changes():
    a = Config().to_dict()
    b = Config.model_validate({"optim": {"lr": 0.5}}).to_dict()
    assert diff_configs(a, b) == ["optim.lr: 0.001 -> 0.5"]


def test_cli_bad_config_is_one_line_exit_2(cli):
    r = cli("fit", RECIPE, "optim.lr=-1")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "optim.lr" in r.stderr and "Traceback" not in r.stderr
