"""`ecotrain update` of a language model on a shifted corpus (assembly/update_lm.py), end to end: corpus A
tokenized with a BPE trained on it, corpus B with A's tokenizer (`--tokenizer-from`), a nanoGPT
trained on A, `ecotrain update RUN tokens:B` with replay (its buffer sampled from A) and LwF, the
perplexity gate, forgetting_ppl_ratio, rollback; a corpus of another tokenizer refused in one line;
`shards:` of B's token file cut in three, killed by SIGKILL and resumed to the same bytes.

The update commands run through the CLI's `main` in this process (as tests/integration/test_update.py)."""

import json
import random
import signal

import numpy as np
import pytest

from ecotrain import Config, fit
from ecotrain.cli import main
from ecotrain.continual.gate import GatePolicy, decide_perplexity
from ecotrain.continual.registry import Registry
from tests.helpers.runs import fit_quietly, write_recipe

PROSE = "the cat sat on a mat while dogs ran over green hills and birds sang in tall trees".split()
CODE = "def return self if else for in while import class lambda yield none true false".split()


def ecotrain(capsys, *args):
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def corpus(folder, words, seed):
    rng = random.Random(seed)
    folder.mkdir(parents=True)
    for i in range(30):
        (folder / f"{i:03d}.txt").write_text(" ".join(rng.choice(words) for _ in range(rng.randint(40, 160))))
    return folder


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm-update")
    codes = [main(["tokenize", str(corpus(root / "prose", PROSE, 0)), "--out", str(root / "A"), "--vocab-size", "300"]),
             main(["tokenize", str(corpus(root / "code", CODE, 1)), "--out", str(root / "B"), "--tokenizer-from",
                   str(root / "A")]),
             main(["tokenize", str(root / "code"), "--out", str(root / "C"), "--vocab-size", "300"])]
    assert codes == [0, 0, 0]
    cfg = Config.model_validate({
        "name": "lm-base", "seed": 0, "data": {"name": f"tokens:{root / 'A'}", "batch_size": 8, "kwargs": {"seq_len": 32}},
        "model": {"name": "nanogpt", "kwargs": {"d_model": 32, "n_layers": 1, "n_heads": 2}}, "optim": {"lr": 3e-3},
        "loop": {"max_steps": 60, "max_epochs": None, "log_every": 20}, "logging": {"progress": "off"},
        "ledger": {"enabled": False}})
    fit(cfg, run_dir=root / "base", quiet=True)
    return root


def test_update_on_a_shifted_corpus_gates_on_perplexity(world, capsys):
    reg_dir = world / "registry"
    R = ["--registry", reg_dir, "loop.max_steps=30"]
    code, out, err = ecotrain(capsys, "update", world / "base", f"tokens:{world / 'B'}", *R,
                              "methods=[{name: replay, size: 32, ratio: 0.25}, {name: lwf, alpha: 0.5}]")
    assert code in (0, 1), err
    assert "registered as v0001" in err and "windows of v0001's training data" in err  # the buffer: A's windows
    reg = Registry(reg_dir)
    meta = reg.read_meta("v0002")
    m = meta["metrics"]
    assert meta["task"] == "language_model" and sorted(m["tasks"]) == ["B", "base"]
    before, after = m["base"]["tasks"], m["tasks"]
    assert m["forgetting_ppl_ratio"] == pytest.approx(after["base"] / before["base"], rel=1e-4)
    assert m["new_ppl_ratio"] == pytest.approx(after["B"] / before["B"], rel=1e-4)
    assert after["B"] < before["B"]  # the new corpus is learnt
    ok, reason = decide_perplexity(before, after, ["base"], "B", GatePolicy())
    assert (code == 0) == ok and out.splitlines()[-1] == f"v0002: {reason}"
    assert f"forgetting_ppl_ratio={m['forgetting_ppl_ratio']:.6g}" in out
    assert f"base: perplexity {before['base']:.4f} -> {after['base']:.4f}" in out
    assert (reg.path("v0002") / "tokenizer.json").read_bytes() == (world / "A" / "tokenizer.json").read_bytes()

    # the new corpus's perplexity must fall by 99%: rejected, exit 1, current unchanged
    current = reg.index()["current"]
    code, out, _ = ecotrain(capsys, "update", "current", world / "B", *R, "--min-gain", "0.99", "methods=[]",
                            "--slice", "B2")
    assert code == 1 and "v0003: rejected: the recent slice did not improve: recent 'B2' perplexity" in out
    assert reg.index()["current"] == current and reg.index()["versions"]["v0003"]["status"] == "rejected"
    if current == "v0002":
        code, out, _ = ecotrain(capsys, "rollback", "--registry", reg_dir)
        assert code == 0 and "current is v0001" in out


