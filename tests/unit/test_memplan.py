"""memory.budget (memory/planner.py): parsing, candidates, the choice, the record and a resume's reuse.

The search's measuring function is given here as a table of peaks and step times (what the fresh
processes of memplan_measure would report), so the choice logic is checked on known numbers; the
real measuring runs in tests/integration/test_memory_budget.py."""

import json

import pytest

from ecotrain.config import Config, load_config
from ecotrain.base.errors import ConfigError, EcotrainError
from ecotrain.memory.planner import (FULL, PLAN_FILE, TIE, Baseline, Candidate, Measured, applied, candidates, checkpoint_levels,
                              choose, corrected, from_record, micro_counts, none_fits_line, parse_bytes, pareto, search)
from ecotrain.core.distributed import Dist
from ecotrain.memory.measure import for_run

MiB = 2**20


@pytest.mark.parametrize("text, n", [("2GiB", 2 * 2**30), ("512MiB", 512 * MiB), ("1.5GB", 1_500_000_000),
                                     ("800M", 800_000_000), (3_000_000_000, 3_000_000_000), ("2 gib", 2 * 2**30)])
def test_parse_bytes(text, n):
    assert parse_bytes(text) == n


@pytest.mark.parametrize("bad", ["abc", "2 parsecs", "-1GiB", "12", "0.5KiB", True, "", "1e400GiB"])
def test_parse_bytes_refuses(bad):
    with pytest.raises(ValueError):
        parse_bytes(bad)


def test_bad_budget_is_one_line_naming_the_key(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("data: {name: digits}\n")
    with pytest.raises(ConfigError) as e:
        load_config(recipe, ["memory.budget=2 parsecs"])
    msg = str(e.value)
    assert "memory.budget" in msg and "2GiB" in msg and "\n" not in msg
    assert load_config(recipe, ["memory.budget=512MiB"]).memory.budget == 512 * MiB
    assert load_config(recipe).memory.budget is None


def test_checkpoint_levels_from_none_to_all():
    assert checkpoint_levels(6, False) == [("off", 0), ("every_n:6", 1), ("every_n:3", 2), ("every_n:2", 3), ("all", 6)]
    assert checkpoint_levels(1, False) == [("off", 0), ("all", 1)]
    assert checkpoint_levels(0, False) == [("off", 0)]
    assert checkpoint_levels(6, True) == [("off", 0), ("modules", 0)]


def test_micro_counts_keep_the_effective_batch_and_the_minimum():
    assert micro_counts(8, 1, 1) == [1, 2, 4, 8]
    assert micro_counts(8, 1, 2) == [1, 2, 4]
    assert micro_counts(8, 2, 1) == [2, 4, 8]
    assert micro_counts(6, 1, 1) == [1, 2, 4]  # 6 in 4 pieces is 2,2,2,0 at most 2 each; 8 pieces would repeat 1
    assert micro_counts(1, 1, 1) == [1]


def test_candidates_first_is_the_least_constrained_and_precision_only_when_allowed():
    old = ("checkpoint", "micro_batches")  # the levers before selective recompute and offload
    cs = candidates(6, False, 8, 1, 1, "fp32", False, old)
    assert cs[0] == Candidate("off", 1, "fp32", 0)
    assert {c.precision for c in cs} == {"fp32"} and len(cs) == 5 * 4
    both = candidates(6, False, 8, 1, 1, "fp32", True, old)
    assert {c.precision for c in both} == {"fp32", "bf16-mixed"} and len(both) == 40
    assert len({c.key for c in both}) == 40


def test_candidates_combine_policy_offload_and_micro_batches_within_the_levers_allowed():
    cs = candidates(6, False, 8, 1, 1, "fp32", False, eval_default=32)
    assert cs[0] == Candidate("off", 1, "fp32", 0, eval_batch=8)
    # levels off, 1, 2, 3 blocks, all; two policies when checkpointing; offload of the first 1..all of
    # the blocks not checkpointed (6 of 6, 5, 4, 3 of them), none when every block is checkpointed
    assert len(cs) == ((1 + 6) + 2 * ((1 + 5) + (1 + 4) + (1 + 3)) + 2 * 1) * 4 and len({c.key for c in cs}) == len(cs)
    assert {c.offload for c in cs} == {"off", "on"}  # bf16 offload only with allow_precision_change
    assert not [c for c in cs if c.checkpointing == "all" and c.offload != "off"]
    sel = next(c for c in cs if c.key == "every_n:2+matmuls/2/fp32/offload")
    assert sel.n_checkpointed == 3 and sel.n_offloaded == 3 and sel.eval_batch == 4
    assert sel.describe(8) == ("selective recompute of 3 blocks (every_n=2), offload of the other 3, "
                               "2 micro-batches of 4, fp32")
    part = next(c for c in cs if c.key == "every_n:2+matmuls/1/fp32/offload:2")
    assert part.offload_blocks == 2 and part.describe(8) == (
        "selective recompute of 3 blocks (every_n=2), offload of 2 of the other blocks, 1 micro-batch of 8, fp32")
    assert applied(load_config(None, []), part).memory.offload_blocks == 2
    exact = candidates(6, False, 8, 1, 1, "fp32", False, ("checkpoint", "selective", "offload"))
    assert {c.micro_batches for c in exact} == {1}  # micro-batches left out: one forward per step, as configured
    assert {c.offload for c in candidates(6, False, 8, 1, 1, "fp32", True)} == {"off", "on", "bf16"}
    assert {(c.checkpointing, c.policy) for c in candidates(6, False, 8, 1, 1, "fp32", False, ["selective"])} == \
        {("off", "attention"), ("every_n:6", "matmuls"), ("every_n:3", "matmuls"), ("every_n:2", "matmuls"),
         ("all", "matmuls")}


def test_budget_levers_are_checked_in_one_line():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["memory.budget_levers=[checkpoint,offlaod]"])
    assert "memory.budget_levers" in str(e.value) and "\n" not in str(e.value)
    assert load_config(None, ["memory.budget_levers=[offload]"]).memory.budget_levers == ["offload"]


