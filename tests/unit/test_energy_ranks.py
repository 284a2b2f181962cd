"""combine_ranks: one energy figure for a torchrun job from every rank's own reading."""

import pytest

from ecotrain.accounting.energy import combine_ranks


def reading(host, gpu, cpu, gpu_kwh, ram, pue=1.0, method="estimated"):
    parts = {"cpu": cpu, "gpu": gpu_kwh, "ram": ram}
    return {"kwh": sum(parts.values()) * pue, "components_kwh": parts, "method": method, "how": "cpu estimated",
            "missing_reason": None, "host": host, "gpu_ids": gpu}


def test_process_mode_sums_every_rank_and_each_gpu():
    r = [reading("a", [0], 1.0, 4.0, 0.5), reading("a", [1], 2.0, 6.0, 0.5)]
    out = combine_ranks(r, "process")
    assert out["kwh"] == pytest.approx(14.0) and out["ranks"] == 2 and out["per_rank_kwh"] == [5.5, 8.5]
    assert out["components_kwh"] == pytest.approx({"cpu": 3.0, "gpu": 10.0, "ram": 1.0})
    assert "2 ranks: GPU per device, CPU and RAM per process, summed" in out["how"]


def test_machine_mode_counts_each_host_once_and_keeps_pue():
    r = [reading("a", [0], 3.0, 4.0, 1.0, pue=1.5), reading("a", [1], 2.0, 6.0, 1.0, pue=1.5),
         reading("b", [0], 3.5, 5.0, 1.0, pue=1.5)]
    out = combine_ranks(r, "machine")
    # GPUs: 4 + 6 + 5 (host b's GPU 0 is another device); CPU+RAM: host a's largest (4), host b's (4.5)
    assert out["components_kwh"] == pytest.approx({"cpu": 6.5, "gpu": 15.0, "ram": 2.0})
    assert out["kwh"] == pytest.approx(1.5 * (15.0 + 4.0 + 4.5))
    assert "once per host" in out["how"]


def test_a_gpu_metered_by_two_ranks_counts_once():
    r = [reading("a", [0], 1.0, 4.0, 0.0), reading("a", [0], 1.0, 4.0, 0.0)]
    assert combine_ranks(r, "process")["components_kwh"]["gpu"] == pytest.approx(4.0)


def test_a_rank_without_a_figure_makes_the_total_missing_and_names_it():
    r = [reading("a", [0], 1.0, 0.0, 0.0), {**reading("a", [1], 1.0, 0.0, 0.0), "kwh": None,
                                            "missing_reason": "CodeCarbon reported 0 kWh"}]
    out = combine_ranks(r, "process")
    assert out["kwh"] is None and out["missing_reason"] == "rank 1: CodeCarbon reported 0 kWh"
    assert out["per_rank_kwh"] == [1.0, None]


def test_one_rank_is_its_own_reading_and_all_measured_stays_measured():
    one = reading("a", [0], 1.0, 2.0, 0.5, method="measured")
    assert combine_ranks([one], "process") == one
    two = combine_ranks([one, reading("a", [1], 1.0, 2.0, 0.5, method="measured")], "process")
    assert two["method"] == "measured"
    mixed = combine_ranks([one, reading("a", [1], 1.0, 2.0, 0.5)], "process")
    assert mixed["method"] == "estimated"
