"""threads.pick: `threads: auto` chosen by a probe of the run's own config with each candidate count,
in its own process, by what the objective pays per step; the decision is cached per recipe and
machine, so the next run of the recipe (any seed) trains with the same count."""

import json

import pytest
import torch

from ecotrain.core import threads
from ecotrain.accounting import threadpick
from ecotrain.accounting.threadpick import probe_config
from ecotrain.config import load_config


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


@pytest.mark.subprocess
def test_a_probe_decides_once_and_the_decision_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("ECOTRAIN_CACHE", str(tmp_path))
    cfg = probe_config(load_config("recipes/mnist1d_cnn.yaml", ["data.num_samples=600", "ledger.energy=off"]))
    first = threads.pick(cfg, 2, "energy", steps=5)
    assert first["threads"] in (1, 2) and not first["cached"]
    assert [p["threads"] for p in first["probes"]] == [1, 2] and all(p["cpu_per_step"] > 0 for p in first["probes"])
    assert first["line"].startswith(f"threads: {first['threads']} of 2 usable cores, chosen for energy")
    # energy off in the probe: CPU-seconds per step decide (the CPU-time based energy)
    scores = {p["threads"]: p["cpu_per_step"] for p in first["probes"]}
    assert scores[first["threads"]] <= min(scores.values()) * (1 + threads.TIE)
    again = threads.pick({**cfg, "seed": 7}, 2, "energy", steps=5)  # another seed: same recipe, same machine
    assert again["cached"] and again["threads"] == first["threads"]
    assert first["key"] in json.loads((tmp_path / "threads.json").read_text())


GARBAGE = [  # threads.json is a file anyone can edit: none of these is trusted, none reaches the ledger
    "not json {", "[1, 2]", "[" * 100000, '{"K": [1]}', '{"K": {"threads": 2}}', '{"K": {"threads": -3, "line": "x"}}',
    '{"K": {"threads": 1000000, "line": "x"}}', '{"K": {"threads": true, "line": "x"}}',
    '{"K": {"threads": 1, "line": 5, "when": "w", "objective": "energy", "probes": [], "probe_cost": {}}}',
    '{"K": {"threads": 1, "line": "x", "when": "w", "objective": "energy", "probes": "zz", "probe_cost": {}}}',
    '{"K": {"threads": 1, "line": "x", "when": "w", "objective": "energy", "probes": [], "probe_cost": {"kwh": NaN}}}',
    '{"K": {"threads": 1, "line": "x", "when": "w", "objective": "time", "probes": [], "probe_cost": {}}}',
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
        return {"threads": n, "steps": steps, "wall_per_step": 0.01, "cpu_per_step": 0.01 * n, "kwh_per_step": None}

    monkeypatch.setattr(threads, "probe_once", probe)
    got = threads.pick(cfg, 2, "energy", steps=3)
    assert probed == [1, 2] and got["threads"] == 1 and not got["cached"]
    again = threads.pick(cfg, 2, "energy", steps=3)  # written over: the next run reads it back
    assert again["cached"] and again["threads"] == 1 and probed == [1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["threads.json"]


def test_an_unwritable_cache_leaves_no_half_written_file(tmp_path, monkeypatch):
    (tmp_path / "threads.json").mkdir()  # os.replace onto a folder fails after the temporary file is written
    monkeypatch.setenv("ECOTRAIN_CACHE", str(tmp_path))
    monkeypatch.setattr(threads, "probe_once", lambda cfg, n, steps, folder: {
        "threads": n, "steps": steps, "wall_per_step": 0.01, "cpu_per_step": 0.01, "kwh_per_step": None})
    assert threads.pick({"model": {}}, 2, "energy", steps=3)["threads"] == 1
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