def test_evaluation_counts_in_the_fit():
    fast = Measured(Candidate("off", 1, "fp32"), 600 * MiB, 1.0, eval_peak_bytes=900 * MiB)
    slow = Measured(Candidate("all", 1, "fp32"), 650 * MiB, 1.3, eval_peak_bytes=700 * MiB)
    assert fast.top == 900 * MiB
    assert choose([fast, slow], 800 * MiB) is slow  # the fast plan's evaluation would pass the budget
    rec = json.loads(json.dumps(search(slow.candidate, lambda info: [], 2000 * MiB, 0.05,
                                       lambda c, first: (slow, Baseline(0, 0, 0, {}, 0)), 1).record(1)))
    assert rec["chosen"]["eval_peak_bytes"] == 700 * MiB and from_record(rec).chosen.top == 700 * MiB
    cfg = Config.model_validate({"memory": {"budget": "1GiB"}, "data": {"batch_size": 8}})
    out = applied(cfg, Candidate("every_n:2", 2, "fp32", 1, "matmuls", "on", 1, 4))
    assert (out.memory.checkpoint_policy, out.memory.activation_offload, out.memory.eval_batch_size) == \
        ("matmuls", "on", 4)


def m(level, n, peak_mib, secs, prec="fp32", count=0):
    return Measured(Candidate(level, n, prec, count), peak_mib * MiB, secs)


def test_choose_fastest_that_fits_with_margin():
    ms = [m("off", 1, 1000, 1.0), m("every_n:2", 1, 800, 1.1), m("all", 1, 600, 1.2), m("off", 2, 700, 1.05)]
    assert choose(ms, 10_000 * MiB).candidate.key == "off/1/fp32"
    assert choose(ms, 950 * MiB).candidate.key == "off/2/fp32"  # faster than every_n:2, and fits
    assert choose(ms, 650 * MiB).candidate.key == "all/1/fp32"
    assert choose(ms, 500 * MiB) is None
    assert [x.candidate.key for x in pareto(ms)] == ["all/1/fp32", "off/2/fp32", "off/1/fp32"]


def test_a_tie_in_step_cost_goes_to_the_fuller_plan():
    # within TIE (3%) of the fastest the step costs are one measurement's noise: the fuller plan wins
    full, lean = m("every_n:2", 1, 900, 1.02), m("all", 1, 600, 1.0)
    assert choose([lean, full], 950 * MiB) is full
    slower = m("every_n:2", 1, 900, 1.0 * (1 + TIE) + 0.01)
    assert choose([lean, slower], 950 * MiB) is lean  # past the tie: the fastest
    assert choose([lean, full], 800 * MiB) is lean  # the fuller one does not fit


