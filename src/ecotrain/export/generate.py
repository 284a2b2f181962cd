"""`ecotrain predict` of a language model: prompts continued, from a run or checkpoint folder (the eager
model) or from its export (`.pt2`, `.onnx`: the program alone, with the tokenizer it carries).

    ecotrain predict RUN|MODEL.pt2|MODEL.onnx --prompt TEXT [--prompt TEXT ...] | --prompts FILE
        [--max-new-tokens N] [--sample --temperature T --top-k K --seed S] [--format text|jsonl] [--out F]

Prompts: `--prompt` (repeatable) and/or `--prompts FILE` (UTF-8, one prompt per line), tokenized with
the run's own tokenizer (RUN/tokenizer.json; byte-level for the built-in `text` source; the one inside
an exported file; `--tokenizer FILE` for a run whose data came without one). Each prompt is continued
on its own: its text depends on its own tokens and the seed only, never on the other prompts.

Decoding: greedy (the most likely token, the first of a tie) by default; `--sample` draws from the
softmax of logits / T, kept to the K most likely when --top-k is given, with a generator seeded by
--seed (default 0) and the prompt's tokens, afresh for each prompt: the same seed gives the same text. An eager
transformers model (`model.name: causal_lm`) keeps transformers' own KV cache: the prompt is one
forward pass, then each new token one pass over that token alone; other models (nanoGPT, charlm, an
exported program) run one pass over the window per token. The two give the same tokens (greedy: the
same text; tests/unit/test_generate_cache.py). A prompt must fit the model's context (its `max_len`);
when prompt and continuation outgrow it, the window slides (the oldest tokens are dropped, as
nanoGPT's sample.py does) and the record says how many were dropped. Generation stops after N new
tokens or at the tokenizer's end-of-document token, when the model's vocabulary has it.

Out: text (each prompt and its continuation, then a blank line) or JSON lines (`--format jsonl`: the
prompt, the completion, token counts, why it stopped, the decoding), on stdout or atomically to --out.
Every bad input is one line, exit 2, before the model runs.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from ecotrain.base import safefile
from ecotrain.base.objects import describe
from ecotrain.base.errors import ConfigError, DataError, EcotrainError
from ecotrain.export.lm import carried_tokenizer, run_tokenizer
from ecotrain.export.predict import is_exported, load_exported
from ecotrain.base.fsnames import shown
from ecotrain.export.inference import load_trained
from ecotrain.export.program import context_length
from ecotrain.base.log import log
from ecotrain.base.rundir import atomic_write, refuse_overwriting
from ecotrain.base.userpath import user_path

MAX_NEW_TOKENS = 100_000  # past the context each token is a pass over the window: beyond this, call again
DEFAULT_NEW_TOKENS = 100
MAX_SEED = 2**63 - 1
FORMATS = ("text", "jsonl")


@dataclass
class Decoding:
    """How each next token is chosen; checked by `decoding_from`."""

    max_new_tokens: int = DEFAULT_NEW_TOKENS
    sample: bool = False
    temperature: float = 1.0
    top_k: Optional[int] = None
    seed: int = 0

    def describe(self) -> dict:
        if not self.sample:
            return {"decoding": "greedy"}
        return {"decoding": "sample", "temperature": self.temperature, "top_k": self.top_k, "seed": self.seed}


@dataclass
class LanguageModel:
    """A callable from token ids `[1, T]` to logits `[1, T, vocab]`, with what predict needs to use it."""

    fn: Callable
    context: int  # the most tokens it takes at once
    vocab: Optional[int]  # ids it knows (None: not said; the logits say it)
    tokenizer: object
    where: str
    cached: Optional[Callable] = None  # an eager transformers model: `hf(input_ids, cache, use_cache)`


def decoding_from(args) -> Decoding:
    """The decoding flags, each checked: one line naming the flag."""
    n = DEFAULT_NEW_TOKENS if args.max_new_tokens is None else args.max_new_tokens
    if not 1 <= n <= MAX_NEW_TOKENS:
        raise ConfigError(f"--max-new-tokens {n}: give 1 to {MAX_NEW_TOKENS:,} new tokens (a longer continuation: "
                          "predict again with its end as the prompt)")
    if not args.sample:
        given = [f for f, v in (("--temperature", args.temperature), ("--top-k", args.top_k), ("--seed", args.seed))
                 if v is not None]
        if given:
            raise ConfigError(f"{given[0]}: only with --sample (greedy decoding takes the most likely token)")
        return Decoding(n)
    t = 1.0 if args.temperature is None else args.temperature
    if not (math.isfinite(t) and t > 0):
        raise ConfigError(f"--temperature {t}: a finite number above 0 (1 samples the model's own distribution; "
                          "greedy: leave out --sample)")
    if args.top_k is not None and args.top_k < 1:
        raise ConfigError(f"--top-k {args.top_k}: 1 or more (the most likely tokens kept)")
    seed = 0 if args.seed is None else args.seed
    if not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"--seed {seed}: a whole number from 0 to 2**63-1")
    return Decoding(n, True, float(t), args.top_k, seed)


PROMPTS_MAX_BYTES = 64 * safefile.MiB  # --prompts FILE: text to continue, not a corpus


def read_prompts(given: Optional[list], file: Optional[str]) -> list[tuple[str, str]]:
    """--prompt texts, then the lines of --prompts FILE; each UTF-8 and not empty."""
    prompts = []
    for i, p in enumerate(given or [], 1):
        try:
            p.encode("utf-8")
        except UnicodeEncodeError as exc:  # argv bytes that are not UTF-8 arrive as lone surrogates
            raise DataError(f"--prompt {i}: not UTF-8 text (byte 0x{ord(p[exc.start]) & 0xFF:02x} at character "
                            f"{exc.start}); give the prompt as UTF-8") from None
        prompts.append((f"--prompt {i}", p))
    if file is not None:
        path = user_path(file, "--prompts", "give a UTF-8 text file, one prompt per line", error=DataError)
        raw = safefile.read_bytes(path, "prompts file", PROMPTS_MAX_BYTES, fix="give a UTF-8 text file, one prompt "
                                  "per line", error=DataError).removeprefix(b"\xef\xbb\xbf")  # a BOM is no prompt text
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = raw[:exc.start].count(b"\n") + 1
            raise DataError(f"--prompts {shown(str(path))}: line {line} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at byte "
                            f"{exc.start}); save the file as UTF-8") from None
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()  # the file's final newline ends the last prompt
        prompts += [(f"--prompts {shown(str(path))} line {i}", line.removesuffix("\r")) for i, line in enumerate(lines, 1)]
    if not prompts:
        raise ConfigError("predict: a language model continues prompts; give --prompt TEXT or --prompts FILE "
                          "(one prompt per line)")
    empty = next((where for where, p in prompts if p == ""), None)
    if empty is not None:
        raise DataError(f"{empty}: an empty prompt; a continuation needs at least one token to start from")
    return prompts


def encode(lm: LanguageModel, where: str, text: str) -> list[int]:
    ids = lm.tokenizer.encode(text)
    if not ids:
        raise DataError(f"{where}: the tokenizer makes no token of it; give a prompt with text")
    if len(ids) > lm.context:
        raise DataError(f"{where}: {len(ids):,} tokens, more than the model's context of {lm.context:,}; shorten "
                        "the prompt (its continuation slides the window, the prompt itself must fit)")
    if lm.vocab is not None and max(ids) >= lm.vocab:
        raise DataError(f"{where}: token id {max(ids)} is outside the model's vocabulary of {lm.vocab:,}; the "
                        "tokenizer is not the model's (--tokenizer: the one its data was tokenized with)")
    return ids


def _checked(lm: LanguageModel, call: Callable, n: int) -> tuple[torch.Tensor, object]:
    """The last position's logits (float64) of `call()` and what else it returned (a KV cache)."""
    try:
        out = call()
    except EcotrainError:
        raise
    except Exception as exc:  # an exported program's guard, onnxruntime's refusal
        raise DataError(f"predict: {lm.where} refused {n} token ids ({describe(exc)})") from None
    past = getattr(out, "cache", None)  # transformers >= 5; `past_key_values` before
    past = getattr(out, "past_key_values", None) if past is None else past
    out = out[0] if isinstance(out, (tuple, list)) else getattr(out, "logits", out)
    if not isinstance(out, torch.Tensor) or out.dim() != 3:
        raise ConfigError(f"predict: {lm.where} returns {tuple(getattr(out, 'shape', ()))}, not logits "
                          "[batch, tokens, vocabulary]")
    logits = out[0, -1].double()
    if not bool(torch.isfinite(logits).all()):
        raise EcotrainError(f"predict: {lm.where} returns NaN/Inf logits after {n} tokens; the weights "
                            "are damaged or diverged (ecotrain eval shows the test loss)")
    return logits, past


