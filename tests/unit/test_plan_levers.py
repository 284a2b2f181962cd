"""memory.budget's loss- and state-side levers (memory/planner.py): the chunked loss and optimizer-state
offload are candidates beside checkpointing, offload and micro-batches, a record keeps them, `applied`
turns them on, and a budget that only the chunked loss meets picks it. The search runs on a table of
measured peaks (as tests/unit/test_memplan.py); the real measurement is tests/integration/test_long_context_levers.py."""

import json

from ecotrain.config import Config
from ecotrain.memory.planner import (Baseline, Candidate, Measured, applied, candidates, format_search, from_record,
                                     predict, search, shard_hint)

MiB = 2**20


def test_the_new_levers_are_candidates_only_where_they_apply():
    plain = candidates(2, False, 4, 1, 1, "fp32", False)
    both = candidates(2, False, 4, 1, 1, "fp32", False, chunkable=True, has_optim_state=True)
    assert not any(c.chunked or c.optim_offload for c in plain)
    assert len(both) == 4 * len(plain) and len({c.key for c in both}) == len(both)
    assert both[0] == plain[0]  # the baseline stays the least constrained plan
    c = next(c for c in both if c.key == "all/2/fp32/chunked/optim-offload")
    assert c.describe(4) == "checkpointing every block, chunked loss, optimizer state offloaded, 2 micro-batches of 2, fp32"
    only = candidates(2, False, 4, 1, 1, "fp32", False, ["chunked_loss"], chunkable=True, has_optim_state=True)
    assert {(c.chunked, c.optim_offload) for c in only} == {(False, False), (True, False)}  # budget_levers rule
    cfg = applied(Config.model_validate({"memory": {"budget": "1GiB"}}), c)
    assert (cfg.memory.chunked_loss, cfg.memory.optimizer_offload) == ("on", "on")


def test_optimizer_offload_predicts_the_larger_of_training_and_the_step():
    info = Baseline(400 * MiB, 400 * MiB, 30 * MiB, {"off/1/fp32": 100 * MiB, "off/1/fp32/optim-offload": 100 * MiB,
                                                     "off/1/fp32/chunked": 40 * MiB}, 1, optim_bytes=20 * MiB)
    base = Measured(Candidate("off", 1, "fp32"), 630 * MiB, 1.0)  # 200 MiB of activations: 2x the estimate
    assert predict(base, info, base.candidate) == 630 * MiB
    assert predict(base, info, Candidate("off", 1, "fp32", optim_offload=True)) == 610 * MiB  # 20 MiB of state out
    assert predict(base, info, Candidate("off", 1, "fp32", chunked=True)) == 510 * MiB
    small = Baseline(400 * MiB, 400 * MiB, 30 * MiB, {"off/1/fp32": 1 * MiB, "off/1/fp32/optim-offload": 1 * MiB}, 1,
                     optim_bytes=20 * MiB)
    # tiny activations: the step (state back, plus the foreach temporaries) is the peak
    assert predict(Measured(base.candidate, 440 * MiB, 1.0), small,
                   Candidate("off", 1, "fp32", optim_offload=True)) == 440 * MiB


def test_a_budget_only_the_chunked_loss_meets_picks_it():
    cands = candidates(2, False, 4, 1, 1, "fp32", False, chunkable=True, has_optim_state=True)
    # the logits are the peak: every plan without the chunked loss is over 700 MiB, those with it under
    peak = {c.key: (660 if c.chunked else 760) - 10 * c.n_checkpointed - (5 if c.optim_offload else 0)
            - 3 * c.micro_batches for c in cands}
    est = {c.key: (peak[c.key] - 450) * MiB for c in cands}
    calls = []

    def measure(c, first):
        calls.append(c.key)
        m = Measured(c, peak[c.key] * MiB, 1.0 + 0.05 * c.n_checkpointed + 0.02 * c.micro_batches)
        return (m, Baseline(400 * MiB, 400 * MiB, 30 * MiB, est, 2, 20 * MiB, True)) if first else m

    s = search(cands[0], lambda info: cands, 740 * MiB, 0.05, measure, 8)  # usable 703 MiB
    # measured: the baseline, then the plan predicted to fit (before those only within the 5% slack)
    assert calls == ["off/1/fp32", "off/1/fp32/chunked"] and s.chosen.candidate.key == calls[1]
    assert all(not m.candidate.chunked for m in s.measured if m.top > s.usable)
    text = format_search(s, 4)
    assert "pick: no checkpointing, chunked loss, 1 micro-batch of 4, fp32" in text and "runner-up:" in text
    back = from_record(json.loads(json.dumps(s.record(4))))
    assert back.chosen.candidate == s.chosen.candidate and back.chosen.candidate.chunked


def test_none_fits_names_zero2_with_the_ranks_it_needs():
    smallest = Measured(Candidate("all", 4, "fp32"), 700 * MiB, 1.0)
    line = shard_hint(smallest, 640 * MiB, 100 * MiB)  # 60 MiB over; ZeRO-2 over N ranks saves 100 * (1 - 1/N)
    assert "distributed.strategy=zero2" in line and "over 4 ranks" in line and "75 MiB per rank" in line
    assert "smaller data.batch_size" in shard_hint(smallest, 500 * MiB, 100 * MiB)  # 200 MiB over: sharding is not enough
