"""memory.budget's strategy lever (memory/shard.py): which strategies a budget measures, the plans that
combine them with the other levers, the choice over every strategy's search, the record and the
measuring group's environment. The searches run on tables of measured peaks (as tests/unit/test_memplan.py);
the real measurement by 2 processes under torchrun is tests/distributed/test_budget_shard.py."""

import json

import pytest
from torch import nn

from ecotrain.config import Config, load_config
from ecotrain.base.errors import ConfigError
from ecotrain.memory.planner import (Baseline, Candidate, Measured, applied, candidates, format_search, from_record,
                                     none_fits_line, predict, search)
from ecotrain.memory.shard import Refused, configured, group_env, search_strategies, strategies_for, strategy_bytes

MiB = 2**20


def cfg_of(**memory):
    return Config.model_validate({"memory": {"budget": "1GiB", **memory}, "data": {"batch_size": 16},
                                  "distributed": {"strategy": "ddp"}})


def test_strategies_measured_per_world_size_lever_and_resume():
    cfg = cfg_of()
    assert strategies_for(cfg, 1) == [None]  # one process: no strategy, as before
    assert strategies_for(cfg, 2) == ["ddp", "zero2", "fsdp"]  # `shard` is a default lever
    assert strategies_for(cfg, 2, pinned="fsdp") == ["fsdp"]  # a resume keeps its checkpoints' format
    fixed = cfg_of(budget_levers=["checkpoint", "micro_batches"])
    assert strategies_for(fixed, 4) == ["ddp"]  # without the lever: the configured strategy alone
    zero2 = Config.model_validate({"memory": {"budget": "1GiB", "budget_levers": ["checkpoint"]},
                                   "distributed": {"strategy": "zero2"}})
    assert configured(zero2) == "zero2" and strategies_for(zero2, 2) == ["zero2"]
    with pytest.raises(ConfigError, match="budget_levers"):
        load_config(None, ["memory.budget_levers=[checkpoint,sharding]"])


def test_plans_combine_the_levers_with_the_strategy_and_cut_each_rank_s_share():
    one = candidates(2, False, 16, 1, 1, "fp32", False, eval_default=64)
    two = candidates(2, False, 16, 1, 1, "fp32", False, eval_default=64, strategy="zero2", ranks=2)
    # the same levers; micro-batches cut a rank's 8 samples (1, 2, 4, 8), not the step's 16 (..., 16)
    assert {c.micro_batches for c in one} == {1, 2, 4, 8, 16} and {c.micro_batches for c in two} == {1, 2, 4, 8}
    assert {(c.strategy, c.ranks) for c in two} == {("zero2", 2)} and two[0].eval_batch == 8
    c = next(c for c in two if c.checkpointing == "all" and c.micro_batches == 2 and c.offload == "off")
    assert c.key == "all/2/fp32/zero2" and c.key not in {x.key for x in one}
    assert c.describe(16) == "checkpointing every block, 2 micro-batches of 4 per rank, fp32, ZeRO-2 over 2 ranks"
    assert one[0].describe(16) == "no checkpointing, 1 micro-batch of 16, fp32"  # one process: as before
    fsdp = next(x for x in candidates(2, False, 16, 1, 1, "fp32", False, strategy="fsdp", ranks=2) if x.key == "off/1/fp32/fsdp")
    assert c.family != Candidate("all", 2, "fp32", 2, strategy="fsdp", ranks=2).family  # errs per strategy
    cfg = cfg_of()
    z, f = applied(cfg, c), applied(cfg, fsdp)
    d = applied(applied(cfg, fsdp), Candidate("off", 1, "fp32", strategy="ddp", ranks=2))
    assert (z.distributed.strategy, z.distributed.fsdp.reshard_after_forward) == ("fsdp", False)  # zero2
    assert (f.distributed.strategy, f.distributed.fsdp.reshard_after_forward) == ("fsdp", True)
    assert d.distributed.strategy == "ddp" and z.memory.activation_checkpointing == "all"
    assert applied(cfg, one[0]).distributed.strategy == "ddp"  # no strategy in the plan: the configured one
    # optimizer offload refuses sharded (DTensor) state: a lever of DDP's plans only; the chunked loss not FSDP's
    levers = dict(chunkable=True, has_optim_state=True, ranks=2)
    plans = {s: candidates(2, False, 16, 1, 1, "fp32", False, strategy=s, **levers) for s in ("ddp", "zero2", "fsdp")}
    assert [any(x.optim_offload for x in plans[s]) for s in plans] == [True, False, False]
    assert [any(x.chunked for x in plans[s]) for s in plans] == [True, True, False]


