"""A nanoGPT-style GPT (Karpathy's model.py, in its parameter names): learned positions, pre-norm
blocks, attention through `F.scaled_dot_product_attention(is_causal=True)`, and the output head tied
to the token embedding (`lm_head.weight is transformer.wte.weight`: one tensor, saved once and
restored tied by tensorfile.py). Input: token ids `[batch, T]` (and optionally a document mask); output: logits `[batch, T, vocab]`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool):
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"d_model={n_embd} is not a multiple of n_heads={n_head}")
        self.n_head, self.dropout = n_head, dropout
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x, mask=None):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).view(b, t, 3, self.n_head, c // self.n_head).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(b, t, c)))


class MLP(nn.Module):
    def __init__(self, n_embd: int, dropout: float, bias: bool):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, bias=bias)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout, bias)
        self.ln_2 = nn.LayerNorm(n_embd, bias=bias)
        self.mlp = MLP(n_embd, dropout, bias)

    def forward(self, x, mask=None):
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    def __init__(self, vocab: int = 256, max_len: int = 1024, d_model: int = 256, n_layers: int = 4,
                 n_heads: int = 4, dropout: float = 0.0, bias: bool = False):
        super().__init__()
        self.max_len = max_len
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, d_model), wpe=nn.Embedding(max_len, d_model), drop=nn.Dropout(dropout),
            h=nn.ModuleList(Block(d_model, n_heads, dropout, bias) for _ in range(n_layers)),
            ln_f=nn.LayerNorm(d_model, bias=bias)))
        self.lm_head = nn.Linear(d_model, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying (nanoGPT, GPT-2)
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2's scaled init of the residual projections
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)

    def forward(self, input_ids, attention_mask=None):
        """`attention_mask`: None (causal), or `[b, 1, T, T]` bool, True where attending is allowed
        (packed documents kept apart: data/packing.document_mask)."""
        idx, t = input_ids, input_ids.shape[1]
        if t > self.max_len:
            raise ValueError(f"sequence length {t} exceeds the model's max_len {self.max_len}")
        if attention_mask is not None and (attention_mask.ndim != 4 or attention_mask.dtype != torch.bool):
            raise ValueError("nanogpt takes attention_mask as [batch, 1, T, T] bool (True: may attend), got "
                             f"{tuple(attention_mask.shape)} {attention_mask.dtype}")
        pos = torch.arange(t, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x, attention_mask)
        return self.lm_head(self.transformer.ln_f(x))