def test_a_corpus_of_another_tokenizer_is_refused_in_one_line(world, capsys):
    reg_dir = world / "registry-c"
    code, _, err = ecotrain(capsys, "update", world / "base", f"tokens:{world / 'C'}", "--registry", reg_dir)
    assert code == 2
    line = err.strip().splitlines()[-1]
    assert line.startswith("ecotrain: error: NEW_DATA tokens:") and "tokenized with another tokenizer than v0001's" in line
    assert f"--tokenizer-from {reg_dir}/versions/v0001" in line


def test_token_shards_resume_to_the_same_bytes(cli, world, tmp_path):
    ids = np.fromfile(world / "B" / "train.bin", dtype=np.uint16)
    for i, part in enumerate(np.array_split(ids, 3)):
        part.tofile(tmp_path / f"b-{i}.bin")
    meta = json.loads((world / "B" / "tokens.json").read_text())

    def recipe(callbacks=()):
        return write_recipe(tmp_path, {
            "name": "shards", "seed": 3, "callbacks": list(callbacks),
            "data": {"name": f"shards:{tmp_path}/b-{{0..2}}.bin", "batch_size": 8, "val_split": 0.1,
                     "kwargs": {"seq_len": 32, "dtype": "uint16", "vocab_size": meta["vocab_size"], "eod": meta["eod"]}},
            "model": {"name": "nanogpt", "kwargs": {"d_model": 32, "n_layers": 1, "n_heads": 2}},
            "loop": {"max_steps": 24, "max_epochs": None, "log_every": 4, "eval_every": 12},
            "checkpoint": {"every_n_steps": 5}, "ledger": {"energy": "off"}})

    ref = fit_quietly(recipe(), tmp_path / "ref")
    r = cli("fit", recipe([{"path": "tests.helpers.killer:KillAt", "kwargs": {"step": 13}}]), "--run-dir",
            tmp_path / "run", "--quiet")
    assert r.returncode == -signal.SIGKILL, r.stderr
    r = cli("fit", recipe(), "--run-dir", tmp_path / "run", "--resume", "auto", "--quiet", "--allow-config-change")
    assert r.returncode == 0 and "resuming from" in r.stderr, r.stderr
    assert (tmp_path / "run" / "model.safetensors").read_bytes() == (ref / "model.safetensors").read_bytes()


def test_replay_and_lwf_train_on_dict_token_batches(world, tmp_path):
    """A buffer of A's windows (a first run's export), replayed with LwF while training on B's
    document-attention dict batches: both terms are logged, and the next buffer holds token windows."""
    def cfg(data, methods, steps):
        return Config.model_validate({
            "seed": 1, "data": {"name": f"tokens:{data}", "batch_size": 8, "kwargs": {"seq_len": 32, **(
                {"attention": "document"} if data.name == "B" else {})}},
            "model": {"name": "nanogpt", "kwargs": {"d_model": 32, "n_layers": 1, "n_heads": 2}},
            "loop": {"max_steps": steps, "max_epochs": None, "log_every": 2}, "methods": methods,
            "logging": {"progress": "off"}, "ledger": {"enabled": False}})

    first = fit(cfg(world / "A", [{"name": "replay", "size": 24}], 2), run_dir=tmp_path / "a", quiet=True)
    assert first.summary["methods"]["replay"]["buffer"] == 24
    r = fit(cfg(world / "B", [{"name": "replay", "size": 24, "from": str(tmp_path / "a")},
                              {"name": "lwf", "teacher": str(tmp_path / "a")}], 4), run_dir=tmp_path / "b", quiet=True)
    logs = [json.loads(line) for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert all(np.isfinite(x["loss_replay"]) and x["loss_lwf"] >= 0 for x in logs if "loss" in x)
    rep = r.summary["methods"]["replay"]
    assert rep["tokens"] and rep["buffer"] == 24 and rep["rows_per_step"] == 2
