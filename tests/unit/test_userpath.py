"""userpath.user_path: a path the user names is a regular file (or a folder where one is expected) before
anything opens it; anything else is one line, what and where and what to give, in the caller's error."""

import os
import socket

import pytest

from ecotrain.base.errors import ConfigError, DataError
from ecotrain.base.userpath import user_path

GIVE = "give the .npz file"


def refused(path, error=ConfigError, **kw) -> str:
    with pytest.raises(error) as exc:
        user_path(path, "data.path", GIVE, error=error, **kw)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("data.path: ") and msg.endswith(GIVE), msg
    return msg


def test_a_regular_file_and_a_folder_where_one_is_expected_pass(tmp_path):
    f = tmp_path / "d.npz"
    f.write_bytes(b"")
    assert user_path(str(f), "data.path", GIVE) == f
    assert user_path(tmp_path, "--init-from", "give a folder", folder=True) == tmp_path
    (tmp_path / "link.npz").symlink_to(f)
    assert user_path(tmp_path / "link.npz", "data.path", GIVE) == tmp_path / "link.npz"


def test_a_fifo_a_device_a_socket_and_a_folder_are_refused_without_opening_them(tmp_path):
    fifo = tmp_path / "pipe.npz"
    os.mkfifo(fifo)  # opening it would block: the check must not
    assert refused(fifo, DataError) == f"data.path: {fifo} is a FIFO (named pipe), not a regular file; {GIVE}"
    (tmp_path / "to-pipe.npz").symlink_to(fifo)  # a link is followed: a link to a FIFO is a FIFO
    assert "is a FIFO" in refused(tmp_path / "to-pipe.npz")
    assert refused("/dev/null") == f"data.path: /dev/null is a device, not a regular file; {GIVE}"
    assert refused(fifo, folder=True).endswith("is a FIFO (named pipe), not a regular file or a folder; " + GIVE)
    assert refused(tmp_path) == f"data.path: {tmp_path} is a folder; {GIVE}"
    sock = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(sock))
        assert "is a socket, not a regular file" in refused(sock)


def test_missing_names_the_folder_a_relative_path_is_read_from(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert refused("nope.npz") == f"data.path: nope.npz not found (a relative path is read from the current " \
                                  f"folder, {tmp_path}); {GIVE}"
    assert refused(tmp_path / "nope.npz") == f"data.path: {tmp_path / 'nope.npz'} not found; {GIVE}"


def test_a_nul_byte_or_a_loop_of_links_is_one_line(tmp_path):
    assert "holds a NUL byte" in refused("a\0b.npz")
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(ConfigError, match=r"^data.path: .*a: Too many levels of symbolic links; too many symbolic "
                                          r"links \(a loop\?\)"):
        user_path(tmp_path / "a", "data.path", GIVE)
