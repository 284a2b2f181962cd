"""Typed options of token data: `data.kwargs` of `data.name: tokens:PATH` (data/tokens.py) and the
sidecar `tokens.json` that `ecotrain tokenize` writes beside its `.bin` files.

Both are read with `parse`, so a wrong key or value is one line naming it (`data.kwargs.seq_len: ...`),
never a pydantic report."""

from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import Field, ValidationError

from ecotrain.config.base import Section

MAX_VOCAB = 1 << 32  # uint32 ids: nothing larger fits the files
TOKEN_DTYPES = ("uint16", "uint32")
SIDECAR = "tokens.json"  # beside the .bin files: what they hold
MAX_BYTES_PER_TOKEN = 1 << 20  # bits per byte: the most text one token can stand for


class TokensOptions(Section):
    """`data.kwargs` of `tokens:PATH`."""

    seq_len: int = Field(256, ge=1, le=1 << 20)  # a window is seq_len + 1 tokens: input, target shifted by one
    stride: Optional[int] = Field(None, ge=1)  # tokens between window starts (None: seq_len, no token trained twice)
    dtype: Optional[Literal["uint16", "uint32"]] = None  # None: from tokens.json
    vocab_size: Optional[int] = Field(None, ge=2, le=MAX_VOCAB)  # None: from tokens.json; every id is checked
    eod: Optional[int] = Field(None, ge=0)  # the end-of-document id (None: tokens.json's, else no documents)
    mask_boundaries: bool = True  # a target that crosses a document boundary is IGNORE (needs eod)
    # document: batches are dicts with a [b, 1, T, T] attention_mask that keeps attention inside each
    # document (Hugging Face GPT-2/Llama/Qwen2 take it); causal: (x, y) pairs, the model's own mask
    attention: Literal["causal", "document"] = "causal"
    val: Optional[str] = None  # a validation token file (None: tokens.json's, else the stream's tail)
    test: Optional[str] = None  # a test token file (None: tokens.json's, else a slice of the stream)
    # UTF-8 bytes of text per token, for bits per byte (None: tokens.json's bytes over its tokens, else no bpb)
    bytes_per_token: Optional[float] = Field(None, gt=0, le=MAX_BYTES_PER_TOKEN)


class TokensMeta(Section):
    """tokens.json: what the `.bin` files beside it hold."""

    format: Literal["ecotrain-tokens"] = "ecotrain-tokens"
    version: Literal[1] = 1
    dtype: Literal["uint16", "uint32"]
    vocab_size: int = Field(ge=2, le=MAX_VOCAB)
    eod: Optional[int] = Field(None, ge=0)
    tokenizer: Optional[str] = None  # the tokenizer file beside it (tokenizer.json)
    files: dict[Literal["train", "val", "test"], str] = Field(default_factory=dict)
    tokens: dict[Literal["train", "val", "test"], Annotated[int, Field(ge=0)]] = Field(default_factory=dict)
    documents: dict[Literal["train", "val", "test"], Annotated[int, Field(ge=0)]] = Field(default_factory=dict)
    bytes: Optional[int] = Field(None, ge=0)  # UTF-8 bytes of every document tokenized (all splits): bits per byte


def first_error(exc: ValidationError, prefix: str) -> str:
    """A pydantic error as one line: `prefix.key: message (got value)`."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    got = repr(err.get("input"))[:60]
    msg = "not an option" if err["type"] == "extra_forbidden" else err["msg"]
    return f"{prefix}{'.' + loc if loc else ''}: {msg} (got {got})"


def parse(cls, obj, prefix: str, error: type, strict: bool = False):
    """`cls` validated from `obj`, or `error` with one line. `strict`: a file a program wrote (tokens.json),
    whose `"eod": true` or `"vocab_size": "50"` is damage, not a value to coerce."""
    try:
        return cls.model_validate(obj, strict=strict)
    except ValidationError as exc:
        raise error(first_error(exc, prefix)) from None
