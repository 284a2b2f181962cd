"""Every shipped recipe runs on a shortened schedule and meets a (shortened) accuracy bar."""

import json
from pathlib import Path

import pytest

from ecotrain.config import load_config

RECIPES = sorted(Path("recipes").glob("*.yaml"))
SHORT = {"mnist1d_cnn": (["loop.max_steps=1500"], 0.85), "digits_resnet": (["loop.max_epochs=4"], 0.85),
         # still T=2048 with checkpointing and bf16; a small model, 300 KB of text, 24 steps (~18 s; test
         # accuracy 0.37 here against the bar of 0.25)
         "charlm_long": (["data.batch_size=4", "data.kwargs.max_bytes=300000", "model.kwargs={d_model: 64, n_layers: 2, "
                          "n_heads: 2}", "loop.max_steps=24", "schedule.warmup=4", "optim.lr=0.004"], 0.25),
         # a tiny GPT-2 (transformers) on 150 KB of text, 30 steps (~12 s; test accuracy 0.31 here, 0.004 at
         # random init; perplexity 19 of 256)
         "lm_small": (["data.kwargs.max_bytes=150000", "loop.max_steps=30", "loop.eval_every=15",
                       "schedule.warmup=5"], 0.25)}


def test_every_recipe_starts_with_its_command_and_validates():
    for p in RECIPES:
        first = p.read_text().splitlines()[0]
        assert first.startswith("# ecotrain ") and p.name in first, p
        load_config(p)


@pytest.mark.parametrize("name", sorted(SHORT))
def test_recipe_short_schedule_accuracy(cli, tmp_path, name):
    overrides, bar = SHORT[name]
    r = cli("fit", f"recipes/{name}.yaml", *overrides, "--run-dir", tmp_path, "--quiet")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "summary.json").read_text())["test_accuracy"] >= bar
