"""base/safefile.py: every file ecotrain reads back is read through one boundary that cannot hang (a FIFO,
a device) nor fill memory (a file above the reader's limit); what is wrong is one line naming the file, the
problem and what to do (issue 60)."""

import os
import socket
import stat
import subprocess
import sys

import pytest

from ecotrain.base import safefile
from ecotrain.base.errors import ConfigError, DataError
from ecotrain.base.jsonfile import read_json as read_run_json
from tests.helpers.deadline import deadline

FIX = "give the tokenizer.json itself"


def refused(path, error=ConfigError, **kw) -> str:
    """The one line `read_bytes` refuses `path` with, within the deadline."""
    kw.setdefault("limit", 1024)
    with deadline(20), pytest.raises(error) as err:
        safefile.read_bytes(path, "tokenizer file", fix=FIX, error=error, **kw)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{path}: ") and line.endswith(f"; {FIX}")
    return line


def test_a_regular_file_comes_back_whole(tmp_path):
    f = tmp_path / "t.json"
    f.write_bytes(b'{"a": [1, 2]}')
    assert safefile.read_bytes(f, "x", 13) == b'{"a": [1, 2]}'  # exactly the limit is allowed
    assert safefile.read_text(str(f), "x", 100) == '{"a": [1, 2]}'
    assert safefile.read_json(f, "x", 100) == {"a": [1, 2]}
    (tmp_path / "link.json").symlink_to(f)  # a link to a regular file is followed unless told not to
    assert safefile.read_json(tmp_path / "link.json", "x", 100) == {"a": [1, 2]}


def test_a_fifo_is_one_line_at_once_never_a_wait(tmp_path):
    fifo = tmp_path / "tokenizer.json"
    os.mkfifo(fifo)  # no writer: a plain open() would block forever
    assert refused(fifo, DataError) == f"{fifo}: the tokenizer file is a FIFO (named pipe), not a regular file; {FIX}"
    link = tmp_path / "to-fifo.json"
    link.symlink_to(fifo)  # followed: a link to a FIFO is a FIFO
    assert "is a FIFO (named pipe), not a regular file" in refused(link)
    assert refused(link, follow_links=False) == (f"{link}: the tokenizer file is a symbolic link, which is not "
                                                 f"followed here; {FIX}")
    for reader in (safefile.read_text, safefile.read_json):
        with deadline(20), pytest.raises(ConfigError, match="is a FIFO"):
            reader(fifo, "tokenizer file", 1024)


def test_a_fifo_swapped_in_after_the_stat_is_caught_by_the_fstat(tmp_path, monkeypatch):
    """The stat and the open are two steps: a FIFO put there between them opens at once (O_NONBLOCK) and
    fstat refuses it."""
    regular, fifo = tmp_path / "a.json", tmp_path / "b.json"
    regular.write_text("{}")
    os.mkfifo(fifo)
    real_stat = os.stat
    monkeypatch.setattr(safefile.os, "stat", lambda p, *a, **k: real_stat(regular) if p == fifo else real_stat(p, *a, **k))
    assert "is a FIFO (named pipe), not a regular file" in refused(fifo)


def test_a_folder_a_device_and_a_socket_are_refused(tmp_path):
    assert refused(tmp_path) == f"{tmp_path}: the tokenizer file is a folder, not a file; {FIX}"
    for dev in ("/dev/zero", "/dev/null"):  # zero reads without end, null reads as empty: neither is a file
        if os.path.exists(dev):
            assert refused(dev) == f"{dev}: the tokenizer file is a device, not a regular file; {FIX}"
    sock = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(sock))
        assert "is a socket, not a regular file" in refused(sock)


def test_a_file_above_the_limit_is_refused_before_it_is_read(tmp_path):
    f = tmp_path / "big.json"
    f.write_bytes(b"x" * 1025)
    assert refused(f) == f"{f}: the tokenizer file is 1,025 bytes, more than the 1 KiB one may be; {FIX}"
    assert "more than the 1,000 bytes one may be" in refused(f, limit=1000)


def test_a_missing_file_is_the_callers_to_say(tmp_path):
    with pytest.raises(FileNotFoundError):
        safefile.read_bytes(tmp_path / "absent.json", "x", 10)
    (tmp_path / "dangling").symlink_to(tmp_path / "absent.json")
    with pytest.raises(FileNotFoundError):
        safefile.read_json(tmp_path / "dangling", "x", 10)


def test_text_that_is_not_utf8_and_json_that_is_not_json_are_one_line(tmp_path):
    f = tmp_path / "t.json"
    f.write_bytes(b'{"a"\xff: 1}')
    with pytest.raises(DataError) as err:
        safefile.read_text(f, "tokenizer file", 100, fix=FIX, error=DataError)
    assert str(err.value) == f"{f}: the tokenizer file is not UTF-8 text (invalid start byte at byte 4); {FIX}"
    with pytest.raises(ConfigError, match=r"not readable JSON \('utf-8' codec can't decode byte 0xff"):
        safefile.read_json(f, "tokenizer file", 100)
    f.write_text("{oops")
    with pytest.raises(ConfigError, match=r"t.json: not readable JSON \(Expecting property name.*; replace it"):
        safefile.read_json(f, "tokenizer file", 100)


def test_json_nested_100000_deep_is_one_line_not_a_recursion_error(tmp_path):
    f = tmp_path / "deep.json"
    f.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError) as err:
        safefile.read_json(f, "run summary", 1 << 20, fix="restore it")
    assert str(err.value) == f"{f}: not readable JSON (nested too deep to read); restore it"
    with pytest.raises(ConfigError, match="nested too deep to read"):  # the run files' reader, through it
        read_run_json(f, "run summary")


def test_json_of_another_kind_comes_back_for_the_caller_to_refuse(tmp_path):
    f = tmp_path / "summary.json"
    f.write_text("[1, 2]")
    assert safefile.read_json(f, "run summary", 100) == [1, 2]
    with pytest.raises(ConfigError, match="not a JSON object, so not an ecotrain run summary"):
        read_run_json(f, "run summary")


def test_a_link_is_refused_when_links_are_not_followed(tmp_path):
    f = tmp_path / "plan.json"
    f.write_text("{}")
    (tmp_path / "link.json").symlink_to(f)
    assert stat.S_ISLNK(os.lstat(tmp_path / "link.json").st_mode)
    with pytest.raises(ConfigError, match="is a symbolic link, which is not followed here"):
        safefile.read_json(tmp_path / "link.json", "meter plan", 100, follow_links=False)
    assert safefile.read_json(f, "meter plan", 100, follow_links=False) == {}


@pytest.mark.subprocess
def test_the_boundary_imports_only_the_standard_library():
    code = ("import sys, ecotrain.base.safefile; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'yaml')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr
