"""Built-in and user data sources, validated before anything trains.

mnist1d: generated offline with the `mnist1d` package's `make_dataset` (never its download path).
text: the Python standard library's source as byte sequences, for language models (data/text.py).
tokens:PATH: token files as nanoGPT writes them, memory-mapped (data/tokens.py).
digits: scikit-learn's 8x8 digits, shipped inside the package.
npz / csv: the user's files. `pkg.module:Name`: a map-style Dataset (or a factory returning one).
The formats, their readers and options: one table, data_formats.py.
"""

from __future__ import annotations

import csv
import importlib
import io
import zipfile
from pathlib import Path
from typing import Any, NamedTuple, Optional

import numpy as np
import torch

from ecotrain.base import safefile
from ecotrain.config import Config
from ecotrain.data.cache import load_or_make, package_version
from ecotrain.data.items import is_class_pair, is_structured, structured_bundle
from ecotrain.data.sources import ArraySource, DataBundle, MapSource, Subset, attribute_labels, sample_positions, subset
from ecotrain.data.split import stratified_split
from ecotrain.base.data_formats import DataFormat, data_format
from ecotrain.base.errors import DataError, EcotrainError
from ecotrain.base.objects import describe, import_object
from ecotrain.base.userpath import user_path


def _unreadable(path: Path, exc: BaseException, what: str) -> DataError:
    """A user file that cannot be read: permissions, encoding, a damaged archive."""
    if isinstance(exc, UnicodeDecodeError):
        return DataError(f"{path}: not UTF-8 text (byte {exc.start}); save the {what} as UTF-8")
    if isinstance(exc, OSError) and exc.strerror:
        return DataError(f"{path}: cannot read the {what} ({exc.strerror})")
    return DataError(f"{path}: cannot read the {what} ({describe(exc)})")


def check_labels(y: torch.Tensor, where: str, num_classes: int | None = None, hint: str = "") -> None:
    """Integer class ids from 0 to num_classes - 1 (or at least 0 when num_classes is unknown);
    `hint`, what to do, is added to an out-of-range label's message."""
    if torch.is_floating_point(y):
        bad = ~torch.isfinite(y.reshape(-1))
        if bool(bad.any()):
            raise DataError(f"{where}: labels hold NaN/Inf (first at row {int(bad.nonzero()[0, 0])}); every row "
                            "needs a class id: fill or drop those rows")
        if not torch.equal(y, y.round()):
            raise DataError(f"{where}: labels must be integer class ids, got fractional values")
        y = y.long()
    y = y.reshape(-1)
    if y.min() < 0 or (num_classes is not None and y.max() >= num_classes):
        allowed = f"from 0 to {num_classes - 1}" if num_classes is not None else "0 or more"
        bad_row = int(((y < 0) | (y >= (num_classes or 1 << 62))).nonzero()[0, 0])
        raise DataError(f"{where}: label {int(y[bad_row])} at row {bad_row} is out of range "
                        f"(labels must be class ids {allowed}){hint}")


def validate_arrays(x, y, where: str, num_classes: int | None = None, labels: bool = True) -> None:
    """One clear error for data that would otherwise fail (or silently mislead) mid-training.
    `labels`: y holds class ids (else real-valued targets, which must be finite)."""
    if len(x) != len(y):
        raise DataError(f"{where}: {len(x)} feature rows but {len(y)} labels; they must match")
    if len(y) == 0:
        raise DataError(f"{where}: no samples")
    if torch.is_floating_point(x):
        bad = ~torch.isfinite(x)
        if bad.any():
            row = int(bad.reshape(len(x), -1).any(1).nonzero()[0])
            raise DataError(f"{where}: features hold NaN/Inf (first at row {row}); clean or impute them")
    if not labels:
        if torch.is_floating_point(y) and not bool(torch.isfinite(y).all()):
            row = int((~torch.isfinite(y)).reshape(len(y), -1).any(1).nonzero()[0])
            raise DataError(f"{where}: targets hold NaN/Inf (first at row {row}); clean or drop those rows")
        return
    check_labels(y, where, num_classes)


