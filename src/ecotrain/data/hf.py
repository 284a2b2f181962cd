"""`data.name: hf:PATH`: a Hugging Face `datasets` dataset saved with `save_to_disk`, opened with
`load_from_disk` (Arrow files, memory-mapped: bigger than memory is fine; never a hub download).

A DatasetDict uses its `train` split, and its `validation` (or `val`) and `test` splits when it
has them. Features are `data.features` (default: every column but `data.target`): one column of
(nested) equal-length lists, or several columns of one number each.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from ecotrain.data.columns import feature_columns, fingerprint, labels_of, need, table_xy
from ecotrain.base.errors import DataError


class HFSource:
    def __init__(self, ds, cols: list[str], target: str, where: str, digest: str):
        self.ds = ds.with_format("arrow", columns=[*cols, target])
        self.cols, self.target, self.where, self.digest = cols, target, where, digest
        self._labels: Optional[torch.Tensor] = None

    def __len__(self) -> int:
        return len(self.ds)

    def take(self, idx: torch.Tensor):
        return table_xy(self.ds[idx.tolist()], self.cols, self.target, self.where)

    def labels(self) -> torch.Tensor:
        if self._labels is None:
            self._labels = labels_of(self.ds[:][self.target], self.target, self.where)
        return self._labels

    def hash_into(self, h) -> None:
        h.update(self.digest.encode())


def load_hf(path: str, cfg) -> tuple[HFSource, Optional[HFSource], Optional[HFSource], Optional[int]]:
    """(train, validation or None, test or None, num_classes from a ClassLabel or None)."""
    datasets = need("datasets", f"data.name=hf:{path}")
    root = Path(path)
    if not root.is_dir():
        raise DataError(f"data.name=hf:{path}: not a folder; give a folder written by Dataset.save_to_disk")
    try:
        loaded = datasets.load_from_disk(str(root), keep_in_memory=False)
    except FileNotFoundError as exc:
        raise DataError(f"data.name=hf:{path}: not a saved dataset ({' '.join(str(exc).split())[:200]}); "
                        "write it with Dataset.save_to_disk") from None
    except Exception as exc:  # a truncated or damaged Arrow file, a broken state.json
        raise DataError(f"data.name=hf:{path}: cannot open the saved dataset ({type(exc).__name__}: "
                        f"{' '.join(str(exc).split())[:200]}); re-save it") from None
    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded:
            raise DataError(f"data.name=hf:{path}: a DatasetDict without a 'train' split (splits: {list(loaded)})")
        splits = {"train": loaded["train"], "val": loaded.get("validation", loaded.get("val")),
                  "test": loaded.get("test")}
    else:
        splits = {"train": loaded, "val": None, "test": None}
    files = sorted(p for p in root.rglob("*") if p.is_file())
    digest = fingerprint(root, files, extra=f"hf\0{cfg.features}\0{cfg.target}".encode())
    out = {}
    for name, ds in splits.items():
        if ds is None:
            out[name] = None
            continue
        where = f"hf:{path} ({name} split)"
        if len(ds) == 0:
            raise DataError(f"{where}: empty")
        cols = feature_columns(list(ds.column_names), cfg.features, cfg.target, where)
        out[name] = HFSource(ds, cols, cfg.target, where, f"{digest}:{name}")
    feature = splits["train"].features.get(cfg.target)
    num_classes = getattr(feature, "num_classes", None)  # a ClassLabel knows its classes
    return out["train"], out["val"], out["test"], num_classes
