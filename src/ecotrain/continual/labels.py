"""Label hygiene for incoming data: normalise the labels, then flag the ones the model strongly contradicts.

Normalisation: a mapping (a JSON or YAML file, `--label-map`) from raw labels (strings, aliases, old
ids) to class ids: `{"cat": 3, "kitty": 3, "7": 7}`. Without one, integer labels (and strings that are
integers) pass as they are; anything else is one DataError naming the first unmapped label.

Contradiction: the current model predicts another class than the label with probability >=
`threshold`. Only labels of classes the model has learnt count: a class it has never seen is new,
not contradicted (in class-incremental updates every new-class label would be "contradicted").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import yaml

from ecotrain.base import safefile
from ecotrain.base.errors import ConfigError, DataError
from ecotrain.base.userpath import user_path


def load_label_map(path: Optional[str | Path]) -> Optional[dict[str, int]]:
    if path is None:
        return None
    p = user_path(path, "--label-map", "give a JSON or YAML file mapping raw labels to class ids")  # no FIFO
    try:
        text = safefile.read_bytes(p, "label map", 16 * safefile.MiB, fix="give a JSON or YAML file mapping raw "
                                   "labels to class ids").decode("utf-8")  # a FIFO swapped in: one line, no wait
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--label-map {p}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        tree = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError, RecursionError):  # RecursionError: nested 100,000 deep
        raise ConfigError(f"--label-map {p}: not valid {'JSON' if p.suffix == '.json' else 'YAML'}") from None
    if not isinstance(tree, dict) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                             for v in tree.values()):
        raise ConfigError(f"--label-map {p}: must map raw labels to class ids (integers >= 0), "
                          "e.g. {\"cat\": 3, \"kitty\": 3}")
    return {str(k).strip(): v for k, v in tree.items()}


def normalise(raw: np.ndarray, mapping: Optional[dict[str, int]], where: str) -> torch.Tensor:
    """Raw labels -> class ids (int64)."""
    raw = np.asarray(raw)
    if raw.ndim != 1:
        raise DataError(f"{where}: labels must be one value per example, got shape {raw.shape}")
    if mapping is None and raw.dtype.kind in "iu":
        return torch.from_numpy(raw.astype(np.int64))
    if mapping is None and raw.dtype.kind == "f" and np.all(np.isfinite(raw)) and np.all(raw == np.round(raw)):
        return torch.from_numpy(raw.astype(np.int64))
    out = np.empty(len(raw), dtype=np.int64)
    for i, v in enumerate(raw.tolist()):
        key = str(int(v)) if isinstance(v, float) and v.is_integer() else str(v).strip()
        if mapping is not None and key in mapping:
            out[i] = mapping[key]
        elif key.lstrip("-").isdigit() and (mapping is None or int(key) in mapping.values()):
            out[i] = int(key)
        else:
            hint = "add it to --label-map" if mapping is not None else "give --label-map FILE mapping it to a class id"
            raise DataError(f"{where}: label {v!r} (row {i}) is not a class id; {hint}")
    return torch.from_numpy(out)


def contradicted(probs: torch.Tensor, y: torch.Tensor, known: set[int], threshold: float) -> torch.Tensor:
    """Mask of the examples whose label (of a known class) the model contradicts with confidence >= threshold."""
    conf, pred = probs.max(-1)
    is_known = torch.tensor([int(c) in known for c in y.tolist()], dtype=torch.bool)
    return is_known & (pred != y) & (conf >= threshold)


def contradictions(probs: torch.Tensor, y: torch.Tensor, known: set[int], threshold: float = 0.9) -> dict:
    """The contradicted examples (`contradicted`), counted, the most confident first."""
    conf, pred = probs.max(-1)
    is_known = torch.tensor([int(c) in known for c in y.tolist()], dtype=torch.bool)
    flagged = contradicted(probs, y, known, threshold)
    idx = flagged.nonzero().flatten()
    order = idx[conf[idx].argsort(descending=True)]
    return {"threshold": threshold, "checked": int(is_known.sum()), "new_class_examples": int((~is_known).sum()),
            "contradicted": int(flagged.sum()),
            "fraction": round(float(flagged.sum()) / max(int(is_known.sum()), 1), 6),
            "examples": [{"index": int(i), "label": int(y[i]), "predicted": int(pred[i]),
                          "confidence": round(float(conf[i]), 6)} for i in order[:20]]}


def review_rows(probs: torch.Tensor, y: Optional[torch.Tensor], top: int) -> list[dict]:
    """The `top` most-contradicted (labelled data: highest confidence on a class other than the label)
    and the `top` lowest-confidence examples, each once; most contradicted first."""
    conf, pred = probs.max(-1)
    rows: dict[int, dict] = {}
    if y is not None:
        label_p = probs.gather(1, y.clamp(0, probs.shape[1] - 1).view(-1, 1)).flatten()
        against = torch.where(pred != y, conf, torch.zeros_like(conf))
        for i in against.argsort(descending=True)[:top].tolist():
            if against[i] > 0:
                rows[i] = {"reason": "contradicted"}
    for i in conf.argsort()[:top].tolist():
        rows.setdefault(i, {"reason": "low_confidence"})
    out = []
    for i, r in rows.items():
        row = {"index": i, "reason": r["reason"], "predicted": int(pred[i]), "confidence": round(float(conf[i]), 6)}
        if y is not None:
            row.update(label=int(y[i]), label_probability=round(float(label_p[i]), 6))
        out.append(row)
    return out
