"""The checkpoint format on disk: tensors in safetensors, everything else in JSON, no pickle.

A checkpoint is a folder:
    tensors.safetensors   every tensor of the state, under a dotted path ("model/fc.weight")
    meta.json             the rest of the state, tensors replaced by {"__tensor__": path}
    MANIFEST.json         xxh3-128 checksum and size of every file; written last: its presence means complete

Writes go to a hidden temporary folder, each file fsynced, the manifest last, then one rename:
a process killed mid-save leaves only the temporary folder, which readers ignore.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import xxhash
from safetensors import SafetensorError, safe_open

from ecotrain.base import safefile
from ecotrain.base import safeload
from ecotrain.base.errors import CheckpointError, os_advice
from ecotrain.base.fsnames import native_name
from ecotrain.base.rundir import fsync_dir
from ecotrain.base.tensorfile import aliases_of, read_tensors, write_tensors
from ecotrain.base.userpath import user_path

FORMAT = "ecotrain-checkpoint/1"
FILES = ("tensors.safetensors", "meta.json")
MANIFEST = "MANIFEST.json"
PICKLE_SUFFIXES = {".pt", ".pth", ".pkl", ".pickle", ".bin", ".ckpt"}


def flatten(obj: Any, tensors: dict[str, torch.Tensor], path: str = "", keep: bool = False) -> Any:
    """Move every tensor of a nested structure into `tensors`; return a JSON-able skeleton.
    `keep`: the tensor objects themselves, not CPU views (DCP loads into them in place)."""
    if isinstance(obj, torch.Tensor):
        tensors[path] = obj if keep else obj.detach().cpu().contiguous()
        return {"__tensor__": path}
    def sub(key) -> str:
        return f"{path}/{key}" if path else str(key)

    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj):
            return {k: flatten(v, tensors, sub(k), keep) for k, v in obj.items()}
        return {"__items__": [[k, flatten(v, tensors, sub(k), keep)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [flatten(v, tensors, sub(i), keep) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [flatten(v, tensors, sub(i), keep) for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise CheckpointError(f"checkpoint: cannot store a {type(obj).__name__} at '{path}' (only tensors and JSON values)")


def unflatten(skel: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(skel, dict):
        if "__tensor__" in skel:
            return tensors[skel["__tensor__"]]
        if "__items__" in skel:
            return {k: unflatten(v, tensors) for k, v in skel["__items__"]}
        if "__tuple__" in skel:
            return tuple(unflatten(v, tensors) for v in skel["__tuple__"])
        return {k: unflatten(v, tensors) for k, v in skel.items()}
    if isinstance(skel, list):
        return [unflatten(v, tensors) for v in skel]
    return skel


def _digest(path: Path) -> str:
    """xxh3-128: detects corruption and truncation at ~10 GB/s (sha256 ran at 0.4 GB/s here, 25 ms of a
    10 MB save). Not a signature: what it guards against is damage, and loading runs no code anyway."""
    h = xxhash.xxh3_128()
    with safefile.open_regular(path, "checkpoint file", error=CheckpointError) as f:
        # the chunk size bounds memory only: any size gives the same digest (pragma: equivalent mutants)
        for chunk in iter(lambda: f.read(1 << 20), b""):  # pragma: no mutate
            h.update(chunk)
    return h.hexdigest()


META_LIMIT = 64 * safefile.MiB  # manifest.json, meta.json: metadata, not tensors


def _read_json(folder: Path, name: str) -> Any:
    """`folder / name` (manifest.json, meta.json) as JSON, read through safefile: a FIFO or device in
    its place, or a file above META_LIMIT, is one CheckpointError line; so is JSON that does not parse
    (nested too deep included)."""
    data = safefile.read_bytes(folder / name, name, META_LIMIT, error=CheckpointError, fix="")
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        raise CheckpointError(f"{folder}: {name} is not valid JSON") from None


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_checkpoint(folder: Path, tensors: dict[str, torch.Tensor], meta: dict,
                     extra_files: list[str] = (), staged: Path | None = None) -> Path:
    """Atomically create `folder` holding `tensors` and `meta`. Raises CheckpointError on failure,
    leaving any earlier checkpoint untouched and no partial folder behind. `staged`: a temporary
    folder already holding `extra_files` (the shards of a sharded checkpoint)."""
    folder = Path(folder)
    tmp = staged or folder.with_name(f".tmp-{folder.name}-{os.getpid()}")
    try:
        if staged is None:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        write_tensors(tmp / "tensors.safetensors", tensors)  # tied tensors once, aliases kept
        _write(tmp / "meta.json", json.dumps(meta, sort_keys=True).encode())
        names = [*FILES, *extra_files]
        manifest = {"format": FORMAT, "step": meta.get("position", {}).get("step"),
                    "files": {n: {"xxh3_128": _digest(tmp / n), "bytes": (tmp / n).stat().st_size} for n in names}}
        _write(tmp / MANIFEST, json.dumps(manifest, indent=2).encode())
        for d in {(tmp / n).parent for n in names}:
            fsync_dir(d)
        if folder.exists():  # re-saving the same step (e.g. after a resume): replace it whole
            shutil.rmtree(folder)
        os.replace(tmp, folder)
        fsync_dir(folder.parent)
    except (OSError, SafetensorError) as exc:  # safetensors reports I/O errors as its own type
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(_write_failed(folder, exc)) from None
    except BaseException:  # a second Ctrl-C mid-save (KeyboardInterrupt): no partial folder left either
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def _write_failed(folder: Path, exc: BaseException) -> str:
    """What failed, what to do (errors.py's errno table), and what is left to resume from: "earlier
    checkpoints are intact" said of a run that has none sent users to a resume that cannot work."""
    reason = getattr(exc, "strerror", None) or str(exc).rsplit("I/O error: ", 1)[-1]
    code = getattr(exc, "errno", None)
    if code is None:  # safetensors' Rust error text: "... (os error 28)"
        found = re.search(r"os error (\d+)", str(exc))
        code = int(found.group(1)) if found else None
    advice = os_advice(code)
    try:
        earlier = sorted(p.name for p in folder.parent.glob("step-*") if p.is_dir() and p.name < folder.name)
    except OSError:  # the folder above is the path that failed
        earlier = []
    left = f"earlier checkpoints are intact (newest {earlier[-1]})" if earlier else "there is no earlier checkpoint"
    return f"could not write checkpoint {folder}: {reason}{f'; {advice}' if advice else ''}; {left}"


def tensor_refs(skel: Any) -> set[str]:
    """The tensor paths a `flatten` skeleton refers to."""
    if isinstance(skel, dict):
        if "__tensor__" in skel:
            return {skel["__tensor__"]}
        return set().union(*map(tensor_refs, skel.values())) if skel else set()
    if isinstance(skel, list):
        return set().union(*map(tensor_refs, skel)) if skel else set()
    return set()


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or " ".join(str(exc).split()) or type(exc).__name__


def safetensors_keys(path: Path, what: str) -> set[str]:
    """Parse a .safetensors file's header (offsets must cover the file exactly); its tensor names, the
    aliases of tied tensors included."""
    try:
        regular = safefile.regular(path, "safetensors file", error=CheckpointError, fix="")
        with native_name(regular) as name, safe_open(name, framework="pt") as f:  # a folder's name may not be UTF-8
            keys = set(f.keys())
        return keys | set(aliases_of(path, what))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{what}: not a readable safetensors file ({_reason(exc)})") from None


def verify_checkpoint(folder: Path) -> dict:
    """Check a checkpoint folder without loading its tensors: manifest, no stray or pickle files,
    checksums, every safetensors header parses, and meta.json's tensors are all in tensors.safetensors."""
    folder = Path(folder)
    try:
        return _verify(folder)
    except OSError as exc:  # a file that cannot be read (permissions, I/O error)
        raise CheckpointError(f"{folder}: cannot be read ({_reason(exc)})") from None


def _verify(folder: Path) -> dict:
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: no such checkpoint folder")
    if not (folder / MANIFEST).is_file():
        if not any((folder / n).exists() for n in FILES):
            raise CheckpointError(f"{folder}: not a checkpoint folder (no {MANIFEST}, {' or '.join(FILES)})")
        raise CheckpointError(f"{folder}: incomplete checkpoint (no {MANIFEST}); it was interrupted mid-save")
    try:
        listed = set(_read_json(folder, MANIFEST).get("files", {}))
    except (CheckpointError, AttributeError, TypeError):  # said below, once the stray files are looked at
        listed = set(FILES)
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        if p.is_file() and rel not in (*listed, MANIFEST):
            with safefile.open_regular(p, "checkpoint file", error=CheckpointError) as f:
                head = f.read(2)
            is_pickle = p.suffix in PICKLE_SUFFIXES or (len(head) == 2 and head[0] == 0x80 and head[1] <= 5) or head == b"PK"
            kind = "a pickle file" if is_pickle else "an unexpected file"
            raise CheckpointError(f"{folder}: holds {kind} '{rel}'; ecotrain checkpoints contain no pickles "
                                  "and nothing outside the manifest, so this folder is refused")
    manifest = _read_json(folder, MANIFEST)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise CheckpointError(f"{folder}: format {found!r} is not {FORMAT!r}")
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(isinstance(i, dict) for i in files.values()) \
            or not set(FILES) <= set(files):
        raise CheckpointError(f"{folder}: {MANIFEST} does not list {' and '.join(FILES)} with their checksums")
    for name, info in files.items():
        p = folder / name
        if not p.is_file():
            raise CheckpointError(f"{folder}: {name} is missing")
        if p.stat().st_size != info.get("bytes") or _digest(p) != info.get("xxh3_128"):
            raise CheckpointError(f"{folder}: {name} does not match its checksum (corrupt or truncated)")
    # the checksums only say the files are the ones the manifest lists: check that they also parse
    keys = {}
    for name in files:
        if name.endswith(".safetensors"):
            keys[name] = safetensors_keys(folder / name, f"{folder}: {name}")
    meta = _read_json(folder, "meta.json")
    if not isinstance(meta, dict):
        raise CheckpointError(f"{folder}: meta.json is not a JSON object")
    missing = tensor_refs({k: v for k, v in meta.items() if k != "sharded"}) - keys["tensors.safetensors"]
    if missing:
        raise CheckpointError(f"{folder}: tensors.safetensors lacks {len(missing)} tensor(s) that meta.json "
                              f"refers to, e.g. '{min(missing)}'; the files do not belong together")
    return manifest


def read_checkpoint(folder: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """Verify, then load `(tensors, meta)`. Never unpickles anything."""
    verify_checkpoint(folder)
    try:
        tensors = read_tensors(Path(folder) / "tensors.safetensors", str(folder))
        meta = _read_json(Path(folder), "meta.json")
    except (SafetensorError, OSError, ValueError) as exc:  # changed since it was verified
        raise CheckpointError(f"{folder}: cannot be read ({_reason(exc)})") from None
    return tensors, meta


def load_state_dict_file(path: Path, what: str = "weights file") -> dict[str, torch.Tensor]:
    """Import plain weights: a .safetensors file, or a PyTorch state_dict file loaded with
    `weights_only=True` (tensors and plain containers only: no code runs). `what` names the input
    (`--init-from`, `methods.distill.teacher`) in the line said when `path` is no regular file (exit 3,
    as for any weights file that cannot be read; the CLI checks --init-from first, as a usage error)."""
    path = user_path(path, what, "give a .safetensors file or a state_dict file (.pt)",  # a FIFO would block
                     error=CheckpointError)
    if path.suffix == ".safetensors":
        safetensors_keys(path, str(path))  # one line for a file that is not safetensors
        try:
            return read_tensors(path)
        except (SafetensorError, OSError, ValueError) as exc:
            raise CheckpointError(f"{path}: not a readable safetensors file ({_reason(exc)})") from None
    sd = safeload.torch_load(path, str(path))
    if isinstance(sd, dict) and "state_dict" in sd and isinstance(sd["state_dict"], dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError(f"{path}: expected a dict of tensors (a model state_dict)")
    return sd