# per strategy: (peak MiB, s/step) of each plan a table search may measure; 2 blocks, micro 1 and 2
PEAKS = {"ddp": {"off": 1000, "every_n:2": 940, "all": 900}, "zero2": {"off": 760, "every_n:2": 700, "all": 660},
         "fsdp": {"off": 620, "every_n:2": 560, "all": 520}}
COST = {"ddp": 1.0, "zero2": 1.05, "fsdp": 1.3}


def table_search(budget_mib, refuse=(), peaks=PEAKS, cost=COST):
    calls = []

    def one(strategy, closest, beat):
        if strategy in refuse:
            raise Refused(f"methods.ema: not supported with distributed.strategy={strategy}")
        cands = [c for c in candidates(2, False, 4, 1, 1, "fp32", False, ["checkpoint", "micro_batches"],
                                       strategy=strategy, ranks=2) if c.micro_batches <= 2]

        def measure(c, first):
            calls.append(c.key)
            peak = peaks[strategy][c.checkpointing] - 20 * (c.micro_batches - 1)
            m = Measured(c, peak * MiB, cost[strategy] * (1 + 0.2 * c.n_checkpointed + 0.05 * c.micro_batches))
            est = {x.key: (peaks[strategy][x.checkpointing] - 20 * (x.micro_batches - 1) - 400) * MiB for x in cands}
            return (m, Baseline(400 * MiB, 400 * MiB, 200 * MiB, est, 2, 100 * MiB)) if first else m

        return search(cands[0], lambda info: cands, budget_mib * MiB, 0.05, measure, 4, closest, beat)

    return search_strategies(["ddp", "zero2", "fsdp"], "ddp", one), calls


def test_a_budget_ddp_meets_stops_at_ddp():
    s, calls = table_search(2000)
    assert calls == ["off/1/fp32/ddp"] and s.chosen.candidate.strategy == "ddp"


def test_sharding_wins_over_recompute_when_it_is_faster_and_stops_once_a_baseline_fits():
    s, calls = table_search(850)  # usable 807.5 MiB: every DDP plan is over, ZeRO-2's baseline (760) fits
    assert calls[0] == "off/1/fp32/ddp" and calls[-1] == "off/1/fp32/zero2"
    assert not any(k.endswith("/fsdp") for k in calls)  # ZeRO-2's least constrained plan fits: FSDP only costs more
    assert s.chosen.candidate.key == "off/1/fp32/zero2" and s.ranks == 2
    text = format_search(s, 4)
    assert "pick: no checkpointing, 1 micro-batch of 2 per rank, fp32, ZeRO-2 over 2 ranks" in text
    assert "runner-up:" in text and "DDP over 2 ranks" in text.split("runner-up:")[1]
    back = from_record(json.loads(json.dumps(s.record(4))))
    assert back.chosen.candidate == s.chosen.candidate and back.ranks == 2
    assert back.chosen.candidate.strategy == "zero2" and back.chosen.candidate.ranks == 2


def test_recompute_within_a_cheaper_strategy_beats_a_slower_one():
    # usable 731.5 MiB: ZeRO-2 fits with checkpointing (700, 1.05 x 1.25), FSDP's baseline (620) costs 1.3 x 1.05
    s, calls = table_search(770)
    assert any(k.endswith("/fsdp") for k in calls)  # ZeRO-2's baseline did not fit: FSDP is measured too
    assert s.chosen.candidate.strategy == "zero2" and s.chosen.candidate.checkpointing != "off"


