"""Run every case of the hostile corpus (cases.py) through the real CLI, in a subprocess.

Each must give its exact exit code, no traceback, one `ecotrain: error: ...` line holding the case's
key words (for code 0: the words anywhere in the output), leave every file it was given byte-identical
(hashed before and after), and leave nothing where `absent` says nothing may be."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.hostile import cases_commands, cases_export, cases_lmdata, cases_shards
from tests.hostile.cases import CASES, TINY, Case, by_id, fill, is_root

ALL = CASES + cases_commands.CASES + cases_export.CASES + cases_shards.CASES + cases_lmdata.CASES  # cases.py holds the harness and the first families

pytestmark = pytest.mark.hostile


def snapshot(root: Path) -> dict[str, str]:
    """sha256 of every file under root (unreadable ones by their mode), by path relative to root. Lock
    files are left out: a command that takes a folder's lock to decide, then refuses, writes its pid there."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink() and p.name not in (".ecotrain.lock", "registry.lock"):
            rel = p.relative_to(root).as_posix()
            try:
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
            except PermissionError:
                out[rel] = f"unreadable, mode {p.stat().st_mode:o}"
    return out


def _glob_re(pattern: str) -> re.Pattern:
    """`*` within one path part, `**` across parts."""
    parts = re.split(r"(\*\*|\*)", pattern)
    return re.compile("".join(".*" if p == "**" else "[^/]*" if p == "*" else re.escape(p) for p in parts))


def _matches(rel: str, patterns) -> bool:
    return any(_glob_re(p).fullmatch(rel) for p in patterns)


def run_main(*args, cwd: Path, env: dict, timeout=None) -> subprocess.CompletedProcess:
    """The CLI's own `main(argv)` in this process, as `python -m ecotrain` would run it in `cwd` with
    `env` (its folder first on sys.path): what a subprocess gives, less interpreter start-up and the
    torch import, ~3 s a case. An exception escaping main() is printed as the Traceback it would be."""
    from ecotrain import cli

    out, err = io.StringIO(), io.StringIO()
    saved = (os.getcwd(), dict(os.environ), list(sys.path), set(sys.modules))
    os.environ.update(env)
    os.chdir(cwd)
    sys.path[:0] = [str(cwd), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(list(args))
            except SystemExit as exc:  # argparse's usage errors
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                traceback.print_exc()
                code = 1
    finally:
        os.chdir(saved[0])
        os.environ.clear()
        os.environ.update(saved[1])
        sys.path[:] = saved[2]
        for name in set(sys.modules) - saved[3]:  # the user's modules of this case (a fresh import next time)
            file = getattr(sys.modules[name], "__file__", None) or ""
            if file.startswith(str(cwd)) or file.startswith(env.get("PYTHONPATH", "\0") or "\0"):
                del sys.modules[name]
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def test_case_ids_are_unique():
    assert len(by_id(ALL)) == len(ALL)


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.xfail(reason=c.xfail, strict=True)) if c.xfail
                                  else c for c in ALL], ids=[c.id for c in ALL])
def test_hostile(case: Case, tmp_path: Path):
    if case.needs_non_root and is_root():
        pytest.skip("runs as root, which reads any file whatever its permissions")
    (tmp_path / "tiny.yaml").write_text(TINY)
    if case.setup is not None:
        case.setup(tmp_path)
    before = snapshot(tmp_path)
    cwd = tmp_path / case.cwd
    cwd.mkdir(parents=True, exist_ok=True)

    run = run_cli if case.isolated else run_main
    r = run(*(fill(a, tmp_path) for a in case.args), cwd=cwd, timeout=240,
            env={k: fill(v, tmp_path) for k, v in case.env.items()})

    shown = f"exit {r.returncode}\n--- stderr ---\n{r.stderr}\n--- stdout ---\n{r.stdout[-2000:]}"
    assert "Traceback" not in r.stderr, shown
    assert r.returncode == case.code, shown
    if case.code != 0:
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("ecotrain: error: ")]
        assert len(errors) == 1 and lines[-1] == errors[0], shown  # one error line, the last one
        for w in case.words:
            assert w in errors[0], f"{w!r} not in the error line\n{shown}"
    else:
        for w in case.words:
            assert w in r.stderr + r.stdout, f"{w!r} not in the output\n{shown}"

    after = snapshot(tmp_path)
    for rel, digest in before.items():
        if not _matches(rel, case.may_change):
            assert after.get(rel) == digest, f"{rel} was {'deleted' if rel not in after else 'changed'}\n{shown}"
    for pattern in case.absent:
        found = [p.relative_to(tmp_path).as_posix() for p in tmp_path.glob(pattern)]
        assert not found, f"left behind: {found}\n{shown}"
