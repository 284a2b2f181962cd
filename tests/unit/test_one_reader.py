"""Issue 60, one reader for every file: a file a user hands in, or one in a cache or run folder, is read
through `ecotrain.base.safefile` (no blocking open of a FIFO, no read of a device, a size cap, one line
for JSON that cannot be read). This walks the syntax of every module under src/ecotrain and fails on a
direct read anywhere else, unless the site is in ALLOWED with the reason it may read directly.

What counts as a direct read: `x.read_text()` / `x.read_bytes()`, builtin `open(...)` in a read mode
(no mode, or a mode without w/a/x/+), `json.load`, `np.load`, `np.memmap`, safetensors
`load_file` / `safe_open`, `yaml.safe_load(open(...))`, `wave.open` in a read mode, and pyarrow's
`ParquetFile` / `read_table`. A write (`open(p, "w")`, "wb", "a", "x") is fine.
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest

from tests.helpers.deadline import deadline

SRC = Path(__file__).resolve().parents[2] / "src" / "ecotrain"
SAFEFILE = "base/safefile.py"

# module (relative to src/ecotrain) -> (the call as written, why it may read directly)
_PROC = "/proc or cgroup: kernel files that are never FIFOs, devices or big, and not handed in by a user"
_LOCK = "a lock file or folder: opened to hold a lock (O_CREAT, no read of its content)"
ALLOWED: dict[str, list[tuple[str, str]]] = {
    "core/threads.py": [('v2.read_text', _PROC), ('v1.read_text', _PROC),
                        ('(folder / "cpu.cfs_period_us").read_text', _PROC),
                        ('Path("/proc/self/cgroup").read_text', _PROC),
                        ('Path("/proc/loadavg").read_text', _PROC)],
    "base/environment.py": [('Path("/proc/cpuinfo").read_text', _PROC)],
    "accounting/meter_plan.py": [('open("/proc/cpuinfo", ...)', _PROC)],
    "accounting/contention.py": [("Path(path).read_text", _PROC + " (/proc/pressure, cgroup cpu.pressure)")],
    "memory/measure.py": [('open("/proc/self/status")', _PROC), ('open("/proc/self/statm")', _PROC)],
    # os.open is not a read the walk matches: these two are listed for the record
    "base/filelock.py": [("os.open(path, os.O_RDWR | os.O_CREAT", _LOCK), ("os.open(path, os.O_RDONLY | os.O_DIRECTORY", _LOCK)],
    "base/fsnames.py": [("os.open(name, os.O_RDONLY)", _LOCK + " (a folder opened to fsync it)")],
    # export/ (another helper's floor, routed separately) has no direct read left: nothing is allowed there
}


def _name(node: ast.AST) -> str:
    """`a.b.c` for an attribute chain, `f` for a name, "" otherwise."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _name(node.value)
        return f"{base}.{node.attr}" if base else f"?.{node.attr}"
    return ""


def _mode(call: ast.Call, pos: int) -> str | None:
    """The mode argument of an open-like call: the string, None when absent, "?" when not a literal."""
    arg = call.args[pos] if len(call.args) > pos else next((k.value for k in call.keywords if k.arg == "mode"), None)
    if arg is None:
        return None
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    return "?"


def _reads(mode: str | None) -> bool:
    return mode is None or mode == "?" or not any(c in mode for c in "wax+")


_CHECKED = ("regular", "open_regular", "read_bytes")  # safefile's: what they hand on has been checked


def _checked(node: ast.AST, held: set[str]) -> bool:
    """Whether `node` (a read call's argument) is what safefile handed over: a call to safefile's
    `regular` / `open_regular` / `read_bytes` inside it, or a name bound by `with open_regular(...) as f`."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and _name(sub.func).rsplit(".", 1)[-1] in _CHECKED:
            return True
        if isinstance(sub, ast.Name) and sub.id in held:
            return True
    return False


def direct_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for each direct read call in a module's syntax tree."""
    held: set[str] = set()  # names bound to what safefile checked (with open_regular(...) as f, p = regular(...))
    while True:  # until no name is added: `p = regular(...)` then `with native_name(p) as name`
        before = len(held)
        for node in ast.walk(tree):
            if isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name) \
                    and _checked(node.context_expr, held):
                held.add(node.optional_vars.id)
            if isinstance(node, ast.Assign) and _checked(node.value, held):
                held.update(t.id for t in node.targets if isinstance(t, ast.Name))
        if len(held) == before:
            break
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _name(node.func)
        last = name.rsplit(".", 1)[-1]
        first = node.args[:1]
        if name.startswith("safefile.") or any(_checked(a, held) for a in first) or (
                first and isinstance(first[0], ast.Call) and _name(first[0].func) in ("io.BytesIO", "BytesIO")):
            continue  # safefile's own functions, or a reader handed what safefile checked
        what = None
        if isinstance(node.func, ast.Attribute) and last in ("read_text", "read_bytes"):
            what = f"{ast.unparse(node.func)}"
        elif name in ("open", "io.open", "builtins.open") and _reads(_mode(node, 1)):
            what = "open(...) for reading"
        elif name in ("json.load", "np.load", "numpy.load", "np.memmap", "numpy.memmap", "np.fromfile"):
            what = name
        elif last in ("load_file", "safe_open") and name in (last, f"safetensors.{last}", f"safetensors.torch.{last}",
                                                             f"torch.{last}"):
            what = f"safetensors {last}"
        elif name == "wave.open" and _reads(_mode(node, 1)):
            what = "wave.open for reading"
        elif last in ("ParquetFile", "read_table", "read_metadata", "read_schema") and name.startswith(("pq.", "pyarrow")):
            what = f"pyarrow {last}"
        if what:
            found.append((node.lineno, what))
    return found