def test_corrections_reach_families_not_measured_yet():
    a = Candidate("every_n:2", 1, "fp32", 3, "attention", "on", 2, offload_blocks=2)
    b = Candidate("every_n:2", 1, "fp32", 3, "attention", "on", 3)  # same family, all 3 offloaded
    c = Candidate("all", 1, "fp32", 6)  # another family, never measured
    raw = {"off/1/fp32": 2000, a.key: 1100, b.key: 1000, c.key: 800}
    base = Measured(Candidate("off", 1, "fp32"), 2000, 1.0)
    got = corrected(raw, [a, b, c], [base, Measured(a, 1300, 1.0)], 500)  # a measured 1.33x its estimate above 500
    assert a.family == b.family and a.group != b.group
    assert got[b.key] == int(500 + (800 / 600) * 500) and got[c.key] == int(500 + (800 / 600) * 300)


class Table:
    """A measuring function over known (peak MiB, s/step) per candidate key; counts what it measured."""

    def __init__(self, table, estimates):
        self.table, self.estimates, self.calls = table, estimates, []

    def __call__(self, c, first):
        self.calls.append(c.key)
        peak, secs = self.table[c.key]
        out = Measured(c, peak * MiB, secs)
        if not first:
            return out
        return out, Baseline(300 * MiB, 300 * MiB, 10 * MiB, {k: v * MiB for k, v in self.estimates.items()}, 2)


def cands():
    return candidates(2, False, 4, 1, 1, "fp32", False)  # levels off, every_n:2, all; micro 1, 2, 4


# peaks (MiB) and s/step of the 9 plans: 300 MiB of process, the rest activations
TRUE = {"off/1/fp32": (1000, 1.0), "off/2/fp32": (660, 1.02), "off/4/fp32": (490, 1.1),
        "every_n:2/1/fp32": (700, 1.1), "every_n:2/2/fp32": (520, 1.12), "every_n:2/4/fp32": (420, 1.2),
        "all/1/fp32": (450, 1.25), "all/2/fp32": (390, 1.3), "all/4/fp32": (350, 1.4)}
EST = {"off/1/fp32": 690, "off/2/fp32": 345, "off/4/fp32": 172, "every_n:2/1/fp32": 380, "every_n:2/2/fp32": 190,
       "every_n:2/4/fp32": 95, "all/1/fp32": 140, "all/2/fp32": 70, "all/4/fp32": 35}


def run_search(budget_mib, table=TRUE, limit=4):
    t = Table(table, EST)
    first = cands()[0]
    s = search(first, lambda info: cands(), budget_mib * MiB, 0.05, t, limit)
    return s, t.calls


def test_search_stops_at_the_baseline_when_it_fits():
    s, calls = run_search(2000)
    assert calls == ["off/1/fp32"] and s.chosen.candidate.key == "off/1/fp32"


def test_search_measures_the_least_constrained_predicted_plans_and_picks_the_fastest_that_fits():
    s, calls = run_search(730)  # usable 693.5 MiB
    assert calls[0] == "off/1/fp32"
    assert "off/2/fp32" in calls and "all/4/fp32" not in calls  # dominated plans are not measured
    assert s.chosen.candidate.key == "off/2/fp32"  # 660 MiB fits, 1.02 s beats every_n:2's 1.1 s
    assert all(x.peak_bytes <= s.usable for x in s.measured if x is s.chosen)
    assert len(calls) <= 5


def test_search_moves_on_when_a_prediction_was_too_low():
    table = {**TRUE, "off/2/fp32": (720, 1.02)}  # predicted ~645 MiB, measures over the usable 693.5
    s, calls = run_search(730, table)
    # every_n:2/1 (700 MiB) is over while nothing fits: its group's next plan is measured next
    assert calls[1:3] == ["every_n:2/1/fp32", "every_n:2/2/fp32"]
    # once a plan fits (520 MiB), a fuller one is tried (off/2, over), but never one leaner than the plan in hand
    assert "off/2/fp32" in calls and "off/4/fp32" not in calls
    assert s.chosen.candidate.key == "every_n:2/2/fp32" and s.chosen.peak_bytes <= s.usable


def test_a_plan_at_95_percent_of_the_usable_budget_ends_the_search():
    s, calls = run_search(730)  # off/2 measures 660 MiB, >= 0.95 x 693.5
    assert calls[-1] == "off/2/fp32" and s.chosen.candidate.key == "off/2/fp32"
    # every_n:2/2 fits at 520 MiB, under 95%: the search goes on to the fuller off/2 (600 MiB), then stops
    # because no plan left is predicted between 600 MiB and the usable budget
    s, more = run_search(730, {**TRUE, "off/2/fp32": (600, 1.02)}, limit=8)
    assert more == ["off/1/fp32", "every_n:2/1/fp32", "every_n:2/2/fp32", "off/2/fp32"]
    assert s.chosen.candidate.key == "off/2/fp32" and s.chosen.top < FULL * s.usable


