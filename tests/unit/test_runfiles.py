"""The run folder's layout has one owner (runfiles.py): no other module spells a run file's name,
except the ones listed here, which another change owns (issue 53); the list only shrinks."""

import re
from pathlib import Path

from ecotrain.base import runfiles
from ecotrain.base.rundir import holds_run
from ecotrain.base.runfiles import RunFiles

SRC = Path(runfiles.__file__).parents[1]  # the ecotrain package (runfiles.py is in base/)
NAMES = [n for n in runfiles.RUN_FILES + (runfiles.ERROR_LOG, runfiles.LOCK) if n != runfiles.TENSORBOARD]  # also a package
LEFT = {"report/page.py"}  # class="checkpoints": an HTML section's class, not the folder's name


def test_only_runfiles_names_the_run_files_but_the_listed_modules():
    quoted = re.compile("|".join(f"[\"']{re.escape(n)}[\"']" for n in NAMES))  # either quote
    naming = {str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if p.name != "runfiles.py" and quoted.search(p.read_text())}
    assert naming - LEFT == set(), "name run files through ecotrain.base.runfiles (RunFiles(run).summary, runfiles.SUMMARY)"


def test_the_layout_names_each_file_once_and_finds_a_run(tmp_path):
    assert len(set(runfiles.RUN_FILES)) == len(runfiles.RUN_FILES)
    run = RunFiles(tmp_path)
    assert run.summary == tmp_path / "summary.json" and run / "x" == tmp_path / "x"
    assert holds_run(tmp_path) == []
    run.summary.write_text("{}")
    assert holds_run(tmp_path) == [runfiles.SUMMARY]
