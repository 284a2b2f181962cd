"""Language-model versions (docs/updates.md "Language models"): `ecotrain versions add RUN` and
`ecotrain update BASE NEW_DATA` for a causal LM, through the registry, gate and commands of
classifiers (update.py, gate.py, registry.py).

- A version's evaluation slice is up to SLICE_WINDOWS token windows (input ids and per-token
  targets, evenly spaced) of a corpus's validation split (else its test split): `versions add` takes
  the run's own, an update the new corpus's. Its figure is the perplexity (exp of the mean token
  loss of the slice's target tokens; the model on its input ids with its own causal mask).
- NEW_DATA is token data: `tokens:DIR` (`ecotrain tokenize`'s folder, a `.bin` file or a tokenized
  folder given bare), `shards:PATTERN` of `.bin` files, or `text` (overrides such as
  `data.kwargs.offset=5000000` pick another part of the standard library). The window options of the
  base's data (seq_len, stride, attention, mask_boundaries) carry over; overrides apply last.
- Refused in one line before anything trains: a vocabulary other than the base model's, or (both
  sides having a tokenizer file) another tokenizer (`ecotrain tokenize --tokenizer-from` encodes a
  new corpus with the base's), other window lengths.
- replay without `from`: the base version's buffer (its export.safetensors), else `size` windows
  sampled uniformly from the base version's own training data (its config's data, which must still
  be readable); lwf without `teacher`: the base's weights.
- The gate (gate.decide_perplexity) is lower-is-better: the new corpus's slice must fall, the
  holdout's (the old corpora's) perplexity may rise by `--tolerance` at most, relative. The
  version's metrics keep `forgetting_ppl_ratio` (the holdout's average perplexity after / before:
  the old corpus's validation perplexity when there is one holdout slice) and `new_ppl_ratio`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import time
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

from ecotrain.base import safefile
from ecotrain.checkpoint.format import load_state_dict_file
from ecotrain.config import build_config, load_config, merge_trees, parse_overrides
from ecotrain.config.tokens import SIDECAR
from ecotrain.continual.gate import choose_average, decide_perplexity, mean_or_none
from ecotrain.continual.registry import Slice
from ecotrain.continual.versions import Outcome, check_trained, lineage, load_version_model, settler
from ecotrain.data import load_data
from ecotrain.data.tokenizer import tokenizer_text
from ecotrain.base.data_formats import data_format
from ecotrain.base.errors import CheckpointError, ConfigError, DataError, EcotrainError
from ecotrain.base.tensorfile import save_weights
from ecotrain.base.log import log
from ecotrain.methods.adapters import is_adapted, merge
from ecotrain.methods.replay import IGNORE, reservoir_vectorised, token_rows
from ecotrain.core.task import logits_of
from ecotrain.base.tensorfile import cpu_copy
from ecotrain.assembly.trainer import fit
from ecotrain.base.runfiles import EXPORT, MODEL, TOKENIZER

LM_TASK = "language_model"  # meta["task"] of a language model's version
SLICE_WINDOWS = 512  # windows kept per slice, at most: a few hundred thousand tokens at seq_len 512
WINDOW_KEYS = ("seq_len", "stride", "attention", "mask_boundaries")  # token options that carry to new data
FILE_KEYS = ("dtype", "vocab_size", "eod")  # what a bare .bin cannot say of itself
BUFFER_FILE = "base_replay.safetensors"


def is_lm(meta: dict) -> bool:
    return meta.get("task") == LM_TASK


# -- slices and their perplexity -------------------------------------------------------------------
def window_slice(src, name: str, target=None, cap: int = SLICE_WINDOWS) -> Slice:
    """Up to `cap` evenly spaced windows of a token source, as (ids, per-token targets) int64."""
    n = len(src)
    idx = torch.linspace(0, n - 1, min(cap, n)).round().long().unique()
    x, y = token_rows(src.take(idx), target)
    return Slice(name, x.long().contiguous(), y.long().contiguous())


@torch.inference_mode()
def perplexity(model, s: Slice, batch: int = 32) -> float:
    """exp of the mean cross-entropy of the slice's target tokens (IGNORE skipped), in eval mode."""
    was = model.training
    model.eval()
    dev = next(model.parameters()).device
    nats, count = 0.0, 0
    for i in range(0, len(s.x), batch):
        x, y = s.x[i:i + batch].to(dev), s.y[i:i + batch].to(dev)
        logits = logits_of(model(x)).float()
        nats += float(F.cross_entropy(logits.flatten(0, -2), y.reshape(-1), ignore_index=IGNORE, reduction="sum"))
        count += int((y != IGNORE).sum())
    model.train(was)
    if count == 0:
        raise DataError(f"slice '{s.name}': no target token counts (every target is IGNORE); nothing to measure")
    return math.exp(min(nats / count, 700.0))


