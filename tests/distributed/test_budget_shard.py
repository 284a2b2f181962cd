"""memory.budget under real torchrun (gloo, 2 CPU ranks): every plan is measured by 2 processes, and
with the `shard` lever a budget that DDP's plans miss picks ZeRO-2 or FSDP, which the job trains with.

A wide MLP (3 x 4096: ~34M parameters, ~135 MB of each of parameters and gradients, twice that of
Adam state): DDP holds all of it on every rank (~986 MiB peak RSS per rank here), ZeRO-2 half of the
gradients and optimizer state (~792 MiB), so a budget between them is met by sharding alone.
`memory.release_freed` keeps RSS on the live tensors (glibc would keep DDP's 25 MB buckets in its
heap), which makes the peaks repeat within a few MiB."""

import json

from tests.distributed.test_torchrun import recipe, torchrun

MiB = 2**20
WIDE = {
    "name": "budget_shard", "seed": 1,
    "data": {"name": "digits", "batch_size": 32, "val_split": 0.15},
    "model": {"name": "mlp", "kwargs": {"hidden": [4096, 4096, 4096]}},
    "optim": {"lr": 1e-3},
    "loop": {"max_steps": 3, "max_epochs": None, "log_every": 1, "eval_every": None},
    "checkpoint": {"every_n_steps": 3},
    "logging": {"progress": "off"},
    "ledger": {"energy": "off"},
    "distributed": {"strategy": "ddp"},
    # the peaks' midpoint: DDP is ~90 MiB over the usable 893 MiB, ZeRO-2 ~100 MiB under
    "memory": {"budget": "940MiB", "budget_levers": ["shard"], "release_freed": True},
}


def test_a_budget_ddp_misses_trains_sharded_with_the_plan_two_ranks_measured(tmp_path):
    run = tmp_path / "run"
    r = torchrun("fit", recipe(tmp_path, WIDE), "--run-dir", run, "--quiet", timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    rec = json.loads((run / "memory_plan.json").read_text())
    assert rec["ranks"] == 2
    ddp = rec["measured"][0]
    assert ddp["strategy"] == "ddp" and not ddp["fits"] and len(ddp["rank_peaks"]) == 2
    chosen = rec["chosen"]
    assert chosen["strategy"] in ("zero2", "fsdp") and chosen["fits"] and chosen["ranks"] == 2
    # the plan's peak is the larger rank's, and both are within the budget's usable bytes
    assert chosen["peak_bytes"] == max(chosen["rank_peaks"]) <= rec["usable_bytes"]
    assert chosen["eval_peak_bytes"] is None or chosen["eval_peak_bytes"] <= rec["usable_bytes"]
    assert "ZeRO-2 over 2 ranks" in chosen["plan"] or "FSDP over 2 ranks" in chosen["plan"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["memory_plan"] == rec and summary["steps"] == 3 and summary["world_size"] == 2
    # both ranks trained sharded: each wrote its own shard of the model and optimizer state
    shards = sorted(p.name for p in (run / "checkpoints" / "step-00000003" / "shards").iterdir())
    assert len(shards) == 2
    assert "strategy: ddp" in (run / "config.yaml").read_text()  # the user's config stays as written
    # a resume reads the plan back (measures nothing) and trains sharded again on both ranks
    r = torchrun("resume", run, "loop.max_steps=4", "--allow-config-change", "--quiet", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "not measured again" in r.stderr and "chosen in" not in r.stderr
    assert json.loads((run / "memory_plan.json").read_text()) == rec
    assert json.loads((run / "summary.json").read_text())["steps"] == 4


def test_plan_under_torchrun_measures_the_sharded_plans_and_explains_the_pick(tmp_path):
    r = torchrun("plan", recipe(tmp_path, WIDE), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert out.count("memory budget 940 MiB") == 1  # rank 0 plans for the job; the other rank prints nothing
    assert "pick: no checkpointing, 1 micro-batch of 16 per rank, fp32, ZeRO-2 over 2 ranks" in out
    assert ("runner-up: no checkpointing, 1 micro-batch of 16 per rank, fp32, DDP over 2 ranks: peak" in out
            and "is over the usable 893 MiB" in out)