def checked_tensors(x, y, where: str, num_classes=None):
    x_arr, y_arr = np.asarray(x), np.asarray(y)
    for what, a in (("features", x_arr), ("labels", y_arr)):
        if a.dtype.kind not in "biuf":
            raise DataError(f"{where}: {what} must be numbers, got dtype {a.dtype}; convert or encode them first")
    if x_arr.ndim < 2:
        raise DataError(f"{where}: features must have one row per sample, shape (samples, features...), "
                        f"got shape {x_arr.shape}" + ("; use x[:, None] for one feature" if x_arr.ndim == 1 else ""))
    if 0 in x_arr.shape[1:]:
        raise DataError(f"{where}: features have shape {x_arr.shape}, so each sample has no features at all; "
                        "save at least one feature per sample")
    if y_arr.ndim == 2 and y_arr.shape[1] == 1:
        y_arr = y_arr[:, 0]
    if y_arr.ndim != 1:
        raise DataError(f"{where}: labels must be one class id per sample, shape (samples,), got shape {y_arr.shape}")
    x = torch.as_tensor(x_arr.astype(np.float32))
    y = torch.as_tensor(y_arr.astype(np.float64) if y_arr.dtype.kind == "f" else y_arr.astype(np.int64))
    validate_arrays(x, y, where, num_classes)
    return x, y.long()


class Found(NamedTuple):
    """What a reader found, before load_data's seeded splits: the samples, the source's own validation
    and test splits (None: held out here), its classes (None: from the labels) and named input columns."""

    base: Any
    own_val: Any = None
    test: Any = None
    num_classes: Optional[int] = None
    inputs: Optional[dict] = None  # {"columns": [...]}: a table's feature columns, the model's input contract


def mnist1d(cfg: Config):
    """make_dataset's output, from the dataset cache (data/cache.py) after the first run: `mnist1d`
    (a 2 s import) is imported and the data generated (3 s for 5,000 samples) only on a cache miss."""
    num_samples, kwargs = cfg.data.num_samples, dict(cfg.data.kwargs)

    def make():
        import random

        from mnist1d.data import get_dataset_args, make_dataset

        args = get_dataset_args()
        args.num_samples = num_samples
        for k, v in kwargs.items():
            if not hasattr(args, k):
                raise DataError(f"data.kwargs.{k}: not an mnist1d dataset argument")
            setattr(args, k, v)
        saved = random.getstate(), np.random.get_state()  # make_dataset reseeds both global generators:
        try:  # put them back, so a cache hit and a miss leave the process in the same state
            return make_dataset(args)  # generated here; get_dataset() would try a download
        finally:
            random.setstate(saved[0])
            np.random.set_state(saved[1])

    versions = {"mnist1d": package_version("mnist1d"), "numpy": np.__version__, "scipy": package_version("scipy")}
    d = load_or_make("mnist1d", versions, {"num_samples": num_samples, "kwargs": kwargs}, make)
    train = checked_tensors(d["x"], d["y"], "mnist1d train", 10)
    test = checked_tensors(d["x_test"], d["y_test"], "mnist1d test", 10)
    return train, test, 10


def load_mnist1d(cfg: Config) -> Found:
    try:
        train, test, num_classes = mnist1d(cfg)
    except EcotrainError:
        raise
    except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError) as exc:
        # mnist1d's generator, given data.kwargs it cannot use (a train_split of 0, a string for a number)
        raise DataError(f"data: mnist1d could not make the dataset from data.num_samples={cfg.data.num_samples} "
                        f"and data.kwargs={cfg.data.kwargs} ({describe(exc)})") from None
    return Found(ArraySource(*train), test=ArraySource(*test), num_classes=num_classes)



def load_digits(cfg: Config) -> Found:
    """scikit-learn's digits, from the dataset cache after the first run: importing sklearn costs
    about 2 s, the 1,797 samples 0.1 MB."""
    def make():
        from sklearn import datasets  # its load_digits, not this module's

        d = datasets.load_digits()
        return {"x": d.data, "y": d.target}

    d = load_or_make("digits", {"scikit-learn": package_version("scikit-learn"), "numpy": np.__version__}, {}, make)
    return Found(ArraySource(*checked_tensors(d["x"] / 16.0, d["y"], "digits", 10)), num_classes=10)


