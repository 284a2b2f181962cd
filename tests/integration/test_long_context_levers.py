"""Chunked loss and optimizer-state offload through `ecotrain fit`: the chunked run's losses equal the
plain run's within float rounding, the offloaded run's bit for bit; a task they cannot serve is one line;
memory.budget picks the chunked loss where only it fits."""

import json

from ecotrain.config import load_config
from ecotrain.memory.measure import first_candidate, measure, run_search
from ecotrain.memory.planner import format_search
from tests.conftest import ROOT

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


def test_a_budget_only_the_chunked_loss_meets_picks_it():
    """Real measurements in fresh processes: a char LM whose logits (16k tokens x 256) are most of its
    activations; the budget sits 20 MiB under the plain plan's measured peak, which only the chunked
    loss gets under (the optimizer state, 0.5 MB, is too small to matter: its offload is no candidate
    the search measures)."""
    sizes = ["data.kwargs.seq_len=2048", "data.batch_size=8", "model.kwargs.d_model=16", "model.kwargs.n_layers=1",
             "model.kwargs.n_heads=2", "memory.release_freed=true", "memory.budget=1MiB", "memory.budget_margin=0",
             "memory.budget_levers=[chunked_loss,optimizer_offload]"]
    cfg = load_config(ROOT / "recipes/charlm_long.yaml", [*TINY, *sizes])
    first = first_candidate(cfg)
    memo = {first.key: measure(cfg, first, True)}  # over 1 MiB: the baseline with every plan's estimate
    base, info = memo[first.key]
    assert info.chunkable and info.optim_bytes > 0
    budget = base.top - 20 * 2**20
    cfg = cfg.model_copy(update={"memory": cfg.memory.model_copy(update={"budget": budget})})
    s = run_search(cfg, memo)
    assert s.chosen is not None and s.chosen.candidate.chunked, format_search(s, 8)
    assert s.chosen.top <= budget and abs(s.chosen.peak_bytes - s.chosen.predicted_bytes) < 0.05 * budget
