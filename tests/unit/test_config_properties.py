"""Property-based tests of the config parser and the override syntax: whatever a recipe or an
override holds, `load_config` returns a valid Config or raises ConfigError with a one-line message,
never another exception (hypothesis generates the inputs; about 200 examples each, a few seconds)."""

import atexit
import inspect
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import get_args

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from ecotrain.config import Config, load_config, parse_overrides
from ecotrain.base.errors import ConfigError

# derandomize: the same examples on every run (CI stays stable); a YAML file per example costs ~5 ms
PROFILE = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
FILES = settings(PROFILE, max_examples=120)


def _sections(model=Config, prefix=""):
    """Every dotted key of the schema, with the nested sections' own keys."""
    out = []
    for name, field in model.model_fields.items():
        out.append(prefix + name)
        for t in (field.annotation, *get_args(field.annotation)):
            if isinstance(t, type) and issubclass(t, BaseModel):
                out += _sections(t, f"{prefix}{name}.")
    return out


DOTTED = _sections()
NAMES = sorted({k.rsplit(".", 1)[-1] for k in DOTTED} | {"name", "ema", "batchnorm", "finetune"})
ODD = "\n\r\t\x00\x85\u2028=.[]{}:,#&*!|>'\"%@`- é漢😀"

odd_text = st.text(alphabet=st.sampled_from(ODD) | st.characters(), max_size=12)
keys = st.sampled_from(NAMES) | odd_text
scalars = (st.none() | st.booleans() | st.integers() | st.integers(-10, 10) | st.floats() | odd_text
           | st.sampled_from(["2001-02-30", "2001-02-03", "1e400", ".inf", ".nan", "0x1F", "~", "yes", "adamw", "cpu",
                              "mlp", "digits", "rollback", "-1", "0", "1.5"]))
trees = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=5),
                     max_leaves=12)


def _check(make):
    """`make()` is a Config, or a ConfigError of one non-empty line; anything else fails the test."""
    try:
        cfg = make()
    except ConfigError as exc:
        msg = str(exc)
        assert msg.strip() and len(msg.splitlines()) == 1, repr(msg)
        return None
    assert isinstance(cfg, Config)
    Config.model_validate(cfg.to_dict())  # what a run writes to config.yaml loads back
    return cfg


RECIPE = Path(tempfile.mkdtemp(prefix="ecotrain-props-")) / "recipe.yaml"  # one file, rewritten per example
atexit.register(shutil.rmtree, RECIPE.parent, True)


def _recipe(text: str | bytes):
    RECIPE.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    return _check(lambda: load_config(RECIPE))


def _with_path(tree: dict, dotted: str, value):
    node = tree
    *path, last = dotted.split(".")
    for k in path:
        node = node.setdefault(k, {}) if isinstance(node.get(k, {}), dict) else {}
    node[last] = value
    return tree


@FILES
@given(tree=st.dictionaries(keys, trees, max_size=6))
def test_any_yaml_mapping_loads_or_fails_in_one_line(tree):
    _recipe(yaml.safe_dump(tree, allow_unicode=True))


@FILES
@given(dotted=st.sampled_from(DOTTED), value=trees)
def test_a_real_key_with_any_value_loads_or_fails_in_one_line(dotted, value):
    base = {"data": {"name": "digits"}, "model": {"name": "mlp"}}
    _recipe(yaml.safe_dump(_with_path(base, dotted, value), allow_unicode=True))


@PROFILE
@given(text=st.text(alphabet=st.sampled_from(ODD + "ab: \n-[]{}!&*|>01") | st.characters(), max_size=80)
       | st.binary(max_size=40)
       | st.integers(1, 60).map(lambda n: "a: " + "[" * n + "]" * n)  # PyYAML's scanner is quadratic in depth
       | st.integers(1, 60).map(lambda n: "a:\n" + "".join("  " * i + f"k{i}:\n" for i in range(n)) + "  " * n + "v"))
def test_any_text_as_a_recipe_loads_or_fails_in_one_line(text):
    _recipe(text)


override_keys = st.lists(st.sampled_from(NAMES) | odd_text, min_size=1, max_size=4).map(".".join)
override_values = odd_text | scalars.map(str) | trees.map(lambda t: yaml.safe_dump(t, default_flow_style=True).strip())
overrides = (st.tuples(override_keys, st.sampled_from(["=", "==", "", "=[", "]="]), override_values).map("".join)
             | st.tuples(st.sampled_from(DOTTED), override_values).map("=".join)
             | odd_text)


@PROFILE
@given(items=st.lists(overrides, max_size=5))
def test_any_overrides_load_or_fail_in_one_line(items):
    _check(lambda: load_config(None, items))


@PROFILE
@given(items=st.lists(overrides, max_size=5))
def test_parse_overrides_gives_a_mapping_or_one_line(items):
    try:
        tree = parse_overrides(items)
    except ConfigError as exc:
        assert len(str(exc).splitlines()) == 1, repr(str(exc))
        return
    assert isinstance(tree, dict)


@contextmanager
def _shallow_stack(room: int = 150):
    """A recursion limit `room` frames above here: deep YAML fails fast (PyYAML is slow at depth)."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack(0)) + room)
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


@pytest.mark.parametrize("item, words", [
    ("seed=2001-02-30", "seed"),  # a YAML date out of range raised ValueError
    ("name=" + "[" * 300, "name"),  # deep nesting raised RecursionError
    ("a\nb=1", "unknown key"),  # a line break in a key made a two-line message
    (".a=1", "empty"),  # an empty key part read as '(top level)'
])
def test_overrides_found_by_hypothesis(item, words):
    with pytest.raises(ConfigError, match=words) as info, _shallow_stack():
        load_config(None, [item])
    assert len(str(info.value).splitlines()) == 1


@pytest.mark.parametrize("text, words", [
    ("seed: 2001-02-30\n", "not valid YAML"),
    ("a: " + "[" * 300 + "]" * 300 + "\n", "nested too deeply"),
    ('"a\\nb": 1\n', "unknown key"),
])
def test_recipes_found_by_hypothesis(text, words, tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=words) as info, _shallow_stack():
        load_config(p)
    assert len(str(info.value).splitlines()) == 1
