"""Every bench program still runs: each one in its quick mode (`--quick`: tiny sizes, seconds, the same
code path), as a real process, ends with exit 0 and its `RESULT key=value ...` line. A name moved in
src/ fails here, not in a figure that docs/ can no longer reproduce. A new bench/*.py is covered
without a change here (and needs a --quick of its own).

The quick runs take ~10 minutes of CPU all together, so they are the `bench` tier: CI runs them after
`make test` (`make bench-quick`, .ci/run). `make test` keeps the import check below: every bench program
imported in one process, so a moved name at the top of a bench fails there too."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHES = sorted((ROOT / "bench").glob("*.py"))
NEEDS = {"speech_feedback.py": "espeak-ng"}  # programs a bench starts; CI installs them (`make speech`)
PAIR = re.compile(r'[A-Za-z_][\w.]*=("[^"]*"|\S+)')


def result_pairs(line: str) -> list[str]:
    """The key=value pairs of a RESULT line (a value may be quoted, spaces inside); [] when any token is not one."""
    rest, pairs = line[len("RESULT "):].strip(), []
    while rest:
        m = PAIR.match(rest)
        if m is None:
            return []
        pairs.append(m.group(0))
        rest = rest[m.end():].lstrip()
    return pairs


IMPORT_ALL = """
import importlib.util, sys
for path in sys.argv[1:]:
    spec = importlib.util.spec_from_file_location("bench_" + path.rsplit("/", 1)[-1][:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # top level only: main() runs under __name__ == "__main__"
    assert callable(getattr(module, "main", None)), path + ": no main()"
"""


@pytest.mark.integration
def test_every_bench_program_imports():
    r = subprocess.run([sys.executable, "-c", IMPORT_ALL, *map(str, BENCHES)], cwd=ROOT, capture_output=True,
                       text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT / "bench")})
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.bench
@pytest.mark.parametrize("bench", BENCHES, ids=[b.name for b in BENCHES])
def test_bench_runs_in_quick_mode(bench):
    tool = NEEDS.get(bench.name)
    if tool and shutil.which(tool) is None:
        pytest.skip(f"{tool} not installed (make speech)")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    r = subprocess.run([sys.executable, str(bench), "--quick"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, f"{bench.name} --quick: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("RESULT "), f"{bench.name}: the last line is not RESULT:\n{r.stdout[-2000:]}"
    pairs = result_pairs(lines[-1])
    assert pairs, f"{bench.name}: not key=value pairs: {lines[-1]}"
    failed = [p for p in pairs if p.split("=", 1)[1] == "error"]  # a guarded part that raised (gpu_check)
    assert not failed, f"{bench.name}: {failed}\n{r.stderr[-3000:]}"
