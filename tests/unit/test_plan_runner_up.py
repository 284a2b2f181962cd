"""`ecotrain plan --budget` names the runner-up and why it lost (memory/planner.py)."""

from ecotrain.memory.planner import Candidate, Measured, Search, choose, format_search, runner_up

MiB = 2**20


def _search(rows, budget=1000 * MiB):
    ms = [Measured(c, peak * MiB, cost, cpu_seconds=cost) for c, peak, cost in rows]
    return Search(budget, 0.05, ms, choose(ms, budget * 0.95), 1.0)


def test_runner_up_slower_over_and_tie():
    off, ck, two = Candidate("off", 1, "fp32"), Candidate("all", 1, "fp32", 2), Candidate("off", 2, "fp32")
    s = _search([(off, 990, 1.0), (ck, 500, 1.2), (two, 600, 1.01)])  # off is over 950 MiB usable
    assert s.chosen.candidate == two and runner_up(s).candidate == ck
    assert format_search(s, 8).splitlines()[-1].endswith("fits (peak 500 MiB) but its step costs 1.19x the pick's")
    s = _search([(off, 990, 1.0), (two, 600, 1.01)])
    assert "is over the usable" in format_search(s, 8).splitlines()[-1]
    s = _search([(off, 900, 1.0), (two, 600, 1.01)])  # a tie: the fuller plan wins
    assert s.chosen.candidate == off and "the tie goes to the fuller plan" in format_search(s, 8).splitlines()[-1]