def test_a_group_measured_under_its_prediction_tries_fewer_micro_batches_next():
    table = {**TRUE, "every_n:2/2/fp32": (420, 1.12), "every_n:2/1/fp32": (560, 1.05)}
    s, calls = run_search(600, table)  # usable 570 MiB: every_n:2/1 predicted 690, over
    assert calls[:3] == ["off/1/fp32", "every_n:2/2/fp32", "every_n:2/1/fp32"]  # 420 measured: 530 corrected
    assert s.chosen.candidate.key == "every_n:2/1/fp32" and s.chosen.predicted_bytes < 600 * MiB


def test_no_plan_fits_says_the_smallest_peak_and_the_next_lever():
    s, calls = run_search(330)
    assert s.chosen is None
    assert "all/4/fp32" in calls  # the most frugal plan was measured, to say how close it came
    line = none_fits_line(s, 4)
    assert "\n" not in line and "no plan fits" in line and "350 MiB" in line
    assert "sharding" in line


def test_record_round_trip_and_applied_config():
    s, _ = run_search(730)
    rec = json.loads(json.dumps(s.record(4)))
    back = from_record(rec)
    assert back.reused and back.chosen.candidate == s.chosen.candidate
    assert [x.peak_bytes for x in back.measured] == [x.peak_bytes for x in s.measured]
    cfg = Config.model_validate({"memory": {"budget": "1GiB"}, "precision": "fp32"})
    out = applied(cfg, Candidate("every_n:3", 2, "bf16-mixed", 2))
    assert out.memory.activation_checkpointing.every_n == 3 and out.precision == "bf16-mixed"
    assert applied(cfg, Candidate("all", 1, "fp32")).memory.activation_checkpointing == "all"


def test_no_budget_changes_nothing(tmp_path):
    cfg = Config.model_validate({"data": {"name": "digits"}})
    out, s = for_run(cfg, tmp_path, None, [], Dist())
    assert out is cfg and s is None


def test_budget_refuses_own_parts_and_a_job_over_several_machines(tmp_path, monkeypatch):
    cfg = Config.model_validate({"memory": {"budget": "1GiB"}})
    with pytest.raises(EcotrainError, match=r"fit\(model=\.\.\.\)"):
        for_run(cfg, tmp_path, None, ["model"], Dist())
    two = Dist()
    two.world_size = 2  # 2 ranks, 1 on this machine: the measuring group would not be this job's shape
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    with pytest.raises(ConfigError, match="one machine") as e:
        for_run(cfg, tmp_path, None, [], two)
    assert "\n" not in str(e.value)


def test_resume_reuses_the_recorded_choice_without_measuring(tmp_path):
    s, _ = run_search(730)
    (tmp_path / PLAN_FILE).write_text(json.dumps(s.record(4)))
    # a config whose data cannot even be loaded: measuring anything would fail, reading the record does not
    cfg = Config.model_validate({"data": {"name": "pkg_that_does_not_exist:load"}, "memory": {"budget": 730 * MiB},
                                 "precision": "fp32"})
    out, again = for_run(cfg, tmp_path, tmp_path / "checkpoints" / "step-00000003", [], Dist())
    assert again.reused and again.chosen.candidate == s.chosen.candidate
    assert again.seconds == s.record(4)["search_seconds"]
    assert out.memory.activation_checkpointing == "off" and out.precision == "fp32"
    # a checkpoint resumed into another folder: its own run folder's record
    other = tmp_path / "elsewhere"
    out2, again2 = for_run(cfg, other, tmp_path / "checkpoints" / "step-00000003", [], Dist())
    assert again2.reused and again2.chosen.candidate == s.chosen.candidate


def test_resume_with_a_changed_budget_measures_again(tmp_path):
    s, _ = run_search(730)
    (tmp_path / PLAN_FILE).write_text(json.dumps(s.record(4)))
    cfg = Config.model_validate({"data": {"name": "pkg_that_does_not_exist:load"}, "memory": {"budget": 900 * MiB}})
    with pytest.raises(EcotrainError, match="measuring the plan"):  # it tried to measure: the data cannot load
        for_run(cfg, tmp_path, tmp_path / "checkpoints" / "step-00000003", [], Dist())