def next_logits(lm: LanguageModel, window: list[int]) -> torch.Tensor:
    return _checked(lm, lambda: lm.fn(torch.tensor([window], dtype=torch.long)), len(window))[0]


class Stepper:
    """Next-token logits for a growing sequence. With `lm.cached` (an eager transformers model) the KV
    cache carries the past: the prompt is one pass, each new token a pass over itself. Once the
    sequence outgrows the context the window slides, every position moves, and each step is a pass
    over the window again (as without a cache)."""

    def __init__(self, lm: LanguageModel, use_cache: bool = True):
        self.lm, self.past, self.fed = lm, None, 0
        self.use_cache = use_cache and lm.cached is not None
        if self.use_cache:  # the cache's keyword: `cache` (transformers >= 5), `past_key_values` before it
            params = inspect.signature(lm.cached.forward).parameters
            self.key = "cache" if "cache" in params else "past_key_values"

    def __call__(self, seq: list[int]) -> torch.Tensor:
        lm = self.lm
        if not self.use_cache or len(seq) > lm.context:
            self.past = None
            return next_logits(lm, seq[-lm.context:])
        if self.past is not None and self.fed == len(seq) - 1:
            new = torch.tensor([seq[-1:]], dtype=torch.long)
            logits, self.past = _checked(lm, lambda: lm.cached(input_ids=new, use_cache=True,
                                                               **{self.key: self.past}), len(seq))
        else:
            ids = torch.tensor([seq], dtype=torch.long)
            logits, self.past = _checked(lm, lambda: lm.cached(input_ids=ids, use_cache=True), len(seq))
        self.fed = len(seq)
        return logits