def load_npz(cfg: Config) -> Found:
    path = _need_path(cfg)
    try:
        z = np.load(safefile.open_regular(path, ".npz file", error=DataError), allow_pickle=False)  # never unpickle
    except DataError:
        raise
    except Exception as exc:
        raise DataError(f"{path}: cannot read as .npz ({describe(exc)})") from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise DataError(f"{path}: a single .npy array, not an .npz archive; save with np.savez(path, x=..., y=...)")
    with z:
        files = list(z.files)
        for key in ("x", "y"):
            if key not in files:
                raise DataError(f"{path}: missing array '{key}' (found {files}); save with np.savez(path, x=..., y=...)")
        if ("x_test" in files) != ("y_test" in files):
            have, lack = ("x_test", "y_test") if "x_test" in files else ("y_test", "x_test")
            raise DataError(f"{path}: has '{have}' but no '{lack}'; a test set needs both (or neither)")

        def read(key: str):
            try:
                return z[key]
            except ValueError as exc:
                if "allow_pickle" in str(exc):  # dtype=object: the array is pickled Python objects
                    raise DataError(f"{path}: array '{key}' holds Python objects (dtype=object), which only pickle "
                                    "can read and ecotrain never unpickles; save numeric arrays") from None
                raise DataError(f"{path}: cannot read array '{key}' ({describe(exc)})") from None
            except (OSError, EOFError, zipfile.BadZipFile, KeyError) as exc:
                raise DataError(f"{path}: cannot read array '{key}' ({describe(exc)}); the archive is damaged") from None

        train = checked_tensors(read("x"), read("y"), f"{path} x/y")
        test = checked_tensors(read("x_test"), read("y_test"), f"{path} x_test/y_test") if "x_test" in files else None
    return Found(ArraySource(*train), test=ArraySource(*test) if test is not None else None)


def load_csv(cfg: Config) -> Found:
    """Columns by name: the feature columns are data.features in that order, or every column but
    data.target in the file's order; their names are the model's input contract (`inputs`, kept in
    summary.json; predict and eval read a file's columns by them)."""
    path = _need_path(cfg)
    header, body = read_csv(path)
    if cfg.data.target not in header:
        raise DataError(f"{path}: no column '{cfg.data.target}' (columns: {header}); set data.target")
    if len(header) < 2:
        raise DataError(f"{path}: only the label column '{cfg.data.target}'; at least one feature column is needed")
    names = csv_features(header, cfg.data.features, cfg.data.target, path)
    feats, labels = csv_columns(path, header, body, names, cfg.data.target)
    return Found(ArraySource(*checked_tensors(feats, labels, str(path))), inputs={"columns": names})


def read_csv(path: Path, header_only: bool = False) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of a CSV file: a header of distinct names (columns are read by name), then at
    least one row, every row as long as the header. `header_only`: the header and the first row alone."""
    try:
        with safefile.open_regular(path, "CSV file", error=DataError) as raw, \
                io.TextIOWrapper(raw, encoding="utf-8-sig", newline="") as f:  # -sig: a byte-order mark is not in the header
            reader = csv.reader(f)
            rows = [r for r, _ in zip(reader, range(2))] if header_only else list(reader)
    except (OSError, UnicodeDecodeError) as exc:
        raise _unreadable(path, exc, "CSV file") from None
    except csv.Error as exc:
        raise DataError(f"{path}: not a readable CSV file ({describe(exc)})") from None
    if len(rows) < 2:
        raise DataError(f"{path}: needs a header row and at least one data row")
    header, body = rows[0], rows[1:]
    seen: set = set()  # a set, not header[:i]: a million columns is a million steps, not 5e11
    twice = next((c for c in header if c in seen or seen.add(c)), None)
    if twice is not None:
        where = [i + 1 for i, c in enumerate(header) if c == twice]
        raise DataError(f"{path}: column '{twice}' is named {len(where)} times in the header (columns "
                        f"{', '.join(map(str, where))}); columns are read by name: rename or drop all but one")
    for i, r in enumerate(body, start=2):
        if len(r) != len(header):
            raise DataError(f"{path}:{i}: {len(r)} fields, header has {len(header)}")
    return header, body


def csv_features(header: list[str], features, target: Optional[str], path: Path) -> list[str]:
    """The feature columns by name: `features` (data.features) in that order, each present, or every
    column but `target` (None: a file without labels) in the file's order."""
    if features:
        have = set(header)
        missing = [c for c in features if c not in have]
        if missing:
            raise DataError(f"{path}: no feature column '{missing[0]}' (columns: {header}); fix data.features")
        return list(features)
    return [c for c in header if c != target]


