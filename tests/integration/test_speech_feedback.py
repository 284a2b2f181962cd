"""The speech showcase end to end through the real CLI, on a tiny schedule: the dataset command,
then a base version and one feedback round with every strategy (registries, review queue,
results.json, the table)."""

import json
import shutil

import pytest

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng not installed (make speech)")


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """The dataset the feedback test reads, made once by the real command (scale 0.15: 84 utterances)."""
    from conftest import run_cli

    folder = tmp_path_factory.mktemp("speech") / "d"
    r = run_cli("data", "speech-digits", "--out", folder, "--scale", "0.15")
    assert r.returncode == 0, r.stderr
    return folder, r.stdout


def test_data_command_makes_a_cached_dataset(cli, digits, tmp_path):
    folder, out = digits
    assert "84 utterances" in out
    rows = json.loads((folder / "manifest.json").read_text())["utterances"]
    assert {"speaker", "cohort", "transcript", "sha256", "frames"} <= set(rows[0])
    bad = cli("data", "speech-digits", "--out", tmp_path / "x", "--scale", "0")
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1 and "--scale" in bad.stderr


def test_feedback_round_quick(cli, digits, tmp_path):
    r = cli("speech-feedback", "recipes/speech_feedback.yaml", f"data.kwargs.folder={digits[0]}",
            "data.kwargs.scale=0.15", "data.kwargs.feedback.base_steps=30", "data.kwargs.feedback.update_steps=6",
            "data.kwargs.feedback.check_steps=4", "data.kwargs.feedback.rounds=[accent_de]",
            "model.kwargs={channels: 32, hidden: 32}", "--out", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert "| 1 | protected |" in r.stdout and "| 1 | adapters |" in r.stdout and "deployed (gate:" in r.stdout
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    (rnd,) = res["rounds"]
    assert rnd["labels"]["wrong"] + rnd["labels"]["format"] > 0
    assert set(rnd["strategies"]) == {"naive", "replay", "protected", "average", "adapters"}
    assert set(res["final"]) == {"naive", "replay", "protected", "average", "adapters_routed", "adapters_router",
                                 "merged", "joint"}
    assert 0 <= res["router_accuracy"] <= 1 and res["cap"] == 0.02
    for f in res["rejections"]:  # each rejection's own figures: the reason it gives is in them
        assert f["promote"] is False and set(f["before"]) == set(f["after"]) >= {"base", "recent"}
    assert json.loads((tmp_path / "out" / "review-round1.json").read_text()) is not None
    idx = json.loads((tmp_path / "out" / "registry-protected" / "index.json").read_text())
    assert len(idx["versions"]) == 2 and idx["versions"]["v0001"]["status"] == "promoted"
    assert idx["versions"]["v0002"]["status"] in ("promoted", "rejected")
    ad = tmp_path / "out" / "registry-adapters" / "versions" / "v0002" / "adapter"
    assert (ad / "adapter_model.safetensors").is_file() and (ad / "adapter_config.json").is_file()
    bad = cli("speech-feedback", "recipes/speech_feedback.yaml", f"data.kwargs.folder={digits[0]}",
              "data.kwargs.scale=0.15", "data.kwargs.feedback.rounds=[martian]", "--out", tmp_path / "o2")
    assert bad.returncode != 0 and "martian" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
