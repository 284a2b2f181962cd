"""A built-in method is registered in one place, its config section (config/methods.py): the section's
`impl` names the Method class, `build_methods` imports it only when a recipe names the method."""

import subprocess
import sys
from typing import Literal

import pytest
from pydantic import ValidationError

from ecotrain import Config
from ecotrain.config.methods import BUILTIN_METHODS, _Builtin
from ecotrain.methods import Method, build_methods, builtin_class

# The fields each method requires, at their smallest; the rest are defaults.
REQUIRED = {"batch_ramp": {"lr_scaling": "none"}, "curriculum": {"score": "file", "path": "scores.npy"},
            "late_freeze": {"freeze_depth": 1}, "distill": {"teacher": "teacher-run"},
            "adapters": {"target_modules": ["fc"]}}
NAMES = [cls.model_fields["name"].annotation.__args__[0] for cls in BUILTIN_METHODS]


def test_every_section_names_a_method_class_of_its_own_module():
    assert len(NAMES) == len(set(NAMES)) == 18  # the sections defined in config/methods.py, each once
    for cls in BUILTIN_METHODS:
        module, _, name = cls.impl.partition(":")
        assert module.startswith("ecotrain.methods.") and name, cls.impl
        method_cls = builtin_class(cls.model_construct())
        assert issubclass(method_cls, Method) and method_cls.__name__ == name, cls.impl


@pytest.mark.parametrize("name", NAMES)
def test_build_methods_builds_every_builtin_from_its_smallest_entry(name, tiny_cfg):
    cfg = tiny_cfg(methods=[{"name": name, **REQUIRED.get(name, {})}])
    (method,) = build_methods(cfg).methods
    assert type(method) is builtin_class(cfg.methods[0]) and method.key == name


def test_a_new_section_registers_itself_and_only_a_section_with_impl_does():
    before = len(BUILTIN_METHODS)

    class _Shared(_Builtin):  # a base shared by sections (as _FromSection is): no impl, not a method
        pass

    from ecotrain.config.methods import _REGISTERED

    class ToyConfig(_Shared):
        name: Literal["toy"]
        impl = "ecotrain.methods.ema:EMA"

    try:
        assert _REGISTERED[-1] is ToyConfig and _Shared not in _REGISTERED
    finally:
        _REGISTERED.remove(ToyConfig)
    assert len(BUILTIN_METHODS) == before  # the union is fixed at import: a test's section does not leak


def test_an_unknown_name_is_refused_with_the_builtin_names():
    with pytest.raises(ValidationError, match="'batch_ramp'.*'adapters'"):
        Config.model_validate({"methods": [{"name": "bogus"}]})


def test_parsing_a_recipe_with_methods_imports_neither_torch_nor_their_modules():
    code = ("import sys\nfrom ecotrain.config.methods import BUILTIN_METHODS\n"
            "from pydantic import TypeAdapter\nfrom ecotrain.config.methods import MethodConfig\n"
            "TypeAdapter(list[MethodConfig]).validate_python([{'name': 'ema'}, {'name': 'qat'}])\n"
            "loaded = [m for m in sys.modules if m == 'torch' or m.startswith('ecotrain.methods')]\n"
            "assert not loaded, loaded")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
