"""The model's input contract, checked one way whether the model is rebuilt from its run folder
(`eval`, `predict RUN`) or loaded from an exported file (`predict MODEL.pt2|.onnx`):

- names: a CSV's feature columns matched to the model's by name, in any order (`match_columns`);
- width: each sample's shape (`check_shape`; a dynamic dimension takes any size);
- dtype, finiteness, and labels that match the rows (`samples`: the training loaders' own check,
  data/builtin.py `checked_tensors`, so a file `fit` would refuse is refused here too);
- labels within the model's classes (`check_label_range`), and outputs that are numbers (`check_outputs`).

`read_file` reads an .npz (`x`, optional `y`) or .csv (the target column, when there, is the label)
through all of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch

from ecotrain.base import safefile
from ecotrain.base.objects import describe
from ecotrain.data.builtin import checked_tensors, csv_columns, read_csv
from ecotrain.base.errors import DataError, EcotrainError
from ecotrain.base.log import log


def match_columns(header: Sequence[str], want: Sequence[str], target: Optional[str], chosen: bool, what: str,
                  model, say: bool = True) -> list[str]:
    """The model's columns (`want`) found by name among a CSV's: the same names in another order are
    read in the model's order (said in one line); a missing column, or one the model does not know, is
    refused naming them. `chosen`: the run picked its columns (data.features) and ignored the others."""
    have = [c for c in header if c != target]
    have_set, want_set = set(have), set(want)  # sets: a file of a million columns is checked in linear time
    missing = [c for c in want if c not in have_set]
    unknown = [] if chosen else [c for c in have if c not in want_set]
    if missing or unknown:
        said = [f"no column {_names(missing)}"] if missing else []
        said += [f"column {_names(unknown)} the model was not trained on"] if unknown else []
        raise DataError(f"{what}: {' and '.join(said)}; the model in {model} takes the columns "
                        f"{_names(want, quote='')}, by name in any order: give a file with those")
    if say and [c for c in have if c in want_set] != list(want):
        log.info(f"{what}: columns in another order than the training data's; read by name, as {', '.join(want)}")
    return list(want)


def _names(cols: Sequence[str], most: int = 8, quote: str = "'") -> str:
    """Column names for a message: the first `most`, then how many more (a line, not a megabyte)."""
    shown = ", ".join(f"{quote}{c}{quote}" for c in cols[:most])
    return shown + (f" and {len(cols) - most:,} more" if len(cols) > most else "")


def samples(x, y, where: str) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(features float32, labels int64 or None): numbers, one row per sample, finite, as many labels
    as rows, each a class id; the check training data gets (`y` None: a file without labels)."""
    n = len(x) if np.ndim(x) else 0
    x, labels = checked_tensors(x, np.zeros(n, dtype=np.int64) if y is None else y, where)
    return x, None if y is None else labels


def check_shape(have: Sequence[int], want: Sequence[Optional[int]], what: str, model, verb: str = "takes") -> None:
    """Each sample's shape against the model's (None: a dynamic dimension, any size)."""
    have, want = tuple(have), tuple(want)
    if len(have) != len(want) or any(w is not None and w != h for w, h in zip(want, have)):
        raise DataError(f"{what}: samples have {_size(have)}, but the model in {model} {verb} {_size(want)}")


def _size(shape: tuple) -> str:
    if len(shape) <= 1 and None not in shape:
        return f"{int(np.prod(shape))} features (shape {shape})"
    return f"shape ({', '.join('any' if s is None else str(s) for s in shape)}{',' if len(shape) == 1 else ''})"


def check_label_range(y: torch.Tensor, num_classes: Optional[int], what: str) -> None:
    if num_classes is not None and len(y) and int(y.max()) >= num_classes:
        raise DataError(f"{what}: label {int(y.max())} is out of range: the model has {num_classes} classes "
                        f"(0 to {num_classes - 1})")


def check_outputs(out: torch.Tensor, start: int, model) -> None:
    """Finite inputs made NaN/Inf outputs: the model's fault, said instead of writing NaN probabilities."""
    bad = ~torch.isfinite(out.reshape(len(out), -1)).all(1)
    if bool(bad.any()):
        row = start + int(bad.nonzero()[0, 0])
        raise EcotrainError(f"predict: the model in {model} returned NaN/Inf for row {row}, whose features are "
                            "finite; nothing was written (check the model's weights: `ecotrain eval`)")


def read_file(path: Path, columns: Optional[Sequence[str]], chosen: bool, target: Optional[str], what: str,
              model, say: bool = True) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(features, labels or None) of an .npz or .csv for a model that takes `columns` (None: no names;
    a CSV's every column but `target`, in the file's order). `say`: the note on another column order."""
    kind = path.suffix.lower()
    if kind == ".npz":
        try:
            with safefile.open_regular(path, "data file", error=DataError, fix="give an .npz file") as fh, \
                    np.load(fh, allow_pickle=False) as z:
                if "x" not in z.files:
                    raise DataError(f"{path}: missing array 'x' (found {list(z.files)}); save with np.savez(path, x=...)")
                x, y = z["x"], (z["y"] if "y" in z.files else None)
        except EcotrainError:
            raise
        except Exception as exc:  # a damaged archive, an object array, not a zip at all
            raise DataError(f"{path}: cannot read as .npz ({describe(exc)})") from None
    elif kind == ".csv":
        header, body = read_csv(path)
        names = (match_columns(header, columns, target, chosen, what, model, say) if columns
                 else [c for c in header if c != target])
        if not names:
            raise DataError(f"{path}: no feature column (columns: {header})")
        x, y = csv_columns(path, header, body, names, target)
    else:
        raise DataError(f"{what}: not a .npz or .csv file")
    return samples(x, y, str(path))
