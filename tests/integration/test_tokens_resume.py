"""Token data end to end through the real CLI: `ecotrain tokenize` a corpus, train on its token files,
SIGKILL mid-epoch, resume, and get the uninterrupted run's bytes; the tokenizer rides in the run
folder. A recipe whose Dataset yields dicts runs under memory.budget."""

import random
import signal

import pytest

from tests.helpers.runs import deterministic_lines, fit_quietly, write_recipe

WORDS = "the cat sat on a mat while dogs ran over green hills and birds sang über café".split()


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    from conftest import run_cli

    d = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    (d / "docs").mkdir()
    for i in range(40):
        (d / "docs" / f"{i:03d}.txt").write_text(" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 200))))
    r = run_cli("tokenize", d / "docs", "--out", d / "tok", "--vocab-size", "300")
    assert r.returncode == 0, r.stderr
    assert "train with data.name=tokens:" in r.stdout
    return d / "tok"


def _recipe(folder, tokens, callbacks=()):
    return write_recipe(folder, {
        "name": "tokens_resume", "seed": 5,
        "data": {"name": f"tokens:{tokens}", "kwargs": {"seq_len": 32}, "batch_size": 8, "test_split": 0.1},
        "model": {"name": "charlm", "kwargs": {"d_model": 32, "n_layers": 1, "n_heads": 2}, "dropout": 0.1},
        "optim": {"lr": 3e-3}, "loop": {"max_steps": 40, "max_epochs": None, "log_every": 5, "eval_every": 10},
        "checkpoint": {"every_n_steps": 3}, "callbacks": list(callbacks)})


def test_sigkill_mid_epoch_resumes_to_the_same_bytes(cli, tmp_path, tokens):
    ref = fit_quietly(_recipe(tmp_path, tokens), tmp_path / "ref")
    run = tmp_path / "run"
    killer = {"path": "tests.helpers.killer:KillAt", "kwargs": {"step": 17}}
    r = cli("fit", _recipe(tmp_path, tokens, [killer]), "--run-dir", run, "--quiet")
    assert r.returncode == -signal.SIGKILL, r.stderr
    r = cli("fit", _recipe(tmp_path, tokens), "--run-dir", run, "--resume", "auto", "--quiet", "--allow-config-change")
    assert r.returncode == 0, r.stderr
    assert "resuming from" in r.stderr
    assert (run / "model.safetensors").read_bytes() == (ref / "model.safetensors").read_bytes()
    assert deterministic_lines(run) == deterministic_lines(ref)
    assert any(line["epoch"] >= 1 for line in deterministic_lines(ref))  # the kill was inside an earlier epoch
    assert (run / "tokenizer.json").read_bytes() == (tokens / "tokenizer.json").read_bytes()


def test_a_dict_dataset_recipe_runs_under_memory_budget(cli, tmp_path):
    recipe = write_recipe(tmp_path, {
        "name": "dicts", "data": {"name": "tests.helpers.lm_items:TokenDicts", "batch_size": 8},
        "model": {"name": "tests.helpers.lm_items:TinyLM"}, "task": {"name": "language_model"},
        "memory": {"budget": "2GiB"}, "loop": {"max_steps": 6, "max_epochs": None, "eval_every": 3}})
    r = cli("fit", recipe, "--run-dir", tmp_path / "run", "--quiet")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "run" / "memory_plan.json").exists()
