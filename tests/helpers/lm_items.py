"""Test-only token Datasets of any item structure for recipes (`data.name: tests.helpers.lm_items:...`),
and a tiny causal model that takes them (`model.name: tests.helpers.lm_items:TinyLM`)."""

import torch
from torch import nn


class TokenDicts(torch.utils.data.Dataset):
    """Items `{input_ids, labels, attention_mask}` of `seq_len` tokens, labels shifted by one; the last
    label is -100 (no next token)."""

    vocab_size = 32

    def __init__(self, n: int = 64, seq_len: int = 12, bad: str = ""):
        g = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(0, self.vocab_size, (n, seq_len + 1), generator=g)
        self.bad = bad

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, i):
        w = self.tokens[i]
        item = {"input_ids": w[:-1], "labels": w[1:].clone(), "attention_mask": torch.ones(len(w) - 1, dtype=torch.long)}
        if self.bad == "shape" and i == 4:
            item["input_ids"] = w
        if self.bad == "label" and i == 0:
            item["labels"][3] = -7
        if self.bad == "vocab" and i == 0:
            item["labels"][2] = self.vocab_size
        if self.bad == "nan" and i == 0:
            item["weights"] = torch.tensor([float("nan")])
        return item


class TokenPairs(TokenDicts):
    """Items `(input_ids, per-token targets)`."""

    def __getitem__(self, i):
        d = super().__getitem__(i)
        return d["input_ids"], d["labels"]


class TinyLM(nn.Module):
    """Embedding, one GRU, a head: `forward(input_ids, attention_mask=None) -> logits [b, T, vocab]`."""

    def __init__(self, vocab: int = 32, width: int = 16):
        super().__init__()
        self.emb, self.rnn, self.head = nn.Embedding(vocab, width), nn.GRU(width, width, batch_first=True), nn.Linear(width, vocab)

    def forward(self, input_ids, attention_mask=None):
        h, _ = self.rnn(self.emb(input_ids))
        return self.head(h)


class UnsizedDicts(TokenDicts):
    """TokenDicts that does not say its vocabulary: the user's model (TinyLM) sizes itself."""

    def __getattribute__(self, name):
        if name == "vocab_size" and not object.__getattribute__(self, "__dict__").get("_building", False):
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    def __init__(self, n: int = 64, seq_len: int = 12):
        self._building = True
        super().__init__(n, seq_len)
        self._building = False
