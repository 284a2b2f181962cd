"""Without a terminal (a pipe, CI, nohup) `ecotrain fit` prints a plain progress line every
`logging.progress_seconds`; the thread count the CLI chose before torch started is the one trained
with and recorded in environment.json (here under a simulated one-CPU cgroup quota)."""

import json
import os
import re
import subprocess
import sys

from conftest import ROOT

from ecotrain.core.threads import CGROUP_ENV


def test_progress_lines_through_a_pipe_and_threads_from_the_quota(tmp_path):
    quota = tmp_path / "cgroup"
    quota.mkdir()
    (quota / "cpu.max").write_text("100000 100000\n")  # one CPU
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env.update(PYTHONUNBUFFERED="1", **{CGROUP_ENV: str(quota)})
    run = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "ecotrain", "fit", "recipes/mnist1d_cnn.yaml", "data.num_samples=1000",
                        "loop.max_steps=400", "loop.eval_every=200", "logging.progress_seconds=0.2",
                        "ledger.energy=off", "--run-dir", str(run)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)  # stdout, stderr: pipes
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if re.match(r"ecotrain: epoch \d+ step \d+/400 \(\d+%\)", ln)]
    assert lines, r.stderr
    assert re.search(r"\d+\.\d steps/s  \d:\d\d:\d\d left", lines[0]), lines[0]
    assert any(re.search(r"left  loss \d\.\d{4}", ln) for ln in lines), lines  # the latest metrics
    assert "\r" not in r.stderr and "\x1b[" not in r.stderr  # no bar redraws in a log
    hw = json.loads((run / "environment.json").read_text())["hardware"]
    assert hw["torch_threads"] == 1 and hw["threads"]["threads"] == 1 and hw["threads"]["source"] == "auto"
    assert hw["threads"]["quota"] == 1.0 and "cgroup quota 1 CPUs" in hw["threads"]["why"]
