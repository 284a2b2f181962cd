"""threads.pick: `threads: auto` chosen by a probe of the run's own config with each candidate count,
in its own process, by what the objective pays per step; the decision is cached per recipe and
machine, so the next run of the recipe (any seed) trains with the same count."""

import json
import os

import pytest
import torch

from ecotrain.core import threads
from ecotrain.accounting import threadpick
from ecotrain.accounting.threadpick import probe_config
from ecotrain.config import load_config
from tests.helpers.deadline import deadline


def test_candidates_and_the_objective():
    assert threads.candidates(2) == [1, 2] and threads.candidates(6) == [1, 2, 4, 6]
    assert threads.objective({}) == "energy" and threads.objective({threads.OBJECTIVE_ENV: "Time"}) == "time"


def test_no_probe_for_a_library_call_or_a_set_count(monkeypatch):
    cfg = load_config("recipes/mnist1d_cnn.yaml", [])
    monkeypatch.setattr(threads, "_PRESET", None)  # fit() called as a library: no CLI preset
    assert threadpick.wanted(cfg, torch.device("cpu")) is None
    monkeypatch.setattr(threads, "_PRESET", threads.ThreadChoice(2, "auto", 2, 2, None))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert threadpick.wanted(cfg, torch.device("cpu")) == 2
    assert threadpick.wanted(load_config("recipes/mnist1d_cnn.yaml", ["threads=2"]), torch.device("cpu")) is None
    monkeypatch.setenv(threads.PROBE_ENV, "0")
    assert threadpick.wanted(cfg, torch.device("cpu")) is None


def run(steps, wall, cpu, kwh=None, cost=None):  # one probe run's ledger totals
    return {"steps": steps, "wall": wall, "cpu": cpu, "kwh": kwh, "cost": cost}


def per_step(n, wall, cpu, kwh=None, cost=None):  # one candidate's per-step figures
    return {"threads": n, "wall_per_step": wall, "cpu_per_step": cpu, "kwh_per_step": kwh, "cost_per_step": cost}


def test_the_steady_step_is_the_difference_of_two_lengths():
    """Set-up, test and save (here 0.5 s, 0.6 CPU-s) cancel: 3 ms a step, not the 40-step average of 15.5 ms."""
    p = threads.steady(run(20, 0.5 + 20 * 0.003, 0.6 + 20 * 0.003, kwh=1e-5 + 20 * 1e-7),
                       run(120, 0.5 + 120 * 0.003, 0.6 + 120 * 0.003, kwh=1e-5 + 120 * 1e-7), 1)
    assert p["wall_per_step"] == pytest.approx(0.003) and p["cpu_per_step"] == pytest.approx(0.003)
    assert p["kwh_per_step"] == pytest.approx(1e-7) and p["cost_per_step"] is None and p["fallbacks"] == 0
    assert p["probe_wall_seconds"] == pytest.approx(1.0 + 140 * 0.003)
    assert (p["short_steps"], p["long_steps"]) == (20, 120)


def test_a_noisy_difference_falls_back_to_the_long_runs_average():
    # the long run's wall less than the short one's (load noise), its CPU equal: each the long run's average
    p = threads.steady(run(20, 1.0, 0.9, kwh=float("nan")), run(120, 0.9, 0.9, kwh=2e-5), 2)
    assert p["wall_per_step"] == pytest.approx(0.9 / 120) and p["cpu_per_step"] == pytest.approx(0.9 / 120)
    assert p["kwh_per_step"] == pytest.approx(2e-5 / 120) and p["fallbacks"] == 3
    same = threads.steady(run(80, 1.0, 1.0), run(80, 1.2, 1.2), 1)  # no steps between: no difference to take
    assert same["wall_per_step"] == pytest.approx(1.2 / 80) and same["fallbacks"] == 2
    assert all(threads._finite(v) for v in {**p, **same}.values())  # what threads.json keeps is finite