def _allowed(rel: str, source_line: str) -> bool:
    return any(call.split("(")[0] in source_line or call in source_line for call, _why in ALLOWED.get(rel, []))


def _modules():
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel != SAFEFILE:
            yield rel, path


def offenders() -> list[str]:
    out = []
    for rel, path in _modules():
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for lineno, what in direct_reads(ast.parse(text, str(path))):
            line = lines[lineno - 1].strip()
            if not _allowed(rel, line):
                out.append(f"src/ecotrain/{rel}:{lineno}: {what} ({line})")
    return out


def test_every_read_goes_through_safefile():
    bad = offenders()
    assert not bad, ("direct file reads outside ecotrain.base.safefile (read through safefile.read_bytes / "
                     "read_text / read_json / open_regular / regular, or add the site to ALLOWED with a why):\n"
                     + "\n".join(bad))


def test_every_allowed_site_has_a_reason():
    for rel, sites in ALLOWED.items():
        assert (SRC / rel).is_file(), f"ALLOWED names {rel}, which is not a module any more"
        for call, why in sites:
            assert call and why, (rel, call)


@pytest.mark.parametrize("snippet, caught", [
    ("p.read_text()", True),
    ("Path(x).read_bytes()", True),
    ("open(p)", True),
    ("open(p, 'rb')", True),
    ("open(p, mode='r', encoding='utf-8')", True),
    ("open(p, m)", True),  # a mode that is not a literal may read
    ("open(p, 'w')", False),
    ("open(p, 'wb')", False),
    ("open(p, 'a', encoding='utf-8')", False),
    ("open(p, 'x')", False),
    ("open(p, 'r+b')", False),  # '+': opened to update (rundir's repair of a torn tail), not a read-back
    ("json.load(f)", True),
    ("json.loads(s)", False),
    ("np.load(p, allow_pickle=False)", True),
    ("np.load(io.BytesIO(b))", False),  # bytes in memory: the read that got them is what is checked
    ("np.load(io.BytesIO(safefile.read_bytes(p, 'x', 10)))", False),
    ("with safefile.open_regular(p, 'x') as f:\n    np.load(f)", False),
    ("with safefile.open_regular(p, 'x') as f:\n    pass\nnp.load(g)", True),
    ("load_file(str(safefile.regular(p, 'x')))", False),
    ("safefile.read_text(p, 'x', 10)", False),
    ("np.memmap(p, mode='r')", True),
    ("load_file(str(p))", True),
    ("safe_open(name, framework='pt')", True),
    ("yaml.safe_load(open(p))", True),
    ("yaml.safe_load(text)", False),
    ("wave.open(str(p), 'rb')", True),
    ("wave.open(str(p), 'wb')", False),
    ("pq.ParquetFile(p)", True),
    ("os.open(p, os.O_RDONLY)", False),
])
def test_the_walk_sees_each_kind_of_read(snippet, caught):
    assert bool(direct_reads(ast.parse(snippet))) is caught, snippet


def test_a_new_direct_reader_fails_the_walk(tmp_path, monkeypatch):
    """The walk over a copy of a module with one direct read added names it."""
    mod = SRC / "seeds" / "sweep.py"
    text = mod.read_text(encoding="utf-8") + "\n\ndef _sneaky(p):\n    return p.read_text()\n"
    found = direct_reads(ast.parse(text))
    lines = text.splitlines()
    assert any("read_text" in lines[n - 1] and not _allowed("seeds/sweep.py", lines[n - 1].strip())
               for n, _ in found)


# hostile files in the place of a converted reader's file: a FIFO (no writer: a plain open would wait
# forever) is one line at once; JSON nested 100,000 deep is one line, not a RecursionError trace

DEEP = "[" * 100_000 + "]" * 100_000


def _fifo(path: Path) -> Path:
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    return path


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text and "Traceback" not in text, text
    return text


def test_run_folder_config_as_a_fifo_is_a_note_not_a_wait(tmp_path):
    from ecotrain.report.rundata import read_run

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    _fifo(tmp_path / "config.yaml")
    with deadline(10, "report's read of a FIFO config.yaml"):
        run = read_run(tmp_path)
    assert any("config.yaml: not readable" in n and "FIFO" in n for n in run.notes), run.notes


