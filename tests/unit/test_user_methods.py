"""Third-party methods in a config: `methods: [{name: pkg.module:MyMethod, **kwargs}]`."""

import json

import pytest

from ecotrain import Config, fit
from ecotrain.config import load_config
from ecotrain.config.methods import EmaConfig, UserMethodConfig
from ecotrain.base.errors import ConfigError
from ecotrain.methods import build_methods
from tests.helpers.user_methods import Keyed, StepCounter

HELPERS = "tests.helpers.user_methods"


def _methods(*entries) -> Config:
    return Config.model_validate({"methods": list(entries)})


def test_an_import_path_entry_keeps_its_other_keys_as_kwargs_and_round_trips():
    cfg = _methods({"name": f"{HELPERS}:StepCounter", "start": 3, "label": "n"}, {"name": "ema"})
    user, ema = cfg.methods
    assert isinstance(user, UserMethodConfig) and isinstance(ema, EmaConfig)
    assert user.kwargs == {"start": 3, "label": "n"}
    assert Config.model_validate(cfg.to_dict()).methods == cfg.methods  # config.yaml -> resume


def test_build_methods_builds_user_methods_in_config_order():
    cfg = _methods({"name": f"{HELPERS}:StepCounter", "start": 3}, {"name": f"{HELPERS}:Keyed"},
                   {"name": f"{HELPERS}:make_counter", "start": 1}, {"name": "ema"})
    counter, keyed, made, ema = build_methods(cfg).methods
    assert isinstance(counter, StepCounter) and counter.start == 3
    assert counter.key == "StepCounter"  # no key of its own: its class name, as a callback's state_key
    assert isinstance(keyed, Keyed) and keyed.key == "keyed"
    assert isinstance(made, StepCounter) and made.label == "from_factory" and made.start == 1
    assert made.key == "made" and ema.key == "ema"
    with pytest.raises(ConfigError, match="'StepCounter' is listed twice"):  # one state key each
        build_methods(_methods({"name": f"{HELPERS}:StepCounter"}, {"name": f"{HELPERS}:StepCounter", "start": 1}))


@pytest.mark.parametrize("entry, words", [
    ({"name": f"{HELPERS}_nope:StepCounter"}, ["methods.0.name", "cannot import", "Method subclass"]),
    ({"name": f"{HELPERS}:Nope"}, ["methods.0.name", "has no attribute 'Nope'"]),
    ({"name": ":StepCounter"}, ["methods.0.name", "not an import path"]),
    ({"name": f"{HELPERS}:NotAMethod"}, ["methods.0", "gave a NotAMethod, not an ecotrain Method"]),
    ({"name": f"{HELPERS}:StepCounter", "stat": 1}, ["methods.0", "TypeError", "'stat'", "keyword arguments"]),
    ({"name": f"{HELPERS}:Refuses", "alpha": 2}, ["methods.0", "ValueError: alpha must be in [0, 1], got 2"]),
])
def test_a_bad_user_method_is_one_line_naming_the_entry(entry, words):
    with pytest.raises(ConfigError) as e:
        build_methods(_methods(entry))
    msg = str(e.value)
    assert all(w in msg for w in words) and "\n" not in msg, msg


@pytest.mark.parametrize("override, words", [
    ("methods=[{name: bogus}]", ["'methods.0'", "'bogus'", "'ema'", "'pkg.module:Method'"]),
    ("methods=[{name: ema, decayy: 1}]", ["'methods.0.ema.decayy'", "unknown key"]),
    ("methods=[{name: batch_ramp}]", ["'methods.0.batch_ramp.lr_scaling'", "Field required"]),
    ("methods=[{name: batchnorm, policy: momentum}]", ["'methods.0.batchnorm'", "needs a value"]),
])
def test_built_in_names_keep_their_checked_sections(override, words):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    msg = str(e.value)
    assert all(w in msg for w in words) and "\n" not in msg, msg


def test_a_user_method_named_in_the_config_runs_in_fit(tiny_cfg, tmp_path):
    cfg = tiny_cfg(methods=[{"name": f"{HELPERS}:StepCounter", "start": 10, "label": "after_10"}])
    r = fit(cfg, run_dir=tmp_path / "r", quiet=True)
    counter = next(m for m in r.state.methods.methods if isinstance(m, StepCounter))
    assert r.state.step == 60 and counter.steps == 50  # its on_step_end ran every step after the 10th
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["methods"]["StepCounter"] == {"after_10": 50}
    written = load_config(tmp_path / "r" / "config.yaml")  # the run folder's config names it again
    assert written.methods[0].kwargs == {"start": 10, "label": "after_10"}