def csv_columns(path: Path, header: list[str], body: list[list[str]], names: list[str],
                target: Optional[str]) -> tuple[list[list[float]], Optional[list[float]]]:
    """A CSV's features (the `names` columns) and labels (the `target` column; None: the file has none),
    as numbers: the training data's reading (load_csv) and a file's to predict or evaluate (contract.py)."""
    labels = [r[0] for r in csv_numbers(path, header, body, [target])] if target in header else None
    return csv_numbers(path, header, body, names), labels


def csv_numbers(path: Path, header: list[str], body: list[list[str]], names: list[str]) -> list[list[float]]:
    """The named columns of every row, as numbers."""
    where = {c: j for j, c in enumerate(header)}  # names are unique (read_csv): one pass, not one per name
    at = [where[c] for c in names]
    try:
        return [[float(r[j]) for j in at] for r in body]
    except ValueError as exc:
        row = next(i for i, r in enumerate(body, start=2) if not _all_numbers(r[j] for j in at))
        raise DataError(f"{path}:{row}: not a number ({exc})") from None


def _all_numbers(cells) -> bool:
    try:
        [float(v) for v in cells]
    except ValueError:
        return False
    return True


def _need_path(cfg: Config) -> Path:
    if not cfg.data.path:
        raise DataError(f"data.path: required for data.name={cfg.data.name}")
    # a FIFO or a device is refused before it is opened; a run's config.yaml keeps the path as given, so
    # `resume`/`eval` from another folder look elsewhere (user_path says from where)
    p = user_path(cfg.data.path, "data.path", f"give the .{cfg.data.name} file", error=DataError)
    try:
        with safefile.open_regular(p, f".{cfg.data.name} file", error=DataError):
            pass
    except OSError as exc:
        raise _unreadable(p, exc, f".{cfg.data.name} file") from None
    return p


def _user_dataset(cfg: Config):
    """A map-style Dataset by import path (or a factory returning one), checked: an (x, y) pair, x of
    one shape and finite, y an integer class id. Every item is read once for its label (the seeded
    stratified split needs them), unless the Dataset has a `labels`/`targets` attribute: then only a
    fixed sample of 16 items is read and checked. Returns (source, num_classes); items of another
    structure (item 0 decides: dicts, per-token targets) a whole DataBundle (data/items.py)."""
    name = cfg.data.name
    obj = import_object(name, "data.name")
    where = f"data.name: dataset '{name}'"
    try:
        ds = obj(**cfg.data.kwargs) if callable(obj) else obj
    except Exception as exc:
        raise DataError(f"data.name: calling '{name}' with data.kwargs {cfg.data.kwargs} raised {describe(exc)}") from None
    try:
        n = len(ds)
    except Exception as exc:
        raise DataError(f"{where}: len() raised {describe(exc)}; a map-style Dataset needs __len__ and __getitem__") from None
    if n == 0:
        raise DataError(f"{where} is empty")
    item0 = _read_item(ds, 0, where)
    if not is_class_pair(item0):
        if not is_structured(item0):
            raise DataError(f"{where}: item 0 is {type(item0).__name__}; each item must be an (x, y) pair, a tuple "
                            "(inputs..., target) or a dict (input_ids, labels, ...)")
        return structured_bundle(cfg, ds, n, where)  # dicts, per-token targets: data/items.py
    labels, shape0 = [], None
    given = attribute_labels(ds)
    if given is not None and len(given) != n:
        raise DataError(f"{where}: its labels attribute holds {len(given)} labels for {n} items")
    for i in (range(n) if given is None else sample_positions(n)):
        item = _read_item(ds, i, where)
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise DataError(f"{where}: item {i} is {type(item).__name__}; each item must be an (x, y) pair")
        try:
            x, y = torch.as_tensor(item[0]), torch.as_tensor(item[1])
        except Exception as exc:
            raise DataError(f"{where}: item {i} is not numeric ({describe(exc)})") from None
        if shape0 is None:
            shape0 = x.shape
        elif x.shape != shape0:
            raise DataError(f"{where}: item {i} has x of shape {tuple(x.shape)} but item 0 {tuple(shape0)}; "
                            "every x must have the same shape")
        if x.is_floating_point() and not bool(torch.isfinite(x).all()):
            raise DataError(f"{where}: item {i}: x holds NaN/Inf; clean or impute it")
        if y.numel() != 1 or not (y.dtype.is_floating_point or y.dtype in _INT_DTYPES):
            raise DataError(f"{where}: item {i}: y must be one integer class id, got {tuple(y.shape)} {y.dtype}")
        labels.append(y.reshape(()).item())
    y_all = torch.tensor(labels) if given is None else given
    num_classes = getattr(ds, "num_classes", None)
    if num_classes is not None and (not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 1):
        raise DataError(f"{where}: num_classes must be a positive int, got {num_classes!r}")
    check_labels(y_all, where, num_classes)
    base = MapSource(ds)
    base._labels = y_all.long()  # read once here; MapSource would read every item again
    return base, num_classes  # None: load_data infers it from the labels