def lm_metrics(model, slices: list[Slice]) -> dict:
    """{"tasks": {slice: perplexity}, "average_perplexity"}."""
    tasks = {s.name: round(perplexity(model, s), 6) for s in slices}
    return {"tasks": tasks, "average_perplexity": mean_or_none(tasks.values())}


# -- tokenizers ------------------------------------------------------------------------------------
def tokenizer_id(bundle, data_name: str) -> dict:
    """What says which ids the data holds: its vocabulary and a digest of its tokenizer (None: unknown)."""
    vocab = int(bundle.num_classes)
    path = bundle.extra.get("tokenizer")
    if path:
        text = tokenizer_text(path)  # through safefile: a FIFO there is one line, never a wait
        try:
            canonical = json.dumps(json.loads(text), sort_keys=True)
        except (ValueError, RecursionError) as exc:
            raise DataError(f"{path}: not a readable tokenizer file ({exc})") from None
        return {"vocab_size": vocab, "digest": "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:32]}
    if data_name == "text":
        return {"vocab_size": vocab, "digest": "text:bytes"}  # the built-in byte stream (data/text.py)
    return {"vocab_size": vocab, "digest": None}


def check_tokenizer(base: str, base_meta: dict, bundle, data_name: str, base_dir: Path) -> dict:
    """The new data's tokenizer id, after refusing ids another tokenizer made."""
    got = tokenizer_id(bundle, data_name)
    want = base_meta.get("tokenizer") or {}
    fix = ("tokenize the new corpus with the base's tokenizer: ecotrain tokenize CORPUS --out DIR --tokenizer-from "
           f"{base_dir}" if (base_dir / TOKENIZER).is_file() else
           "give data of the base's own kind (text, or files of its tokenizer)")
    if got["vocab_size"] != base_meta["num_classes"]:
        raise DataError(f"NEW_DATA {data_name}: token ids of a vocabulary of {got['vocab_size']:,}, but {base}'s model "
                        f"reads {base_meta['num_classes']:,}: another tokenizer's ids; {fix}")
    if want.get("digest") and got["digest"] and want["digest"] != got["digest"]:
        raise DataError(f"NEW_DATA {data_name}: tokenized with another tokenizer than {base}'s (vocabulary "
                        f"{got['vocab_size']:,} both, other tokens); {fix}")
    if want.get("digest") != got["digest"]:
        log.warning(f"update: {data_name} and {base} do not both name their tokenizer; only the vocabulary size "
                    f"({got['vocab_size']:,}) could be checked")
    return got


# -- versions add RUN ------------------------------------------------------------------------------
def register_lm_run(reg, run: Path, trained, slice_name: Optional[str], data: Optional[str]):
    if data is not None:
        raise ConfigError("versions add --data: a language model's slice is its run's own validation split (the "
                          "corpus it learnt); drop --data")
    bundle, model = trained.bundle, trained.model
    src = bundle.val if bundle.val is not None else bundle.test
    if src is None:
        raise ConfigError(f"{run}: the run has no validation or test split to measure its perplexity on; train it "
                          "with data.val_split > 0")
    recent = window_slice(src, slice_name or "base", trained.config.task.target)
    metrics = lm_metrics(model, [recent])
    cfg = trained.config.to_dict()
    why = f"registered from run {run}"
    meta = {"format": "ecotrain-version/1", "parent": None, "created": _now(), "config": cfg, "task": LM_TASK,
            "input_shape": list(bundle.input_shape), "num_classes": int(bundle.num_classes), "classes_seen": [],
            "weights": "full", "tokenizer": tokenizer_id(bundle, trained.config.data.name),
            "data": {"run": str(run), "dataset_hash": bundle.content_hash}, "learnt_at": dict(metrics["tasks"]),
            "metrics": {**metrics, "gate": {"promote": True, "reason": why}}}
    files = {f: run / f for f in (EXPORT, TOKENIZER) if (run / f).is_file()}
    if any(m.get("name") == "adapters" for m in cfg.get("methods", [])):  # stored plain: adapters folded in
        model = merge(model) if is_adapted(model) else model

    def settle(idx: dict, name: str) -> None:
        if idx["current"] is None:
            reg.make_current(idx, name, why)
        else:
            reg.set_status(idx, name, "candidate", f"{why}; promote it to use it")

    name = reg.commit(cpu_copy(model.state_dict()), meta, files, [recent], settle)
    status = reg.index()["versions"][name]
    return Outcome(name, status["status"] == "promoted", status["reason"], meta)


# -- update BASE NEW_DATA --------------------------------------------------------------------------
def data_name(spec: str) -> str:
    """NEW_DATA as a data.name: text, tokens:PATH or shards:PATTERN as given; a .bin file or a folder
    holding tokens.json as tokens:PATH."""
    if (fmt := data_format(spec)) is not None and fmt.tokens:
        return spec
    p = Path(spec)
    if (p.suffix == ".bin" and p.is_file()) or (p.is_dir() and (p / SIDECAR).is_file()):
        return f"tokens:{spec}"
    raise ConfigError(f"NEW_DATA {spec}: a language model's new data is token data: tokens:DIR (`ecotrain tokenize`'s "
                      "folder), tokens:FILE.bin, shards:PATTERN of .bin files, or text (with overrides such as "
                      "data.kwargs.offset=5000000)")


def _slice_name(name: str, overrides: list[str]) -> str:
    kind, _, path = name.partition(":")
    if kind == "text":
        offset = next((o.split("=", 1)[1] for o in overrides if o.startswith("data.kwargs.offset=")), "0")
        raw = f"text-{offset}"
    else:
        p = Path(path.rstrip("/"))
        raw = p.stem if p.suffix == ".bin" and p.stem not in ("train", "val", "test") else (p.parent.name
                                                                                            if p.suffix else p.name)
        raw = raw if kind == "tokens" else "shards-" + re.sub(r"[*?{}\[\],]", "", raw)
    return re.sub(r"[^\w.+-]", "-", raw)[:64].strip("-.") or "new"


def _bare(name: str) -> bool:
    """A tokens:FILE.bin with no tokens.json beside it (it cannot say its dtype and vocabulary)."""
    kind, _, path = name.partition(":")
    return kind == "tokens" and Path(path).suffix == ".bin" and not (Path(path).parent / SIDECAR).is_file()


def new_data_section(base_data: dict, name: str, vocab: int, seq_len: int) -> dict:
    """The base's data section with `name` for its source: its window options carried over."""
    old_kind = base_data.get("name", "").partition(":")[0]
    kw = dict(base_data.get("kwargs") or {})
    if name == "text":
        kwargs = kw if old_kind == "text" else {"seq_len": seq_len}
    else:
        tokens_before = old_kind in ("tokens", "shards")
        kwargs = {k: v for k, v in kw.items() if k in WINDOW_KEYS} if tokens_before else {"seq_len": seq_len}
        if _bare(name) or name.startswith("shards:"):
            kwargs.update({k: kw[k] for k in FILE_KEYS if k in kw})
            kwargs.setdefault("vocab_size", vocab)
    return {**base_data, "name": name, "kwargs": kwargs}


def lm_training_config(base_meta: dict, base_dir: Path, init_file: Path, buffer_file: Path, name: str,
                       overrides: list[str], recipe: Optional[str]):
    """(config, the replay buffer's size when it must be sampled from the base's data, else None)."""
    if recipe:
        tree = load_config(recipe).to_dict()
    else:
        tree = dict(base_meta["config"])
        tree["methods"] = [{k: v for k, v in m.items() if k not in ("from", "teacher")}
                           for m in tree.get("methods", [])]
    tree["data"] = new_data_section(dict(tree.get("data") or {}), name, base_meta["num_classes"],
                                    base_meta["input_shape"][0])
    tree = merge_trees(tree, parse_overrides(overrides)) if overrides else tree
    methods, sample = [], None
    export = base_dir / EXPORT
    for m in tree.get("methods") or []:
        m = dict(m)
        if m.get("name") == "replay" and not m.get("from"):
            if export.is_file() and _has(export, "replay"):
                m["from"] = str(export)
            else:  # a plain base: its own corpus sampled into a buffer before training
                m["from"], sample = str(buffer_file), True  # its size: the validated config's, below
        elif m.get("name") == "ewc" and not m.get("from"):
            if not (export.is_file() and _has(export, "ewc")):
                raise ConfigError(f"methods.ewc: the base version {base_dir.name} has no Fisher information (its run "
                                  "was not trained with methods.ewc); point `from:` at a run that has one")
            m["from"] = str(export)
        if m.get("name") == "lwf" and not m.get("teacher"):
            m["teacher"] = str(init_file)
        methods.append(m)
    tree["methods"] = methods
    cfg = build_config(tree, "update config" + (" + overrides" if overrides else ""))
    if sample:  # read from the checked config: a size that is not a positive integer was refused there
        sample = next(m.size for m in cfg.methods if m.name == "replay")
    return cfg, sample


def _has(path: Path, key: str) -> bool:
    from safetensors import safe_open

    try:
        with safe_open(str(safefile.regular(path, "safetensors file")), "pt") as f:
            return any(k.startswith(f"{key}/") for k in f.keys())
    except Exception:  # damaged: the method's own reader says so, in one line
        return True


def write_base_buffer(base: str, base_meta: dict, size: int, seed: int, out: Path) -> None:
    """`size` windows sampled uniformly from the base version's training data, as a replay export."""
    try:
        cfg = build_config(base_meta["config"], f"{base}'s config")
        bundle = load_data(cfg)
    except EcotrainError as exc:
        raise ConfigError(f"methods.replay: {base} has no replay buffer and its training data cannot be read to make "
                          f"one ({exc}); give methods.replay.from, or restore that data") from None
    src = bundle.train
    g = torch.Generator().manual_seed(seed * 1_000_003 + 104_729)
    _, picks = reservoir_vectorised(0, 0, len(src), size, g)
    x, y = token_rows(src.take(picks.sort().values), cfg.task.target)
    save_weights(out, {"replay/x": x.long().contiguous(), "replay/y": y.long().contiguous(),
                       "replay/weight": torch.ones(len(x)), "replay/seen": torch.tensor([len(src)])})
    log.info(f"replay: {len(x)} windows of {base}'s training data ({cfg.data.name}) make the buffer")


def update_lm(reg, base: str, base_meta: dict, data, overrides: list[str], opts, preemption=None):
    for flag, given in (("--cohort", opts.cohort), ("--label-map", opts.label_map),
                        ("--drop-contradicted", opts.drop_contradicted or None)):
        if given is not None:
            raise ConfigError(f"update {flag}: a classifier's option; {base} is a language model")
    name = data_name(str(data))
    holdout = [reg.get_slice(sid) for sid in base_meta["slices"]]
    recent_name = opts.slice_name or _slice_name(name, overrides)
    if recent_name in {s.name for s in holdout}:
        raise ConfigError(f"slice '{recent_name}': the base already has a slice of that name; pass --slice NAME")
    work = reg.root / "work" / f"{base}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    init_file, buffer_file = work / "base.safetensors", work / BUFFER_FILE
    cfg, sample = lm_training_config(base_meta, reg.path(base), init_file, buffer_file, name, overrides, opts.recipe)
    bundle = load_data(cfg)  # the new corpus: its vocabulary, tokenizer and validation windows, checked now
    if bundle.extra.get("task") != "lm":
        raise ConfigError(f"NEW_DATA {name}: not token data")
    tok = check_tokenizer(base, base_meta, bundle, name, reg.path(base))
    if list(bundle.input_shape) != list(base_meta["input_shape"]):
        raise ConfigError(f"NEW_DATA {name}: windows of {bundle.input_shape[0]} tokens, but {base} was trained on "
                          f"{base_meta['input_shape'][0]}; keep data.kwargs.seq_len={base_meta['input_shape'][0]}")
    src = bundle.val if bundle.val is not None else bundle.test
    if src is None:
        raise ConfigError(f"NEW_DATA {name}: no validation split to measure the new corpus on; set data.val_split "
                          "(or give a val file)")
    recent = window_slice(src, recent_name, cfg.task.target)
    base_model = load_version_model(reg, base)
    base_m = lm_metrics(base_model, [*holdout, recent])
    work.mkdir(parents=True)
    try:
        save_weights(init_file, base_model)
        if sample is not None:
            write_base_buffer(base, base_meta, sample, cfg.seed, buffer_file)
        try:
            result = fit(cfg, run_dir=work / "run", quiet=opts.quiet, init_from=init_file, preemption=preemption)
        except CheckpointError as exc:  # the base's weights refused by the model the config builds
            prefix = f"{init_file}: weights are for a different model: "
            if not str(exc).startswith(prefix):
                raise
            raise ConfigError(f"update: {'the recipe ' + opts.recipe if opts.recipe else 'the overrides'} make another "
                              f"model than {base}'s ({str(exc)[len(prefix):]}); keep {base}'s model section") from None
        check_trained(result.summary)
        cand, averaged = result.model.eval(), None
        if opts.average:
            cand, averaged = choose_average(base_model, cand, base_m["tasks"], holdout, recent, opts.average,
                                            opts.policy, lambda m, sl: lm_metrics(m, sl)["tasks"], decide_perplexity)
        return _register(reg, base, base_meta, base_m, cand, cfg, result, holdout, recent, opts, tok,
                         {"incoming": name, "dataset_hash": bundle.content_hash}, averaged)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def forgetting_figures(base_m: dict, cand_m: dict, holdout: list[str], recent: str, history: list[dict]) -> dict:
    """forgetting_ppl_ratio (the holdout's average perplexity after / before), new_ppl_ratio (the new
    corpus's), and per old slice its perplexity over the lowest any version of the lineage had."""
    b, c = base_m["tasks"], cand_m["tasks"]
    ratio = round(mean_or_none(c[t] for t in holdout) / mean_or_none(b[t] for t in holdout), 6) if holdout else None
    per = {}
    for t in holdout:
        earlier = [h[t] for h in history if t in h]
        if earlier:
            per[t] = round(c[t] / min(earlier), 6)
    return {"forgetting_ppl_ratio": ratio, "new_ppl_ratio": round(c[recent] / b[recent], 6), "forgetting_ppl": per}


def _register(reg, base, base_meta, base_m, cand, cfg, result, holdout, recent, opts, tok, data, averaged):
    run_dir, summary = result.run_dir, result.summary
    slices = [*holdout, recent]
    cand_m = lm_metrics(cand, slices)
    names = [s.name for s in holdout]
    ok, reason = decide_perplexity(base_m["tasks"], cand_m["tasks"], names, recent.name, opts.policy)
    history = [a["metrics"]["tasks"] for a in lineage(reg, base)]
    metrics = {**cand_m, **forgetting_figures(base_m, cand_m, names, recent.name, history), "base": base_m,
               "gate": {"promote": ok, "reason": reason, "tolerance": opts.policy.tolerance,
                        "min_gain": opts.policy.min_gain, "cap": opts.policy.cap, "lower_is_better": True,
                        "before": base_m["tasks"], "after": cand_m["tasks"]}}
    if averaged is not None:
        metrics["gate"]["average"] = averaged
    adapter = run_dir / "adapter"
    weights_kind = "adapter" if (adapter / "adapter_model.safetensors").is_file() else "full"
    files = {f: run_dir / f for f in (EXPORT, TOKENIZER) if (run_dir / f).is_file()}
    if TOKENIZER not in files and (reg.path(base) / TOKENIZER).is_file():
        files[TOKENIZER] = reg.path(base) / TOKENIZER
    if weights_kind == "adapter":
        files.update({f"adapter/{p.name}": p for p in sorted(adapter.iterdir()) if p.is_file()})
    weights = None if weights_kind == "adapter" else load_state_dict_file(run_dir / MODEL)
    if averaged is not None:
        weights = cpu_copy(cand.state_dict())
    b_old = mean_or_none(base_m["tasks"][t] for t in names) if names else None
    drift = {"alerts": [], "base_perplexity": {"holdout": b_old, "new": base_m["tasks"][recent.name]}}
    meta = {"format": "ecotrain-version/1", "parent": base, "created": _now(), "config": cfg.to_dict(), "task": LM_TASK,
            "input_shape": base_meta["input_shape"], "num_classes": base_meta["num_classes"], "classes_seen": [],
            "weights": weights_kind, "tokenizer": base_meta.get("tokenizer") or tok, "data": data, "metrics": metrics,
            "learnt_at": {**base_meta.get("learnt_at", {}), recent.name: cand_m["tasks"][recent.name]},
            "drift": drift, "run_summary": {k: summary.get(k) for k in ("steps", "epochs", "train_seconds",
                                                                       "stopped_because", "val_perplexity")}}
    verdict = {"ok": ok, "reason": reason}

    settle = settler(reg, base, ok, reason, verdict, hold=opts.hold)
    name = reg.commit(weights, meta, files, slices, settle)
    return Outcome(name, verdict["ok"], verdict["reason"], meta, verdict.get("held", False))


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
