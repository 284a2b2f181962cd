"""Reading a file that someone else may have put there: one bounded read that cannot hang.

Opening a FIFO that has no writer blocks forever, and a stop signal cannot end the wait (the SIGTERM
handler only raises a flag); a device reads without end; a file of gigabytes fills memory before a
parser refuses it. So every file ecotrain reads back (run files, caches, tokenizer.json) is read here:
`os.stat` first (a device is never opened), then `os.open` with O_NONBLOCK (a FIFO swapped in
meanwhile opens at once) and `fstat` of what was opened; anything but a regular file, and anything
above the caller's `limit`, is one line in the caller's error class naming the file, what is wrong and
what to do. `read_bytes` reads a whole file, `read_text` (UTF-8) and `read_json` build on it;
`open_regular` hands a reader that takes a part (a header) the checked file.

The OS's own errors (FileNotFoundError above all, EACCES, EIO) pass through as OSError: the caller
says what a missing file means (no cache, not recorded) in its own words.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any, BinaryIO, Union

from ecotrain.base.errors import ConfigError

KiB, MiB = 1 << 10, 1 << 20
FIX = "replace it with the regular file it should be"  # what to do, where the caller says nothing better ("": nothing)

PathLike = Union[str, os.PathLike]


def _line(path, problem: str, fix: str) -> str:
    return f"{path}: {problem}" + (f"; {fix}" if fix else "")


def _shown(n: int) -> str:
    for unit, size in (("MiB", MiB), ("KiB", KiB)):
        if n >= size and n % size == 0:
            return f"{n // size:,} {unit}"
    return f"{n:,} bytes"


def kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    if stat.S_ISDIR(mode):
        return "a folder, not a file"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe), not a regular file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device, not a regular file"
    if stat.S_ISSOCK(mode):
        return "a socket, not a regular file"
    if stat.S_ISLNK(mode):
        return "a symbolic link, which is not followed here"
    return "not a regular file"


def open_regular(path: PathLike, what: str, *, follow_links: bool = True, fix: str = FIX,
                 error: type = ConfigError) -> BinaryIO:
    """`path` opened for binary reading when it is a regular file (`what` it is: "tokenizer file", "run
    summary"); else `error` with one line. For a reader that takes a part (a safetensors header);
    `read_bytes` takes the whole. `follow_links=False` refuses a symbolic link (a cache file another
    user could point elsewhere). OSError passes through (FileNotFoundError: missing)."""
    mode = (os.stat if follow_links else os.lstat)(path).st_mode  # a device is refused before it is opened
    if not stat.S_ISREG(mode):
        raise error(_line(path, f"the {what} is {kind(mode)}", fix))
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | (0 if follow_links else getattr(os, "O_NOFOLLOW", 0))
    try:
        fd = os.open(path, flags)  # O_NONBLOCK: a FIFO swapped in since the stat opens at once, not never
    except OSError:
        if not follow_links and os.path.islink(path):  # O_NOFOLLOW's ELOOP: a link swapped in since the lstat
            raise error(_line(path, f"the {what} is {kind(stat.S_IFLNK)}", fix)) from None
        raise
    try:
        mode = os.fstat(fd).st_mode  # what was opened, whatever the stat saw
        if not stat.S_ISREG(mode):
            raise error(_line(path, f"the {what} is {kind(mode)}", fix))
    except BaseException:
        os.close(fd)
        raise
    return open(fd, "rb")


def read_bytes(path: PathLike, what: str, limit: int, *, follow_links: bool = True, fix: str = FIX,
               error: type = ConfigError) -> bytes:
    """The bytes of the regular file `path` (`open_regular`), at most `limit` of them; a bigger file is
    one line in `error`, refused before it is read."""
    with open_regular(path, what, follow_links=follow_links, fix=fix, error=error) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise error(_line(path, f"the {what} is {size:,} bytes, more than the {_shown(limit)} one may be", fix))
        # the size it has, +1: read(limit + 1) would allocate the whole cap up front (a 64 GiB cap: a
        # MemoryError for a small file); a file that grew since the fstat (or says 0, as /proc does) is read
        # on in MiB chunks, and one past `limit` is still caught
        data = f.read(size + 1)
        while len(data) > size and len(data) <= limit:
            chunk = f.read(min(MiB, limit + 1 - len(data)))
            if not chunk:
                break
            data += chunk
    if len(data) > limit:
        raise error(_line(path, f"the {what} is more than the {_shown(limit)} one may be", fix))
    return data


def read_text(path: PathLike, what: str, limit: int, *, follow_links: bool = True, fix: str = FIX,
              error: type = ConfigError) -> str:
    """`read_bytes` as UTF-8 text; text that is not UTF-8 is one line too."""
    data = read_bytes(path, what, limit, follow_links=follow_links, fix=fix, error=error)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(_line(path, f"the {what} is not UTF-8 text ({exc.reason} at byte {exc.start:,})", fix)) from None


def read_json(path: PathLike, what: str, limit: int, *, follow_links: bool = True, fix: str = FIX,
              error: type = ConfigError) -> Any:
    """The JSON value in `path` (any kind: the caller checks it is the object it wants), read with
    `read_bytes`; text that is not UTF-8 JSON, or JSON nested past Python's recursion limit, is one line."""
    data = read_bytes(path, what, limit, follow_links=follow_links, fix=fix, error=error)
    try:
        return json.loads(data.decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise error(_line(path, f"not readable JSON ({exc})", fix)) from None
    except RecursionError:  # [[[[... 100,000 deep: the parser's recursion, not a bug of ours
        raise error(_line(path, "not readable JSON (nested too deep to read)", fix)) from None



def regular(path: PathLike, what: str, *, follow_links: bool = True, fix: str = FIX,
            error: type = ConfigError) -> PathLike:
    """`path` itself when it is a regular file, for a library that opens a file by name (safetensors,
    pyarrow, np.memmap, wave); else `error` with the same one line as `open_regular`. OSError passes
    through (FileNotFoundError: missing).

    Residual race: the library opens the name after this stat, so a FIFO or device swapped in between
    is not seen here. Only someone who can already write the folder can do that, and it takes a swap
    in that moment; where the library takes a file object instead, hand it `open_regular`."""
    mode = (os.stat if follow_links else os.lstat)(path).st_mode
    if not stat.S_ISREG(mode):
        raise error(_line(path, f"the {what} is {kind(mode)}", fix))
    return path
