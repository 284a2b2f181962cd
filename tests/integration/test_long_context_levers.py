"""Chunked loss and optimizer-state offload through `ecotrain fit`: the chunked run's losses equal the
plain run's within float rounding, the offloaded run's bit for bit; a task they cannot serve is one line."""

import json

TINY = ["data.kwargs.seq_len=64", "data.kwargs.max_bytes=40000", "model.kwargs.d_model=128", "model.kwargs.n_layers=2",
        "model.kwargs.n_heads=2", "data.batch_size=4", "loop.eval_every=null", "ledger.energy=off", "precision=fp32",
        "loop.max_steps=6", "loop.log_every=1", "memory.activation_checkpointing=off"]


def _losses(run):
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r and r.get("split", "train") == "train"]


def test_chunked_loss_and_optimizer_offload_train_the_same(cli, tmp_path):
    runs = {}
    for name, extra in [("plain", []), ("chunked", ["memory.chunked_loss=on", "memory.loss_chunk=50"]),
                        ("offload", ["memory.optimizer_offload=on"])]:
        runs[name] = tmp_path / name
        r = cli("fit", "recipes/charlm_long.yaml", *TINY, *extra, "--run-dir", runs[name], "--quiet")
        assert r.returncode == 0, r.stderr
    plain, chunked, offload = (_losses(runs[n]) for n in ("plain", "chunked", "offload"))
    assert len(plain) == 6
    assert max(abs(a - b) / abs(b) for a, b in zip(chunked, plain)) <= 1e-4
    assert offload == plain  # bit for bit
    assert (runs["offload"] / "model.safetensors").read_bytes() == (runs["plain"] / "model.safetensors").read_bytes()


def test_chunked_loss_needs_a_cross_entropy_task(cli, tmp_path):
    r = cli("fit", "recipes/mnist1d_cnn.yaml", "memory.chunked_loss=on", "loop.max_steps=1", "--run-dir",
            tmp_path / "r", "--quiet")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "memory.chunked_loss" in r.stderr, r.stderr
