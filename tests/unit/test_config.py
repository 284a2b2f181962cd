import pytest

from ecotrain.config import Config, diff_configs, load_config, parse_overrides
from ecotrain.base.errors import ConfigError

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


@pytest.mark.parametrize("override, key", [
    ("optim.lr=.inf", "optim.lr"), ("optim.lr=.nan", "optim.lr"), ("optim.weight_decay=.inf", "optim.weight_decay"),
    ("optim.betas=[0.9, .nan]", "optim.betas.1"), ("ledger.prices={cpu: .inf}", "ledger.prices.cpu"),
    ("budget.max_flops=.inf", "budget.max_flops"), ("distributed.timeout_seconds=.inf", "distributed.timeout_seconds"),
])
def test_every_float_is_finite(override, key):
    with pytest.raises(ConfigError) as e:
        load_config(RECIPE, [override])
    assert f"'{key}'" in str(e.value) and "finite" in str(e.value)


def test_every_float_field_refuses_inf():
    """The rule lives in the shared base section, so a float field added later is covered too."""
    import pydantic

    def walk(model):
        for name, field in model.model_fields.items():
            ann = field.annotation
            if isinstance(ann, type) and issubclass(ann, pydantic.BaseModel):
                yield from ((f"{name}.{k}", m) for k, m in walk(ann))
            elif ann is float or ann == (float | None):
                yield name, model
    floats = list(walk(Config))
    assert len(floats) > 10
    for dotted, model in floats:
        assert model.model_config.get("allow_inf_nan") is False, dotted


@pytest.mark.parametrize("name", ["../../escaped", "a/b", "a\\b", ".", "..", ".hidden", "", "-x", "x" * 200])
def test_run_name_is_not_a_path(name):
    with pytest.raises(ConfigError, match="not a path"):
        load_config(None, [f"name={name!r}"] if name else ["name=''"])


@pytest.mark.parametrize("name", ["run", "mnist1d_cnn", "exp-3.lr+wd", "Été_2"])
def test_run_name_accepts_names(name):
    assert load_config(None, [f"name={name}"]).name == name


def test_recipe_stem_becomes_a_valid_name(tmp_path):
    p = tmp_path / "my recipe (v2).yaml"
    p.write_text("seed: 1\n")
    assert load_config(p).name == "my-recipe-v2"


def test_empty_recipe_is_refused_but_an_empty_mapping_is_all_defaults(tmp_path):
    for text in ("", "# only a comment\n", "\n\n"):
        p = tmp_path / "empty.yaml"
        p.write_text(text)
        with pytest.raises(ConfigError, match="recipe is empty"):
            load_config(p)
    p.write_text("{}\n")
    assert load_config(p).optim.lr == Config().optim.lr


def test_unreadable_recipes_are_one_line(tmp_path):
    p = tmp_path / "bytes.yaml"
    p.write_bytes(bytes(range(128, 256)) * 3)
    with pytest.raises(ConfigError, match="not a text file"):
        load_config(p)
    with pytest.raises(ConfigError, match="is a folder"):
        load_config(tmp_path)


def test_mnist1d_needs_a_minimum_of_samples():
    with pytest.raises(ConfigError, match=r"'data.num_samples': must be >= 100"):
        load_config(None, ["data.num_samples=1"])
    assert load_config(None, ["data.num_samples=100"]).data.num_samples == 100


@pytest.mark.parametrize("override, line", [
    ("threads=0", "config key 'threads': Input should be 'auto', or greater than 0 (got 0)"),
    ("threads=many", "config key 'threads': Input should be 'auto', or a valid integer"),
    ("memory.activation_checkpointing=some", "config key 'memory.activation_checkpointing': Input should be 'off' "
                                             "or 'all', or a valid dictionary"),
])
def test_a_value_no_union_member_takes_is_one_problem_named_by_its_key(override, line):
    """It was "config key 'threads.literal['auto']': Input should be 'auto' (got 0) (and 1 more problem
    after this one)": pydantic's tag for a Union member in the key, the member's want as the whole rule."""
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert line in str(err.value) and "more problem" not in str(err.value), str(err.value)


@pytest.mark.parametrize("name", ["digits", "npz", "csv", "parquet:shards"])
def test_data_kwargs_for_a_source_that_reads_none_are_refused(name):
    """data.kwargs.num_samples=500 for digits was silently ignored: the run trained on all of it."""
    with pytest.raises(ConfigError, match=rf"data.kwargs \['num_samples'\]: data.name={name} takes none"):
        load_config(None, [f"data.name={name}", "data.kwargs.num_samples=500"])
    load_config(None, ["data.name=mnist1d", "data.kwargs.seed=3"])  # mnist1d's generator takes them


def test_a_recipe_that_is_a_device_is_not_said_to_be_missing():
    with pytest.raises(ConfigError, match=r"^recipe: /dev/null is a device, not a regular file; give a recipe file \(YAML\)"):
        load_config("/dev/null")
