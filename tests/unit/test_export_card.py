"""The model card on real finished runs: Hugging Face's ModelCard parses it offline, co2_eq_emissions is
the ledger's grams, a seed group ships the seed chosen on validation and reports every seed with its
interval, and a README.md that ecotrain did not write is never replaced."""

import json
import os
import subprocess
import sys

import pytest

from ecotrain import Config, fit
from ecotrain.cli import main
from ecotrain.base.errors import ConfigError
from ecotrain.export.card import MARK, card_text, ours, read_exports, tokenizer_name, weights_summary, write_card
from ecotrain.export.shipped import Run, locate
from ecotrain.base.stats import mean_ci
from ecotrain.base.groupfile import write_group
from tests.helpers.deadline import deadline

ModelCard = pytest.importorskip("huggingface_hub").ModelCard

TINY = {"data": {"name": "digits", "batch_size": 32, "val_split": 0.15},
        "model": {"name": "mlp", "kwargs": {"hidden": [16]}},
        "loop": {"max_steps": 12, "max_epochs": None, "eval_every": 6}, "logging": {"progress": "off"},
        "checkpoint": {"at_end": False}, "ledger": {"carbon_intensity": 100.0}}


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    """Two seeds trained for real (CodeCarbon's offline estimate included) and their group file."""
    root = tmp_path_factory.mktemp("card")
    runs = []
    for seed in (0, 1):
        runs.append(root / f"g-s{seed}")
        fit(Config.model_validate({**TINY, "seed": seed}), run_dir=runs[-1], quiet=True)
    write_group(root / "g-group.json", "tiny", "recipe.yaml", [], [0, 1], runs, runs)
    return root / "g-group.json", runs


def _read(run, name):
    return json.loads((run / name).read_text())


def test_card_of_a_run_parses_offline_and_carries_the_ledgers_grams(group, tmp_path):
    _, runs = group
    run = runs[0]
    assert main(["card", str(run)]) == 0
    card = ModelCard.load(run / "README.md")  # a local path: no network
    ledger, summary = _read(run, "ledger.json"), _read(run, "summary.json")
    co2 = card.data.co2_eq_emissions
    assert co2["emissions"] == ledger["co2e"]["kg"] * 1000 > 0
    assert co2["source"].startswith(ledger["energy"]["method"] + ":")  # measured or estimated, said first
    assert co2["training_type"] == "pre-training" and co2["hardware_used"] and co2["geographical_location"]
    results = {r.metric_type: r for r in card.data.eval_results}
    assert results["accuracy"].metric_value == summary["test_accuracy"]
    assert results["accuracy"].dataset_split == "test" and results["accuracy"].task_type == "classification"
    assert "validation" in card.text and summary["dataset_hash"] in card.text


def test_a_group_ships_its_best_validation_seed_and_reports_every_seed(group):
    file, runs = group
    shipped = locate(file)
    losses = [_read(r, "summary.json")["best_val_metric"] for r in runs]
    assert shipped.run.path == runs[losses.index(min(losses))]  # val_loss, lower is better
    out = shipped.run.path / "README.md"
    write_card(shipped, out)
    card = ModelCard.load(out)
    accs = [_read(r, "summary.json")["test_accuracy"] for r in runs]
    ci = mean_ci(accs)
    got = card.data.ecotrain["test_metrics"]["accuracy"]
    assert got["seeds"] == {0: accs[0], 1: accs[1]} and got["value"] == pytest.approx(ci.mean)
    assert got["ci95"] == pytest.approx([ci.low, ci.high])
    grams = sum(_read(r, "ledger.json")["co2e"]["kg"] for r in runs) * 1000  # every seed was trained
    assert card.data.co2_eq_emissions["emissions"] == pytest.approx(grams, rel=1e-12)
    assert card.data.ecotrain["chosen_seed"] == shipped.run.seed and "mean of 2 seeds" in card.content


def test_a_readme_ecotrain_did_not_write_is_never_replaced(group, tmp_path):
    _, runs = group
    mine = tmp_path / "README.md"
    mine.write_text("# my notes\n")
    with pytest.raises(ConfigError, match="not written by ecotrain"):
        write_card(locate(runs[0]), mine)
    assert mine.read_text() == "# my notes\n"
    mine.write_text(MARK + "\nold card\n")  # its own earlier card is rewritten
    write_card(locate(runs[0]), mine)
    assert "old card" not in mine.read_text()


def test_a_run_without_energy_has_no_co2_field_and_says_why(tmp_path):
    run = tmp_path / "r"
    fit(Config.model_validate({**TINY, "ledger": {"energy": "off"}}), run_dir=run, quiet=True)
    text = card_text(locate(run))
    card = ModelCard(text)
    assert "co2_eq_emissions" not in card.data.to_dict() and "CO2e: not recorded" in text


def test_card_command_starts_without_torch(group):
    _, runs = group
    code = ("import sys; from ecotrain.cli import main; "
            f"assert main(['card', {str(runs[1])!r}]) == 0; assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "model card:" in r.stdout and "gCO2e (estimated)" in r.stdout


def test_a_run_whose_files_are_fifos_gets_a_card_without_waiting(tmp_path):
    """tokenizer.json, model.safetensors, export.json and README.md put there as FIFOs (no writer: a plain
    open() blocks forever, past SIGTERM): each read goes through safefile and says what it could not read."""
    for name in ("tokenizer.json", "model.safetensors", "export.json", "README.md"):
        os.mkfifo(tmp_path / name)
    run = Run(tmp_path, {"data": {"name": "tokens"}}, {}, None)
    with deadline(20, "the card's reads"):
        assert tokenizer_name(run) == "tokenizer.json is unreadable"
        assert weights_summary(tmp_path / "model.safetensors") == (None, {}, None)
        assert read_exports(tmp_path) == {}
        assert not ours(tmp_path / "README.md")  # not a card this module wrote: never replaced
    os.unlink(tmp_path / "tokenizer.json")
    assert tokenizer_name(run) == "not recorded (the run's data came without tokenizer.json)"
    (tmp_path / "tokenizer.json").write_text('{"ecotrain_tokenizer": "bytes"}')
    assert tokenizer_name(run).startswith("bytes: the 256 byte values and end of document")