def _read_item(ds, i: int, where: str):
    try:
        return ds[i]
    except Exception as exc:
        raise DataError(f"{where}: item {i} raised {describe(exc)}") from None


_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def reader(fmt: DataFormat):
    """A format's reader, its module imported now: the token and on-disk readers cost imports a run
    of another format never needs (startup)."""
    module, _, name = fmt.reader.partition(":")
    return getattr(importlib.import_module(module), name)


def load_data(cfg: Config) -> DataBundle:
    """Load the configured source (data_formats.py: its reader; else a Dataset by import path), then
    hold out test (if it has none) and validation, seeded. Token data and structured items come whole
    from their readers (split by position or sequence, not stratified by class)."""
    fmt = data_format(cfg.data.name)
    found = reader(fmt)(cfg) if fmt is not None else _import_path(cfg)
    return found if isinstance(found, DataBundle) else _split(cfg, found)


def _import_path(cfg: Config):
    found = _user_dataset(cfg)
    if isinstance(found, DataBundle):  # items of any structure, split by item (data/items.py)
        return found
    base, num_classes = found
    return Found(base, num_classes=num_classes)


def load_shards_pattern(cfg: Config):
    """`shards:PATTERN`: .bin token files (data/tokens.py), else tar or Parquet shards (data/shards.py)."""
    from ecotrain.data.tokens import load_token_shards  # the token readers: imported when a recipe names one

    tokens = load_token_shards(cfg)
    return tokens if tokens is not None else load_on_disk(cfg)


def _split(cfg: Config, found: Found) -> DataBundle:
    base, own_val, test_src, num_classes, inputs = found
    num_classes = _check_splits(cfg, base, own_val, test_src, num_classes)
    labels = base.labels()
    if own_val is not None:  # the dataset's own validation split
        x0, _ = base.take(torch.tensor([0]))
        extra = _stream_extra(base) | _named(inputs, x0)
        return DataBundle(base, own_val, test_src, num_classes, tuple(x0.shape[1:]), extra=extra)
    if test_src is None and cfg.data.test_split > 0:
        keep, held = stratified_split(labels, cfg.data.test_split, cfg.seed + 1, cfg.data.stratify)
        if len(keep) == 0:
            raise DataError(f"data.test_split: {cfg.data.test_split} of {len(labels)} samples leaves no training "
                            "samples; use more data or a smaller data.test_split")
        base, test_src = subset(base, keep), subset(base, held)
        labels = labels[keep]
    keep, held = stratified_split(labels, cfg.data.val_split, cfg.seed, cfg.data.stratify)
    if cfg.data.val_split > 0 and len(held) == 0:
        raise DataError(f"data.val_split: {cfg.data.val_split} of {len(labels)} samples leaves the validation split empty; "
                        "use more data, a larger split, or data.val_split=0")
    if len(keep) == 0:
        raise DataError(f"data.val_split: {cfg.data.val_split} of {len(labels)} samples leaves the train split empty "
                        "(small classes go whole to validation); use more data or a smaller data.val_split")
    val = subset(base, held) if len(held) else None
    train = subset(base, keep)
    x0, _ = train.take(torch.tensor([0]))
    extra = _stream_extra(train) | _named(inputs, x0)
    return DataBundle(train, val, test_src, num_classes, tuple(x0.shape[1:]), extra=extra)


def _table_columns(src) -> Optional[dict]:
    """A Parquet or `hf:` table's feature columns, by name (`.cols` of its source), as the csv loader
    gives them: the model's input contract, kept in summary.json so predict reads a CSV by name."""
    cols = getattr(src, "cols", None)
    return {"columns": list(cols)} if isinstance(cols, list) and cols else None


