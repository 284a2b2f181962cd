"""Documents packed into fixed-length windows, their boundaries kept.

A token stream holds documents each followed by an end-of-document id (`eod`), as nanoGPT's
`prepare.py` and `ecotrain tokenize` write them. A window of it is cut into input `x` and target
`y` (shifted by one). The `eod` belongs to the document it ends, so predicting it is learned; the
target after it (the next document's first token) is predicted from another document and is
masked (IGNORE). `document_mask` adds the attention side: position i may attend to j only when
j <= i and both are in one document.
"""

from __future__ import annotations

import torch

from ecotrain.data.text import IGNORE


def mask_boundaries(x: torch.Tensor, y: torch.Tensor, eod: int) -> torch.Tensor:
    """`y` with IGNORE where the input is `eod`: that target lies in the next document."""
    return y.masked_fill(x == eod, IGNORE)


def document_ids(x: torch.Tensor, eod: int) -> torch.Tensor:
    """[b, T] the document of each position, counted from 0 in each row; an `eod` is its document's last."""
    ends = (x == eod).long()
    return torch.cumsum(ends, 1) - ends


def document_mask(x: torch.Tensor, eod: int) -> torch.Tensor:
    """[b, 1, T, T] bool, True where attention is allowed: causal and within one document (the 4-D
    mask Hugging Face's causal LMs take as `attention_mask`)."""
    doc = document_ids(x, eod)
    t = x.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
    return ((doc[:, :, None] == doc[:, None, :]) & causal)[:, None]
