"""The real CLI: `fit` ends with the ledger line, `ledger --regions`, `compare` verdicts and exit codes,
and a budget stop."""

import json

import pytest

RECIPE = """# ecotrain fit RECIPE  (a test's tiny digits MLP)
name: tiny
data: {name: digits, batch_size: 32, val_split: 0.15}
model: {name: mlp}
optim: {lr: 0.003}
loop: {max_steps: 80, max_epochs: null, eval_every: 40, log_every: 20}
ledger: {country: FR}
"""


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    path = tmp_path_factory.mktemp("recipe") / "tiny.yaml"
    path.write_text(RECIPE)
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory, recipe):
    from conftest import run_cli

    root = tmp_path_factory.mktemp("ledger")
    out = {}
    for name, hidden, seed in (("base", "[256,256]", 0), ("base_s1", "[256,256]", 1), ("cand", "[32]", 0)):
        r = run_cli("fit", recipe, f"model.kwargs={{hidden: {hidden}}}", f"seed={seed}",
                    "--run-dir", root / name, "--quiet")
        assert r.returncode == 0, r.stderr
        out[name] = (root / name, r.stdout)
    return out


def test_fit_ends_with_the_ledger_line(runs):
    run, stdout = runs["base"]
    last = stdout.strip().splitlines()[-1]
    assert last.startswith("ledger: ") and "FLOPs" in last and "kWh (estimated)" in last and "FRA" in last
    L = json.loads((run / "ledger.json").read_text())
    assert L["flops"]["per_train_sample"] == 2 * 3 * (64 * 256 + 256 * 256 + 256 * 10) - 2 * 64 * 256
    assert L["energy"]["kwh"] > 0 and L["co2e"]["kg"] > 0 and L["cost"]["amount"] > 0
    mem = L["memory"]  # CPU: the host's peak RSS, no GPU figures
    assert 50 * 2**20 < mem["host_peak_rss_bytes"] < 8 * 2**30 and mem["gpu_peak_allocated_bytes"] is None
    summary = json.loads((run / "summary.json").read_text())
    assert "gpu_peak_memory_bytes" not in summary  # CUDA only


def test_ledger_restates_co2e_on_other_grids(cli, runs):
    r = cli("ledger", runs["base"][0], "--regions", "SE,FR,US,PL")
    assert r.returncode == 0, r.stderr
    for grid in ("SWE", "FRA", "USA", "POL"):
        assert grid in r.stdout
    assert "energy" in r.stdout and "estimated" in r.stdout
    assert "1.00x" in r.stdout  # FR: the grid it was recorded on
    table = cli("ledger", runs["base"][0])
    assert table.returncode == 0 and "host memory   peak RSS" in table.stdout and "GPU memory" not in table.stdout
    bad = cli("ledger", runs["base"][0], "--regions", "ZZ")
    assert bad.returncode == 2 and "ecotrain: error: country 'ZZ'" in bad.stderr


def test_compare_verdict_and_exit_codes(cli, runs):
    base, cand = str(runs["base"][0]), str(runs["cand"][0])
    r = cli("compare", base, cand, "--by", "flops", "--max-accuracy-drop", "0.1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verdict: PASS" in r.stdout and "FLOPs" in r.stdout and "test_accuracy" in r.stdout
    r = cli("compare", cand, base, "--by", "flops")  # the big model as the "cheaper" candidate
    assert r.returncode == 1 and "verdict: FAIL" in r.stdout
    r = cli("compare", "--baseline", base, base, "--candidate", cand, "--by", "flops")  # one run is one seed
    assert r.returncode == 2 and "verdict" not in r.stdout, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == [f"ecotrain: error: baseline runs {base}, {base} are one run folder "
                                             "given 2 times; each run counts as one seed, so give each once "
                                             "(no verdict)"]
    r = cli("compare", "--baseline", base, str(runs["base_s1"][0]), "--candidate", cand, "--max-accuracy-drop",
            "0.1", "--min-cost-cut", "-100")  # by co2e; on tiny runs energy is mostly start-up, so no cut is required
    assert r.returncode == 0, r.stdout + r.stderr
    assert "mean of 2" in r.stdout and "energy figures are estimated" in r.stdout
    assert "the candidate has one run: no interval" in r.stdout and "CO2e kg (measured)" in r.stdout


def test_budget_stops_the_cli_run(cli, tmp_path, recipe):
    r = cli("fit", recipe, "model.kwargs={hidden: [32]}", "budget.max_flops=3e6",
            "--run-dir", tmp_path, "--quiet")
    assert r.returncode == 0, r.stderr
    assert "stopped: budget:max_flops" in r.stdout
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["stopped_because"] == "budget:max_flops" and "test_accuracy" in s
    assert (tmp_path / "checkpoints").is_dir()  # stopped cleanly, with its final checkpoint
