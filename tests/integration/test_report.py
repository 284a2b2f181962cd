"""`ecotrain report` opened in a real headless browser (Debian's chromium + chromedriver, selenium):
every plot rendered, no console error, no network request, and the diagnosis of a deliberately
overfitted run and a deliberately underfitted run. A screenshot is saved as a test artifact
($ECOTRAIN_TEST_ARTIFACTS, default the test's tmp folder)."""

import json
import os
from pathlib import Path

import pytest

from tests.helpers import browser

BASE = {"data": {"name": "digits", "batch_size": 32, "val_split": 0.15},
        "model": {"name": "mlp", "kwargs": {"hidden": [32]}}, "optim": {"lr": 3e-3},
        "loop": {"max_steps": 40, "max_epochs": None, "log_every": 10, "eval_every": 10},
        "logging": {"progress": "off"}, "ledger": {"energy": "off"}}
# Overfitted on purpose: 5% of the digits' train split (72 samples), a 256x256 MLP, a high learning
# rate, no regularisation; early stopping on, so the report names the step it restored.
OVERFIT = {"name": "overfit", "data": {"val_split": 0.95}, "model": {"kwargs": {"hidden": [256, 256]}},
           "optim": {"lr": 1e-2}, "loop": {"max_steps": 150, "eval_every": 15, "log_every": 15},
           "early_stopping": {"enabled": True, "patience": 5}, "ledger": {"energy": "codecarbon", "country": "FR"}}
# Underfitted on purpose: a learning rate 10x too small, 40 steps.
UNDERFIT = {"name": "underfit", "optim": {"lr": 3e-4}}


def _merge(a, b):
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from ecotrain import Config, fit

    root = tmp_path_factory.mktemp("report-runs")
    out = {}
    for name, over in (("overfit", OVERFIT), ("underfit", UNDERFIT)):
        fit(Config.model_validate(_merge(BASE, over)), run_dir=root / name)
        out[name] = root / name
    return out


@pytest.fixture(scope="module")
def reports(runs, tmp_path_factory):
    from conftest import run_cli

    from ecotrain.report import build_report

    out = {name: build_report([[str(path)]]) for name, path in runs.items()}
    multi = tmp_path_factory.mktemp("report-multi") / "compare.html"
    r = run_cli("report", runs["underfit"], runs["overfit"], "--out", multi, "--by", "flops")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == f"report: {multi}"
    out["compare"] = multi
    return out


@pytest.fixture(scope="module")
def driver():
    d = browser.start()
    yield d
    d.quit()


def _open(driver, path: Path):
    browser.requests(driver), browser.errors(driver)  # drop what came before
    driver.get(path.resolve().as_uri())
    return driver


def test_the_run_folder_has_environment_json(runs):
    from ecotrain.base.environment import git_info

    env = json.loads((runs["overfit"] / "environment.json").read_text())
    summary = json.loads((runs["overfit"] / "summary.json").read_text())
    assert env["dataset_hash"] == summary["dataset_hash"]
    assert env["packages"]["torch"] and env["hardware"]["cpu_count"] >= 1
    here = git_info()
    assert env.get("git") == here  # the working directory's repository, when there is one


@pytest.mark.parametrize("name, plots", [("overfit", 2), ("underfit", 1), ("compare", 4)])
def test_every_plot_renders_no_console_error_no_network(driver, reports, name, plots):
    page = reports[name]
    html = page.read_text()
    for attr in ('src="http', "src='http", 'href="http', "url(http", "<script", "<link"):
        assert attr not in html, attr
    _open(driver, page)
    imgs = browser.images(driver)
    assert len(imgs) >= plots, imgs
    for i in imgs:
        assert i["complete"] and i["w"] > 0 and i["h"] > 0, i
        assert i["src"].startswith("data:image/png;base64,"), i
    assert browser.errors(driver) == []
    fetched = [u for u in browser.requests(driver) if not u.startswith(("file:", "data:"))]
    assert fetched == []


def test_diagnosis_of_the_overfitted_run(driver, reports):
    from selenium.webdriver.common.by import By

    _open(driver, reports["overfit"])
    text = driver.find_element(By.ID, "diagnosis").text
    assert "DIAGNOSIS: OVERFITTING" in text.upper()
    assert "Validation loss rises from step 15 (" in text and "while training loss falls (" in text
    assert "): overfitting." in text
    assert "Early stopping ended the run at step 90 and restored step 15's weights" in text
    assert driver.find_elements(By.CSS_SELECTOR, "img[alt='CO2e by grid region']")  # energy was measured: a chart
    art = Path(os.environ.get("ECOTRAIN_TEST_ARTIFACTS") or reports["overfit"].parent.parent)
    art.mkdir(parents=True, exist_ok=True)
    shot = art / "report-overfit.png"
    driver.set_window_size(1400, 1500)
    assert driver.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_diagnosis_of_the_underfitted_run(driver, reports):
    from selenium.webdriver.common.by import By

    _open(driver, reports["underfit"])
    text = driver.find_element(By.ID, "diagnosis").text
    assert "DIAGNOSIS: UNDERFITTING" in text.upper()
    assert "still rising at the end: underfitting" in text and "Train longer" in text


def test_comparison_report(driver, reports):
    from selenium.webdriver.common.by import By

    _open(driver, reports["compare"])
    table = driver.find_element(By.ID, "comparison").text
    assert "underfitting" in table and "overfitting" in table
    verdict = driver.find_element(By.ID, "verdict").text
    assert "ecotrain compare" in verdict and ("PASS" in verdict or "FAIL" in verdict)
    assert driver.find_element(By.ID, "diagnosis-overfit").text and driver.find_element(By.ID, "diagnosis-underfit")


def test_report_errors_are_one_line(tmp_path, capsys):
    from ecotrain.cli.program import _main

    assert _main(["report", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"ecotrain: error: {tmp_path / 'missing'}: not a run folder (no such folder)"
    (tmp_path / "empty").mkdir()
    assert _main(["report", str(tmp_path / "empty")]) == 2
    assert "not a run folder (no config.yaml, no metrics.jsonl)" in capsys.readouterr().err