def test_a_strategy_slower_than_a_plan_that_fits_is_measured_once():
    # sharding saves little here (10 MiB) and costs twice the time: DDP fits with checkpointing (900 MiB, 1.45)
    peaks = {s: {k: v - 10 * i for k, v in PEAKS["ddp"].items()} for i, s in enumerate(("ddp", "zero2", "fsdp"))}
    s, calls = table_search(975, peaks=peaks, cost={"ddp": 1.0, "zero2": 2.0, "fsdp": 2.0})  # usable 926 MiB
    assert [k for k in calls if not k.endswith("/ddp")] == ["off/1/fp32/zero2", "off/1/fp32/fsdp"]
    assert s.chosen.candidate.strategy == "ddp" and s.chosen.candidate.checkpointing != "off"


def test_a_strategy_the_config_refuses_is_left_out_and_none_fits_says_what_next():
    s, calls = table_search(850, refuse=("zero2",))
    assert not any(k.endswith("/zero2") for k in calls) and s.chosen.candidate.key == "off/1/fp32/fsdp"
    with pytest.raises(ConfigError, match="ddp"):
        table_search(850, refuse=("ddp",))  # the configured strategy's refusal is the user's error

    def failing(strategy, closest, beat):
        raise ConfigError(f"one plan of {strategy}")

    with pytest.raises(ConfigError, match="one plan of zero2"):  # a plan failing past a baseline: not a refusal
        search_strategies(["zero2", "ddp"], "ddp", failing)
    s, calls = table_search(400)
    assert s.chosen is None and calls[-1] == "all/2/fp32/fsdp"  # only the last search measures its most frugal plan
    line = none_fits_line(s, 4)
    assert "\n" not in line and "FSDP over 2 ranks" in line and "more ranks than 2" in line


def test_the_measuring_group_is_not_torchrun_s():
    env = {"PATH": "/bin", "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "GROUP_WORLD_SIZE": "2",
           "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "3", "MASTER_PORT": "29500"}
    out = group_env(env, 1, 2, 41000)
    assert out == {"PATH": "/bin", "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "41000"}


def test_what_a_strategy_holds_is_kept_out_of_the_activations_scale():
    # ZeRO-2's baseline: 400 MiB of process, 200 of its state shards, 300 of gathered parameters, 100 of activations
    info = Baseline(400 * MiB, 400 * MiB, 200 * MiB, {"off/1/fp32/zero2": 50 * MiB, "off/2/fp32/zero2": 25 * MiB}, 0,
                    strategy_bytes=300 * MiB)
    base = Measured(Candidate("off", 1, "fp32", strategy="zero2", ranks=2), 1000 * MiB, 1.0)
    # half the activations at 2 micro-batches: 50 MiB less, not half of everything over the model state
    assert predict(base, info, Candidate("off", 2, "fp32", strategy="zero2", ranks=2)) == 950 * MiB


def test_each_strategy_s_holdings_from_the_model():
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4))  # blocks of 144 and 68 parameters, fp32
    model[1].bias.requires_grad_(False)
    assert strategy_bytes(model, None) == 0
    assert strategy_bytes(model, "ddp") == (144 + 64) * 4  # the gradient buckets: trainable parameters only
    assert strategy_bytes(model, "zero2") == (212 + 144) * 4  # all parameters gathered, one block's gradients
    assert strategy_bytes(model, "fsdp") == 3 * 144 * 4  # the root holds none of its own here


def test_a_plan_the_users_config_refuses_is_a_config_error_not_a_validation_traceback():
    # chunked_loss=on is the user's; the FSDP (ZeRO-3) plan cannot keep it: one line, so the search leaves
    # FSDP out (measured() turns it into Refused) instead of failing with pydantic's ValidationError
    cfg = load_config("recipes/lm_small.yaml", ["memory.chunked_loss=on", "distributed.strategy=ddp"])
    assert applied(cfg, Candidate("off", 1, "fp32", strategy="zero2", ranks=2)).memory.chunked_loss == "on"
    with pytest.raises(ConfigError, match=r"refused by the config: memory.chunked_loss=on with distributed.strategy=fsdp"):
        applied(cfg, Candidate("off", 1, "fp32", strategy="fsdp", ranks=2))