def test_checkpoint_meta_json_as_a_fifo_or_nested_deep(tmp_path):
    import torch

    from ecotrain.base.errors import CheckpointError
    from ecotrain.checkpoint import read_checkpoint, verify_checkpoint, write_checkpoint
    from ecotrain.checkpoint.format import MANIFEST, _digest, safetensors_keys

    folder = write_checkpoint(tmp_path / "c", {"model/w": torch.ones(2)},
                              {"model": {"w": {"__tensor__": "model/w"}}, "position": {"step": 1}})
    meta = folder / "meta.json"
    meta.write_text(DEEP)  # checksums made to match: the JSON itself is what is read
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"]["meta.json"] = {"bytes": meta.stat().st_size, "xxh3_128": _digest(meta)}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError) as err:
        read_checkpoint(folder)
    assert _one_line(err.value) == f"{folder}: meta.json is not valid JSON"

    _fifo(meta)
    with deadline(10, "verify of a FIFO meta.json"), pytest.raises(CheckpointError) as err:
        verify_checkpoint(folder)
    assert _one_line(err.value).startswith(f"{folder}: meta.json")
    with deadline(10, "a FIFO .safetensors"), pytest.raises(CheckpointError) as err:
        safetensors_keys(_fifo(tmp_path / "t.safetensors"), "t")
    assert "FIFO" in _one_line(err.value)

    (folder / MANIFEST).write_text(DEEP)
    with pytest.raises(CheckpointError) as err:
        verify_checkpoint(folder)
    assert _one_line(err.value) == f"{folder}: {MANIFEST} is not valid JSON"


def test_an_npz_as_a_fifo_bn_domain_and_curriculum(tmp_path):
    from ecotrain.base.errors import DataError
    from ecotrain.continual.incoming import load_npz
    from ecotrain.methods.bn_domain import domain_column
    from ecotrain.methods.curriculum import Curriculum

    pipe = _fifo(tmp_path / "d.npz")
    with deadline(10, "bn_domain's read of a FIFO .npz"), pytest.raises(DataError) as err:
        domain_column(pipe, "train", 4)
    assert "FIFO" in _one_line(err.value) and str(pipe) in str(err.value)
    with deadline(10, "curriculum's read of a FIFO .npy"), pytest.raises(DataError) as err:
        Curriculum._from_file(_fifo(tmp_path / "s.npy"), 4)
    assert "FIFO" in _one_line(err.value)
    with deadline(10, "continual's read of a FIFO .npz"), pytest.raises(DataError) as err:
        load_npz(pipe, "give the new data")
    _one_line(err.value)


def test_group_file_label_map_and_run_summary_fifo_or_nested_deep(tmp_path):
    from ecotrain.base.errors import ConfigError
    from ecotrain.continual.labels import load_label_map
    from ecotrain.base.groupfile import read_group

    deep = tmp_path / "deep.json"
    deep.write_text(DEEP)
    with pytest.raises(ConfigError) as err:
        read_group(deep)
    assert "not a readable group file" in _one_line(err.value)
    with pytest.raises(ConfigError) as err:
        load_label_map(deep)
    assert _one_line(err.value) == f"--label-map {deep}: not valid JSON"
    with deadline(10, "the read of a FIFO group file"), pytest.raises(ConfigError) as err:
        read_group(_fifo(tmp_path / "g.json"))
    assert "FIFO" in _one_line(err.value)

    from ecotrain.methods.batchnorm import read_report

    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(DEEP)
    with pytest.raises(ConfigError) as err:
        read_report(run)
    assert _one_line(err.value) == f"{run / 'summary.json'}: not readable JSON (RecursionError)"


def test_regular_hands_back_a_regular_file_and_refuses_the_rest_in_open_regulars_words(tmp_path):
    from ecotrain.base import safefile
    from ecotrain.base.errors import ConfigError, DataError

    f = tmp_path / "w.safetensors"
    f.write_bytes(b"x")
    assert safefile.regular(f, "weights file") == f
    pipe = _fifo(tmp_path / "p")
    for bad, kind in ((pipe, "a FIFO (named pipe), not a regular file"), (tmp_path, "a folder, not a file"),
                      (Path("/dev/null"), "a device, not a regular file")):
        with deadline(10, "regular() of a FIFO"), pytest.raises(DataError) as err:
            safefile.regular(bad, "weights file", error=DataError, fix="give the file")
        assert _one_line(err.value) == f"{bad}: the weights file is {kind}; give the file"
        with pytest.raises(ConfigError) as opened:
            safefile.open_regular(bad, "weights file", fix="give the file")
        assert str(opened.value) == str(err.value)
    with pytest.raises(FileNotFoundError):  # missing: the caller's own words
        safefile.regular(tmp_path / "gone", "weights file")