def _named(inputs: Optional[dict], x0: torch.Tensor) -> dict:
    """`{"inputs": ...}` when each named column is one feature (a list column's width has no names)."""
    if not inputs or tuple(x0.shape[1:]) != (len(inputs["columns"]),):
        return {}
    return {"inputs": inputs}


# An inferred head this wide, for labels this sparse, is a file of ids (user ids, years), not class ids:
# the output layer would have one row per id (1e9 of them: 64 GB, an allocation error mid-start).
_SPARSE_IDS = 10_000


def _check_splits(cfg: Config, train, own_val, test, num_classes: int | None) -> int:
    """The head's width, and every split checked against it and against the training samples' shape:
    a test set the model cannot take fails here, in one line, not after training. `num_classes`: what
    the source says (a ClassLabel, a Dataset attribute, a built-in), else None (the labels' maximum)."""
    where = cfg.data.path or f"data.name={cfg.data.name}"  # the user's file, when there is one
    labels = train.labels()
    if cfg.data.num_classes is not None:  # a head wider than the labels present (a continual task)
        num_classes, where = cfg.data.num_classes, f"data.num_classes={cfg.data.num_classes}"
    elif num_classes is None:
        num_classes = int(labels.max()) + 1
        distinct = len(torch.unique(labels))
        if num_classes > _SPARSE_IDS and num_classes > 10 * distinct:
            row = int(labels.reshape(-1).argmax())
            raise DataError(f"{where}: label {num_classes - 1} at row {row} would make a head of {num_classes:,} "
                            f"classes for {distinct} distinct labels; labels must be class ids 0 to K-1: remap them "
                            "(np.unique(y, return_inverse=True)) or set data.num_classes")
    x0 = train.take(torch.tensor([0]))[0]
    for split, what in ((train, "train"), (own_val, "validation"), (test, "test")):
        if split is None:
            continue
        hint = "" if cfg.data.num_classes is not None or what == "train" else \
            f"; the training labels make {num_classes} classes: set data.num_classes for a wider head"
        check_labels(split.labels(), f"{where}: the {what} data", num_classes, hint)
        if what != "train" and isinstance(x0, torch.Tensor):  # a Dataset's items may be any structure
            xs = split.take(torch.tensor([0]))[0]
            if isinstance(xs, torch.Tensor) and xs.shape[1:] != x0.shape[1:]:
                raise DataError(f"{where}: the {what} samples have shape {tuple(xs.shape[1:])}, the training "
                                f"samples {tuple(x0.shape[1:])}; the model cannot take both: give every split "
                                "the same features")
    return num_classes


def load_on_disk(cfg: Config) -> Found:
    """`hf:`, `parquet:` and `shards:` tables, bigger than memory; a table's feature columns by name."""
    base, own_val, test, num_classes = _on_disk(cfg)
    return Found(base, own_val, test, num_classes, _table_columns(base))


def _on_disk(cfg: Config):
    """(train, its own validation split or None, test or None, num_classes or None)."""
    kind, _, path = cfg.data.name.partition(":")
    if not path:
        raise DataError(f"data.name: '{cfg.data.name}' needs a path: {kind}:FOLDER")
    # the on-disk formats' readers (~20 ms of imports) are imported when a recipe names one (bench/startup.py)
    if kind == "hf":
        from ecotrain.data.hf import load_hf

        return load_hf(path, cfg.data)
    from ecotrain.data.shards import load_parquet, load_shards

    if kind == "shards":  # .tar or .parquet files (data/tarshards.py, data/shards.py)
        return load_shards(path, cfg.data), None, None, None
    src, _ = load_parquet(path, cfg.data)
    return src, None, None, None


def _stream_extra(train) -> dict:
    """A streamed source's train rows per shard (`blocks`), for the sampler's shard order, and what
    `data.on_bad_shard: skip` left out at start-up (`data_skipped`, for summary.json)."""
    rows, src = None, train
    while isinstance(src, Subset):  # compose the split indices down to the shards' own row ids
        rows = src.indices if rows is None else src.indices[rows]
        src = src.base
    if not hasattr(src, "shard_sizes"):
        return {}
    extra = {"blocks": src.shard_sizes(rows if rows is not None else torch.arange(len(src)))}
    if src.damage.shards or src.damage.samples:
        extra["data_skipped"] = src.damage.to_json()
    return extra
