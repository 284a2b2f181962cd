"""`ecotrain plan --measure`: real training steps of the config as written, in a fresh process
(memory.measure.measure_config); on CPU the default is the estimate alone."""

import re

TINY = ["data.kwargs.seq_len=128", "data.kwargs.max_bytes=60000", "model.kwargs.d_model=32", "model.kwargs.n_layers=2",
        "model.kwargs.n_heads=2", "data.batch_size=4", "ledger.energy=off", "device=cpu"]


def mb(line: str) -> float:
    return float(re.search(r"(-?[0-9.]+) MB", line).group(1))


def test_plan_measure_on_cpu_prints_the_peak_rss_and_its_gap(cli):
    r = cli("plan", "recipes/charlm_long.yaml", *TINY, "--measure")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    params = mb(next(ln for ln in lines if ln.strip().startswith("parameters")))
    estimate = mb(next(ln for ln in lines if ln.strip().startswith("total")))
    peak = next(ln for ln in lines if ln.strip().startswith("measured peak"))
    assert "peak RSS" in peak and "interpreter" in peak
    assert 100 < mb(peak) < 4096 and mb(peak) > params  # a whole torch process, not a tensor count
    gap = next(ln for ln in lines if ln.strip().startswith("gap"))
    assert abs(mb(gap) - (mb(peak) - estimate)) < 0.2


def test_plan_on_cpu_measures_nothing_by_default_or_with_no_measure(cli):
    for flag in ([], ["--no-measure"]):
        r = cli("plan", "recipes/charlm_long.yaml", *TINY, *flag)
        assert r.returncode == 0, r.stderr
        assert "total" in r.stdout and "measured peak" not in r.stdout


def test_plan_measure_failure_is_one_line_and_exit_1(cli):
    r = cli("plan", "recipes/charlm_long.yaml", *TINY, "loop.max_epochs=1", "data.batch_size=256", "--measure")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == ("ecotrain: error: plan: measuring 3 training steps on cpu failed: the "
                                                 "run stopped before step 3 (loop.max_epochs ended it: set "
                                                 "loop.max_epochs=null for the measurement)")
