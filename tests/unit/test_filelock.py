"""One way to take a lock file: never through a link, never a folder or a device, never truncating
before the lock is held (ecotrain/base/filelock.py; the run folder's and the registry's locks)."""

import os

import pytest

from ecotrain.continual.lock import registry_lock
from ecotrain.base.errors import ConfigError
from ecotrain.base.filelock import holder, open_lock, try_lock


def test_lock_writes_the_pid_and_a_second_holder_is_refused(tmp_path):
    fd = open_lock(tmp_path / "x.lock", "test")
    assert try_lock(fd) and (tmp_path / "x.lock").read_text() == str(os.getpid())
    other = open_lock(tmp_path / "x.lock", "test")  # another open file: flock is per open file
    assert not try_lock(other) and holder(other) == str(os.getpid())
    assert (tmp_path / "x.lock").read_text() == str(os.getpid())  # the waiter truncated nothing
    os.close(fd)
    assert try_lock(other)
    os.close(other)


def test_a_link_is_never_followed_and_its_target_never_written(tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("user data\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".ecotrain.lock").symlink_to(target)
    with pytest.raises(ConfigError, match="lock is a symbolic link .*precious.txt.*remove the link"):
        open_lock(tmp_path / "run" / ".ecotrain.lock", "run folder")
    (tmp_path / "reg").mkdir()
    (tmp_path / "reg" / "registry.lock").symlink_to(target)
    with pytest.raises(ConfigError, match="registry lock is a symbolic link"):
        with registry_lock(tmp_path / "reg"):
            pass
    assert target.read_text() == "user data\n"
    (tmp_path / "dangling.lock").symlink_to(tmp_path / "nowhere")  # O_CREAT would have made the target
    with pytest.raises(ConfigError, match="symbolic link"):
        open_lock(tmp_path / "dangling.lock", "test")
    assert not (tmp_path / "nowhere").exists()


def test_a_folder_or_a_fifo_is_refused(tmp_path):
    (tmp_path / "d.lock").mkdir()
    with pytest.raises(ConfigError, match="lock is a folder"):
        open_lock(tmp_path / "d.lock", "test")
    os.mkfifo(tmp_path / "f.lock")
    fd = os.open(tmp_path / "f.lock", os.O_RDONLY | os.O_NONBLOCK)  # a reader, so opening for writing cannot block
    try:
        with pytest.raises(ConfigError, match="not a regular file"):
            open_lock(tmp_path / "f.lock", "test")
    finally:
        os.close(fd)
