"""A cache of generated datasets, so that a run does not regenerate (or even import) its generator.

Where: `$ECOTRAIN_CACHE` if set, else `$XDG_CACHE_HOME/ecotrain`, else `~/.cache/ecotrain`; entries
live in its `datasets/` folder and can be deleted at any time (they are made again when needed). A
user with no home folder (HOME unset and no passwd entry: an arbitrary container uid) and neither
variable set has no cache: the data is generated each run, said once per process.

Content-addressed: an entry's name is the SHA-256 of what determines its content: the generator's
name, its arguments, the versions of the code that generates it (the generator package and the
libraries whose numerics it uses) and this cache's format version `FORMAT`. A change in any of them is
a new entry; nothing is ever looked up by a name that could hold stale data.

Safe format: one safetensors file per entry (raw little-endian arrays and a JSON header; no pickle,
nothing that can execute code when read). The header's metadata holds the entry's key and an
xxh3-128 checksum of every array (name, dtype, shape, bytes). An entry whose key or checksum does
not match, or that cannot be parsed, is reported as a warning and regenerated, never used.

Written atomically (a temporary file in the same folder, fsync, rename), so a crash or a concurrent
writer leaves either no entry or a whole one. A cache that cannot be written (read-only home) costs
a warning and the generation time, never the run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import numpy as np

from ecotrain.base import safefile
from ecotrain.base.cachedir import ENV, cache_dir
from ecotrain.base.errors import EcotrainError
from ecotrain.base.progress_work import work

FORMAT = 1  # bump when the layout of an entry changes
MAX_ENTRY_BYTES = 4 << 30  # the built-in generators' data is MiBs; a bigger entry is not one of ours
_SEP = "/"  # nested dicts are stored flat: {"templates": {"x": a}} -> "templates/x"

log = logging.getLogger(__name__)


_said_no_home: list[bool] = []  # the no-cache warning is said once per process, not once per dataset


def _no_cache_said() -> None:
    if not _said_no_home:
        _said_no_home.append(True)
        log.warning("dataset cache: no home folder (HOME unset, no passwd entry for uid %s), so nothing is "
                    "cached and the data is generated each run; set %s to a writable folder to keep it",
                    os.getuid() if hasattr(os, "getuid") else "?", ENV)


def package_version(name: str) -> str:
    """An installed distribution's version, read from its metadata (the package is not imported)."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not-installed"


def entry_key(generator: str, versions: Mapping[str, str], args: Mapping[str, Any]) -> tuple[str, str]:
    """(key, spec): the SHA-256 hex key of an entry and the canonical JSON it hashes."""
    spec = json.dumps({"generator": generator, "versions": dict(versions), "args": dict(args), "format": FORMAT},
                      sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(spec.encode()).hexdigest(), spec


def entry_path(generator: str, key: str, root: Optional[Path] = None) -> Path:
    """Where the entry lives under `root` (default: cache_dir(), which must not be None)."""
    safe = re.sub(r"[^A-Za-z0-9_.+-]", "_", generator)[:64]
    return (root or cache_dir()) / "datasets" / f"{safe}-{key[:32]}.safetensors"


def load_or_make(generator: str, versions: Mapping[str, str], args: Mapping[str, Any],
                 make: Callable[[], Mapping[str, Any]]) -> dict:
    """The dataset `make()` returns (a dict of NumPy arrays, possibly nested), from the cache when an
    intact entry for (generator, versions, args) exists; else made, stored, and returned.

    `args` must be JSON values (it is part of the key). The arrays come back bit for bit as `make()`
    returned them: same dtypes, shapes and bytes (C-contiguous, writable)."""
    try:
        key, spec = entry_key(generator, versions, args)
    except (TypeError, ValueError):  # arguments that have no canonical JSON form: no caching
        return dict(make())
    root = cache_dir()
    if root is None:
        _no_cache_said()
        return dict(make())
    path = entry_path(generator, key, root)
    flat, why = _read(path, key)
    if flat is not None:
        return _unflatten(flat)
    if why is not None:
        log.warning("dataset cache: %s: %s; regenerating it", path, why)

    with work(f"generating the {generator} dataset (cached after this run)"):  # a spinner on a terminal
        data = dict(make())
    flat = _flatten(data, generator)
    try:
        _write(path, flat, key, spec)
    except OSError as exc:
        log.warning("dataset cache: cannot write %s (%s); the data is regenerated each run until %s "
                    "points to a writable folder", path, exc, ENV)
    return data


def checksum(flat: Mapping[str, np.ndarray]) -> str:
    """xxh3-128 over every array's name, dtype, shape and bytes, in name order."""
    import xxhash

    h = xxhash.xxh3_128()
    for name in sorted(flat):
        a = _little(flat[name])
        h.update(f"{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _little(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))


def _flatten(data: Mapping[str, Any], generator: str, prefix: str = "") -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name, value in data.items():
        if not isinstance(name, str) or _SEP in name or not name:
            raise TypeError(f"{generator}: key {name!r}: the dataset cache needs non-empty string keys without '/'")
        if isinstance(value, Mapping):
            out.update(_flatten(value, generator, f"{prefix}{name}{_SEP}"))
        elif isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
            out[prefix + name] = _little(value)
        else:
            raise TypeError(f"{generator}: {prefix}{name} is {type(value).__name__} "
                            f"{getattr(value, 'dtype', '')}; the dataset cache stores numeric NumPy arrays only")
    return out


def _unflatten(flat: Mapping[str, np.ndarray]) -> dict:
    out: dict = {}
    for name, a in flat.items():
        *parents, last = name.split(_SEP)
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = a
    return out


def _read(path: Path, key: str) -> tuple[Optional[dict], Optional[str]]:
    """(arrays, None) for an intact entry; (None, None) when there is none; (None, why) when it is bad."""
    try:
        blob = safefile.read_bytes(path, "dataset cache entry", MAX_ENTRY_BYTES, fix="")
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"unreadable ({exc})"
    except EcotrainError as exc:  # a FIFO, a device, a folder, a file too big: never read, never waited on
        return None, str(exc).removeprefix(f"{path}: ")
    try:
        from safetensors.numpy import load

        n = int.from_bytes(blob[:8], "little")
        meta = json.loads(blob[8:8 + n]).get("__metadata__") or {}
        flat = {k: np.array(v) for k, v in load(blob).items()}  # own, writable copies
    except Exception as exc:  # truncated, garbled header, bad offsets: whatever the parser says
        return None, f"not a readable safetensors file ({type(exc).__name__}: {str(exc)[:200]})"
    if meta.get("key") != key:
        return None, "its header names another entry"
    if meta.get("checksum") != checksum(flat):
        return None, "checksum mismatch (a corrupt or partly written file)"
    return flat, None


def _write(path: Path, flat: Mapping[str, np.ndarray], key: str, spec: str) -> None:
    from safetensors.numpy import save

    blob = save(dict(flat), metadata={"key": key, "checksum": checksum(flat), "spec": spec, "format": str(FORMAT)})
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            if hasattr(os, "fchmod"):  # mkstemp's 0600 would hide a shared ECOTRAIN_CACHE from other users
                os.fchmod(f.fileno(), 0o644)
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