def test_more_threads_only_where_they_pay_no_more_than_one():
    one = per_step(1, 0.0027, 0.0027)
    # faster, and CPU (energy) down: but 2 cores held for 0.7x the wall is 1.4x the money
    two = per_step(2, 0.0019, 0.0025)
    chosen, why = threads.decide([one, two], "energy")
    assert chosen is one and why.startswith("2 threads beat 1 on energy (0.93x)")
    assert "1.41x its money" in why
    chosen, why = threads.decide([one, two], "time")  # the fastest, but no count may raise the money
    assert chosen is one and "1.41x its money" in why
    # a priced run: its cost per step is the money figure, not wall x threads
    assert threads.decide([{**one, "cost_per_step": 1.0}, {**two, "cost_per_step": 1.0}], "energy")[0]["threads"] == 2
    # more than 2x faster: less energy and less money, so 2 threads
    fast = per_step(2, 0.0012, 0.0024)
    chosen, why = threads.decide([one, fast], "energy")
    assert chosen is fast and why == "0.89x 1 thread's energy per step, and no more energy (0.89x) or money (0.89x)"
    # within TIE of 1 thread: 1 (the probe's noise is not a reason to hold more cores)
    assert threads.decide([one, per_step(2, 0.00134, 0.00265)], "energy") == (
        one, "no count beat 1 thread's energy by more than 3%")
    # a measured energy figure decides energy, not CPU-seconds
    hot = per_step(2, 0.0012, 0.0020, kwh=2e-7)
    assert threads.decide([per_step(1, 0.0027, 0.0027, kwh=1e-7), hot], "energy")[0]["threads"] == 1
    # several admissible: the fewest threads within TIE of the best
    four = per_step(4, 0.0005, 0.0024)
    assert threads.decide([one, fast, four], "money")[0] is four  # 4 x 0.5 ms = 2.0 core-ms < 2 x 1.2 ms
    assert threads.decide([one, fast, per_step(4, 0.000595, 0.0024)], "energy")[0] is fast  # energy ties: fewer


@pytest.mark.subprocess
def test_a_probe_decides_once_and_the_decision_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("ECOTRAIN_CACHE", str(tmp_path))
    cfg = probe_config(load_config("recipes/mnist1d_cnn.yaml", ["data.num_samples=600", "ledger.energy=off"]))
    first = threads.pick(cfg, 2, "energy", steps=(3, 9))
    assert first["threads"] in (1, 2) and not first["cached"] and first["method"] == "steady"
    assert [p["threads"] for p in first["probes"]] == [1, 2] and all(p["cpu_per_step"] > 0 for p in first["probes"])
    assert all((p["short_steps"], p["long_steps"]) == (3, 9) for p in first["probes"])
    assert first["line"].startswith(f"threads: {first['threads']} of 2 usable cores, chosen for energy")
    # per step: the difference over the 6 steps between (or, under noise, the long run's mean), never more than
    # both runs' whole wall time over those 6 steps (a load-free bound: the runs' own set-up is not in it)
    assert all(0 < p["wall_per_step"] <= p["probe_wall_seconds"] / 6 for p in first["probes"])
    # energy off in the probe: CPU-seconds per step decide (the CPU-time based energy), as decide() says
    assert first["threads"] == threads.decide(first["probes"], "energy")[0]["threads"]
    again = threads.pick({**cfg, "seed": 7}, 2, "energy", steps=(3, 9))  # another seed: same recipe, same machine
    assert again["cached"] and again["threads"] == first["threads"]
    assert first["key"] in json.loads((tmp_path / "threads.json").read_text())


GARBAGE = [  # threads.json is a file anyone can edit: none of these is trusted, none reaches the ledger
    "not json {", "[1, 2]", "[" * 100000, '{"K": [1]}', '{"K": {"threads": 2}}', '{"K": {"threads": -3, "line": "x"}}',
    '{"K": {"threads": 1000000, "line": "x"}}', '{"K": {"threads": true, "line": "x"}}',
    '{"K": {"threads": 1, "line": 5, "when": "w", "objective": "energy", "probes": [], "probe_cost": {}}}',
    '{"K": {"threads": 1, "line": "x", "when": "w", "objective": "energy", "probes": "zz", "probe_cost": {}}}',
    '{"K": {"threads": 1, "line": "x", "when": "w", "objective": "energy", "probes": [], "probe_cost": {"kwh": NaN}}}',
    '{"K": {"threads": 1, "line": "x", "when": "w", "objective": "time", "probes": [], "probe_cost": {}}}',
    # whole, but decided by the old probe (set-up counted in its per-step figures): probed again
    '{"K": {"threads": 2, "line": "x", "when": "w", "objective": "energy", "probes": [], "probe_cost": {}}}',
    '{"K": {"threads": 2, "line": "x", "when": "w", "objective": "energy", "method": "mean", "probes": [], '
    '"probe_cost": {}}}',
]


