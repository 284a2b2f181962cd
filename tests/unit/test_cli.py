"""`ecotrain --version` and `ecotrain fit RECIPE --print-config`: answered without training (or torch)."""

import subprocess
import sys
from importlib.metadata import version

import yaml

from ecotrain.config import load_config

RECIPE = "recipes/mnist1d_cnn.yaml"


def test_version_prints_the_installed_version_without_torch():
    code = ("import sys, runpy; sys.argv = ['ecotrain', '--version']\n"
            "try:\n    runpy.run_module('ecotrain', run_name='__main__')\n"
            "except SystemExit as e:\n    assert e.code in (0, None), e.code\n"
            "assert 'torch' not in sys.modules")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"ecotrain {version('ecotrain')}\n"


def test_print_config_prints_the_merged_config_and_trains_nothing(cli, tmp_path):
    r = cli("fit", RECIPE, "optim.lr=3e-3", "--run-dir", tmp_path / "run", "--print-config", "loop.max_epochs=2")
    assert r.returncode == 0, r.stderr
    printed = yaml.safe_load(r.stdout)
    assert printed == load_config(RECIPE, ["optim.lr=3e-3", "loop.max_epochs=2"]).to_dict()
    assert printed["optim"]["lr"] == 3e-3 and printed["loop"]["max_epochs"] == 2
    assert not (tmp_path / "run").exists()


def test_print_config_of_a_bad_config_is_the_one_line_error(cli, tmp_path):
    r = cli("fit", RECIPE, "optim.name=adamx", "--print-config", "--run-dir", tmp_path / "run")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().count("\n") == 0 and "'optim.name'" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "run").exists()
