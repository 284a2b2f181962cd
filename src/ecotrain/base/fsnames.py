"""File names that are not UTF-8: a folder `run-\\xff` made under another locale or copied from another
system. Python keeps such bytes as lone surrogates (`'run-\\udcff'`, PEP 383); writing them into a
UTF-8 file raises, and native readers that want a UTF-8 name (safetensors) refuse them.

`shown` is for text about a path (a model card, error.log, a message), `tolerant_streams` makes the
program's stdout and stderr write such text the same way, and `native_name` is for handing a path to a
native reader. No torch here: the CLI's error boundary uses `shown`.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import sys
from pathlib import Path
from typing import Iterator


def shown(text: str) -> str:
    """`text` with an undecodable name's bytes written `\\xNN`: valid UTF-8 for any file or terminal."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a lone surrogate that is no escaped byte (from a JSON `\\ud800`)
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _as_shown(exc: UnicodeError):
    """The codec error handler behind `tolerant_streams`: what `shown` writes for the failing part."""
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    part = shown(exc.object[exc.start:exc.end])
    try:  # an ASCII stream (LC_ALL=C, PYTHONUTF8=0) cannot take shown's UTF-8 either: \xNN / \uNNNN then
        part.encode(exc.encoding)
    except (UnicodeEncodeError, LookupError):
        part = part.encode("ascii", "backslashreplace").decode("ascii")
    return part, exc.end


codecs.register_error("ecotrain-shown", _as_shown)


def tolerant_streams() -> None:
    """stdout and stderr write an undecodable name as `\\xNN` instead of raising (stdout is strict
    under a UTF-8 locale, so `print(run_dir)` would end the command with a traceback)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="ecotrain-shown")
        except (AttributeError, ValueError, OSError):  # not a TextIOWrapper (a capture), or closed
            pass


@contextlib.contextmanager
def native_name(path: str | Path) -> Iterator[str]:
    """A name of `path` a native library can open: `path` itself when it is valid UTF-8, else
    /proc/self/fd/N (/dev/fd/N where there is no /proc) of a descriptor held open meanwhile, which
    names the same file in ASCII. The reader still maps the file; nothing is copied."""
    name = os.fspath(path)
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        pass
    else:
        yield name
        return
    fd = os.open(name, os.O_RDONLY)  # FileNotFoundError and friends: the caller's OSError handling
    try:
        yield f"/proc/self/fd/{fd}" if os.path.isdir("/proc/self/fd") else f"/dev/fd/{fd}"
    finally:
        os.close(fd)