@pytest.mark.parametrize("text", GARBAGE, ids=range(len(GARBAGE)))
def test_a_damaged_cache_is_probed_again_and_written_over(tmp_path, monkeypatch, text):
    monkeypatch.setenv("ECOTRAIN_CACHE", str(tmp_path))
    cfg = {"model": {"name": "x"}}
    key = threads.probe_key(cfg, "energy", 2)
    (tmp_path / "threads.json").write_text(text.replace('"K"', json.dumps(key)))
    probed = []

    def probe(cfg, n, steps, folder):
        probed.append(n)
        return per_step(n, 0.01, 0.01 * n)

    monkeypatch.setattr(threads, "probe_once", probe)
    got = threads.pick(cfg, 2, "energy", steps=(1, 3))
    assert probed == [1, 2] and got["threads"] == 1 and not got["cached"]
    again = threads.pick(cfg, 2, "energy", steps=(1, 3))  # written over: the next run reads it back
    assert again["cached"] and again["threads"] == 1 and probed == [1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["threads.json"]


def test_a_fifo_for_threads_json_is_no_cache_never_a_wait(tmp_path, monkeypatch):
    """A FIFO with no writer in the user cache would block every run at start, past SIGTERM: it is read as
    no cache (probe=False: no decision), then written over by the next decision."""
    monkeypatch.setenv("ECOTRAIN_CACHE", str(tmp_path))
    os.mkfifo(tmp_path / "threads.json")
    cfg = {"model": {"name": "x"}}
    with deadline(20, "threads.pick"):
        assert threads.pick(cfg, 2, "energy", probe=False) is None
    monkeypatch.setattr(threads, "probe_once", lambda cfg, n, steps, folder: per_step(n, 0.01, 0.01 * n))
    with deadline(20, "threads.pick"):
        assert not threads.pick(cfg, 2, "energy", steps=(1, 3))["cached"]
    assert (tmp_path / "threads.json").is_file()  # the FIFO replaced by the decision
    assert threads.pick(cfg, 2, "energy", probe=False)["cached"]


def test_a_threads_json_above_the_limit_is_no_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ECOTRAIN_CACHE", str(tmp_path))
    cfg = {"model": {"name": "x"}}
    monkeypatch.setattr(threads, "probe_once", lambda cfg, n, steps, folder: per_step(n, 0.01, 0.01 * n))
    threads.pick(cfg, 2, "energy", steps=(1, 3))
    assert threads.pick(cfg, 2, "energy", probe=False)["cached"]  # whole and small: trusted
    table = json.loads((tmp_path / "threads.json").read_text())
    (tmp_path / "threads.json").write_text(json.dumps({**table, "pad": "x" * threads.CACHE_LIMIT}))
    assert threads.pick(cfg, 2, "energy", probe=False) is None  # the same decision, in a file too big to read


def test_an_unwritable_cache_leaves_no_half_written_file(tmp_path, monkeypatch):
    (tmp_path / "threads.json").mkdir()  # os.replace onto a folder fails after the temporary file is written
    monkeypatch.setenv("ECOTRAIN_CACHE", str(tmp_path))
    monkeypatch.setattr(threads, "probe_once", lambda cfg, n, steps, folder: per_step(n, 0.01, 0.01))
    assert threads.pick({"model": {}}, 2, "energy", steps=(1, 3))["threads"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["threads.json"]


def test_a_misspelt_objective_is_refused_before_the_run(monkeypatch):
    from ecotrain.base.errors import ConfigError

    cfg = load_config("recipes/mnist1d_cnn.yaml", [])
    monkeypatch.setenv(threads.OBJECTIVE_ENV, "enrgy")
    with pytest.raises(ConfigError, match="ECOTRAIN_THREADS_FOR=enrgy: one of energy, time, money"):
        threadpick.wanted(cfg, torch.device("cpu"))
    monkeypatch.setenv(threads.PROBE_ENV, "0")  # no probe: the objective is not read
    assert threadpick.wanted(cfg, torch.device("cpu")) is None


def test_a_busy_machine_neither_probes_nor_caches(tmp_path, monkeypatch):
    """The probe's ceiling is the machine's share, not the load's; while other processes hold cores and
    nothing is decided, no probe runs (it would measure the neighbours) and nothing is written."""
    monkeypatch.setenv("ECOTRAIN_CACHE", str(tmp_path))
    cfg = load_config("recipes/mnist1d_cnn.yaml", []).to_dict()
    assert threads.pick(cfg, 2, "energy", probe=False) is None
    assert not threads.cache_file().exists()
    busy = threads.ThreadChoice(1, "auto", 4, 4, None, local_ranks=2, workers=0, busy=3)
    assert threadpick.share(busy) == 2  # 4 cores over 2 local ranks, whatever the load left now