def choose(logits: torch.Tensor, how: Decoding, gen: Optional[torch.Generator]) -> int:
    if not how.sample:
        return int(torch.argmax(logits))  # the first of a tie
    logits = (logits - logits.max()) / how.temperature  # the max first: a tiny T (5e-324) gives 0 and -inf, not NaN
    if how.top_k is not None and how.top_k < logits.numel():
        kth = torch.topk(logits, how.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))


def prompt_seed(seed: int, ids: list[int]) -> int:
    """The generator's seed for one prompt: --seed and the prompt's tokens (not its place among the
    prompts), so one prompt's text never depends on the others and two prompts do not share draws."""
    digest = hashlib.sha256(json.dumps([seed, ids]).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # below 2**63: manual_seed's range


@torch.inference_mode()
def continue_prompt(lm: LanguageModel, ids: list[int], how: Decoding, use_cache: bool = True) -> dict:
    """The new ids, why generation stopped, and how many old tokens the sliding window dropped."""
    gen = torch.Generator().manual_seed(prompt_seed(how.seed, ids)) if how.sample else None
    step = Stepper(lm, use_cache)
    seq, new = list(ids), []
    eod = getattr(lm.tokenizer, "eod", None)
    eod = eod if eod is not None and (lm.vocab is None or eod < lm.vocab) else None
    stopped = "max_new_tokens"
    for _ in range(how.max_new_tokens):
        token = choose(step(seq), how, gen)
        seq.append(token)
        new.append(token)
        if token == eod:
            stopped = "end_of_document"
            break
    return {"ids": new, "stopped": stopped, "dropped": max(0, len(seq) - 1 - lm.context)}


def from_run(target: str, tokenizer: Optional[str]) -> LanguageModel:
    """The eager model of a run or checkpoint folder that trained a language model."""
    trained = load_trained(target, device="cpu")
    if not trained.is_lm:
        raise ConfigError(f"predict --prompt: {target} is not a language model; a classifier's predictions take "
                          "--data FILE --out CSV")
    tok, _ = run_tokenizer(trained.out_dir, trained.config.data.name, tokenizer)
    if tok is None:
        raise ConfigError(f"predict: {target} has no tokenizer (its data, {trained.config.data.name}, came without "
                          "tokenizer.json); give --tokenizer FILE, the tokenizer.json its tokens were made with")
    context = context_length(trained.model) or int(trained.bundle.input_shape[0])
    hf = getattr(trained.model, "hf", None)  # models/causal_lm.py: transformers' model, which keeps a KV cache
    cached = hf if hf is not None and callable(getattr(hf, "prepare_inputs_for_generation", None)) else None
    return LanguageModel(trained.model, context, trained.bundle.num_classes, tok, str(target), cached)


def from_export(path: Path, fn, meta: dict, extra: dict, tokenizer: Optional[str]) -> LanguageModel:
    """An exported language model: its program, the context its input spec allows, the tokenizer inside."""
    spec = (meta.get("inputs") or [{}])[0].get("shape") or []
    seq = spec[1] if len(spec) > 1 else None
    context = seq.get("max") if isinstance(seq, dict) else seq
    context = context or meta.get("context_length")
    if not isinstance(context, int) or isinstance(context, bool) or context < 1:
        raise DataError(f"predict: {path} does not say its context length (its ecotrain.json's input spec); "
                        "re-export the run with `ecotrain export`")
    tok = carried_tokenizer(extra, path, tokenizer)
    if tok is None:
        raise ConfigError(f"predict: {path} carries no tokenizer (its run's data came without one); give "
                          "--tokenizer FILE, the tokenizer.json its tokens were made with")
    return LanguageModel(fn, context, meta.get("num_classes"), tok, str(path))


def generate(lm: LanguageModel, prompts: list[tuple[str, str]], how: Decoding) -> list[dict]:
    encoded = [(where, text, encode(lm, where, text)) for where, text in prompts]  # every prompt checked first
    records = []
    for i, (where, text, ids) in enumerate(encoded):
        got = continue_prompt(lm, ids, how)
        if got["dropped"]:
            log.info(f"{where}: the context ({lm.context} tokens) filled; the window slid, dropping the "
                     f"{got['dropped']} oldest token{'s' if got['dropped'] != 1 else ''}")
        records.append({"index": i, "prompt": text, "completion": lm.tokenizer.decode(got["ids"]),
                        "prompt_tokens": len(ids), "new_tokens": len(got["ids"]), "stopped": got["stopped"],
                        "window_dropped": got["dropped"], "ids": got["ids"], **how.describe()})
    return records


def render(records: list[dict], fmt: str) -> str:
    if fmt == "jsonl":
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    return "\n".join(r["prompt"] + r["completion"] + "\n" for r in records)


def output_path(out: Optional[str], reads: list) -> Optional[Path]:
    if out is None:
        return None
    path = Path(out)
    if path.is_dir() or not path.parent.is_dir():
        raise ConfigError(f"--out {path}: give a file path in a folder that exists")
    refuse_overwriting(path, "--out", reads)
    return path


def load_model(target: str, tokenizer: Optional[str]) -> LanguageModel:
    """A run or checkpoint folder's eager model, or an exported file's program."""
    if not is_exported(target):
        return from_run(target, tokenizer)
    path, extra = Path(target), {}
    fn, meta = load_exported(path, extra)
    if meta.get("task") != "language_model":
        raise ConfigError(f"predict --prompt: {path} is not a language model (its task: {meta.get('task')}); a "
                          "classifier's predictions take --data FILE --out CSV")
    return from_export(path, fn, meta, extra, tokenizer)


def cmd_continue(args, ctx) -> int:
    """`ecotrain predict TARGET --prompt ...` (cli/commands/predict.py hands prompts here); every flag and
    prompt is checked before the model is loaded."""
    if args.data:
        raise ConfigError("--data: a language model continues --prompt TEXT or --prompts FILE, not a data file")
    for flag in ("split", "registry", "cohort", "domain"):
        if getattr(args, flag, None) is not None:
            raise ConfigError(f"--{flag}: not with --prompt (a language model's prompts are continued as given)")
    fmt = args.format or "text"
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt}: one of {', '.join(FORMATS)}")
    how = decoding_from(args)
    prompts = read_prompts(args.prompt, args.prompts)
    out = output_path(args.out, [p for p in (args.prompts, args.target) if p])
    records = generate(load_model(args.target, args.tokenizer), prompts, how)
    text = render(records, fmt)
    if out is None:
        print(text, end="")
        return 0
    try:
        atomic_write(out, text.encode("utf-8", errors="surrogateescape"))
    except OSError as exc:
        raise ConfigError(f"{out}: cannot write ({exc.strerror or exc}); choose another --out") from None
    ctx.committed()
    print(f"wrote {len(records)} continuation{'s' if len(records) != 1 else ''} to {out}")
    return 0
