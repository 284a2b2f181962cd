"""The model card: README.md with the YAML front matter Hugging Face's `ModelCard` reads, written from
a finished run (or seed group) alone. `ecotrain card RUN` writes it; `ecotrain export` writes it beside
the exported file.

The metadata carries the task and the test metrics (`model-index`; a seed group: the mean over its
seeds, each seed and the 95% interval under `ecotrain`), and `co2_eq_emissions` from the ledger:
grams CO2e (a group: every seed's, since all were trained to choose one), whether the energy was
measured or estimated and how, the grid, the hardware. The body says how the weights were chosen
(validation only) and what the data was. A language model's card says its perplexity and bits per
byte, the tokens it was trained on, its tokenizer, its context length and its parameters (tied weights
counted once, as model.safetensors stores them). No torch, no huggingface_hub: plain YAML.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Optional

import yaml

from ecotrain.base import safefile
from ecotrain.base.errors import ConfigError, EcotrainError
from ecotrain.export.shipped import Run, Shipped
from ecotrain.base.fsnames import shown
from ecotrain.base.rundir import atomic_write, refuse_overwriting
from ecotrain.base.stats import mean_ci
from ecotrain.base.runfiles import MODEL, TOKENIZER, TOKENIZER_MAX_BYTES

MARK = "<!-- written by `ecotrain card`: the next `ecotrain card` or `ecotrain export` rewrites this file -->"
FINE_TUNING = ("finetune", "adapters", "lwf", "ewc", "replay", "average")  # methods that start from trained weights
_NOT_METRICS = ("test_split",)
RECORD_MAX_BYTES = 16 * safefile.MiB  # export.json, README.md: KiBs when ecotrain wrote them
NOT_FINITE_LEDGER = "not measured (non-finite in the ledger)"
NOT_FINITE_SUMMARY = "not measured (non-finite in the run summary)"


def finite(v) -> Optional[float]:
    """`v` as a float when it is a finite number; None for NaN, an infinity, text, a bool or nothing. A
    card never publishes a figure that is not one."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:  # an int past float's range
        return None
    return f if math.isfinite(f) else None


def not_finite(v) -> bool:
    """A number that is there but is no figure (NaN, an infinity, an int past float's range)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and finite(v) is None


def _finite_only(tree):
    """The front matter with any non-finite float left in it made null (a last guard: YAML would write .nan)."""
    if isinstance(tree, dict):
        return {k: _finite_only(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_finite_only(v) for v in tree]
    if isinstance(tree, float) and not math.isfinite(tree):
        return None
    return tree


def task_name(run: Run) -> str:
    """The task the run trained (config `task.name`; `auto` resolved as fit resolved it, from its figures)."""
    name = (run.config.get("task") or {}).get("name", "auto")
    if name != "auto":
        return name
    if (run.config.get("data") or {}).get("name") == "text" or "test_bits_per_char" in run.summary:
        return "language_model"
    return "classification" if "test_accuracy" in run.summary else "regression"


def test_metrics(shipped: Shipped) -> dict[str, dict]:
    """{metric: {"value": the shipped run's (a group: the seeds' mean), "seeds": {seed: value}, "ci95"}};
    a metric that is non-finite in any seed is left out (`unmeasured_metrics` names it)."""
    runs = shipped.group or [shipped.run]
    keys = [k for k, v in shipped.run.summary.items() if k.startswith("test_") and k not in _NOT_METRICS
            and isinstance(v, (int, float)) and not isinstance(v, bool)]
    out = {}
    for key in keys:
        values = [r.summary.get(key) for r in runs]
        if any(finite(v) is None for v in values):
            continue
        name = key.removeprefix("test_")
        if len(runs) == 1:
            out[name] = {"value": float(values[0])}
            continue
        ci = mean_ci(values)
        if not all(math.isfinite(x) for x in (ci.mean, ci.low, ci.high)):  # figures near float's limit
            continue
        out[name] = {"value": ci.mean, "ci95": [ci.low, ci.high],
                     "seeds": {int(r.seed) if r.seed is not None else i: float(v)
                               for i, (r, v) in enumerate(zip(runs, values))}}
    return out


def unmeasured_metrics(shipped: Shipped) -> list[str]:
    """The test metrics the summary holds as NaN or an infinity (in any seed): said so, never a figure."""
    runs = shipped.group or [shipped.run]
    keys = [k for k, v in shipped.run.summary.items() if k.startswith("test_") and k not in _NOT_METRICS
            and isinstance(v, (int, float)) and not isinstance(v, bool)]
    metrics = test_metrics(shipped)
    return [k.removeprefix("test_") for k in keys if k.removeprefix("test_") not in metrics
            and any(not_finite(r.summary.get(k)) for r in runs)]


def emissions(shipped: Shipped) -> tuple[Optional[dict], str]:
    """(`co2_eq_emissions`, or None with the reason in words) from the ledgers of every run trained."""
    runs = shipped.group or [shipped.run]
    ledgers = [r.ledger for r in runs]
    without = [r for r in runs if r.ledger is None]
    if without:
        return None, f"not recorded: {without[0].ledger_note}"
    missing = [L["co2e"].get("missing_reason") or "no figure" for L in ledgers if L["co2e"].get("kg") is None]
    if missing:
        return None, f"not recorded: {missing[0]}"
    kgs = [L["co2e"]["kg"] for L in ledgers]
    grams = finite(sum(math.inf if finite(kg) is None else finite(kg) for kg in kgs) * 1000.0)  # 1e308 kg: inf grams, no figure
    if grams is None:
        return None, NOT_FINITE_LEDGER
    methods = {L["energy"].get("method") or "estimated" for L in ledgers}
    method = "measured" if methods == {"measured"} else "estimated"
    first = ledgers[0]
    intensity = first["co2e"].get("g_per_kwh")
    intensity = f"{finite(intensity)} g/kWh" if finite(intensity) is not None else (
        NOT_FINITE_LEDGER if not_finite(intensity) else "not recorded")
    source = (f"{method}: ecotrain ledger; energy: {first['energy'].get('source') or 'CodeCarbon'}; grid intensity: "
              f"{intensity}, {first['co2e'].get('source') or 'ledger'}")
    grids = sorted({str(L["co2e"].get("grid") or "unknown") for L in ledgers})
    location = ", ".join("world average grid (ledger.country not set)" if g == "world" else g for g in grids)
    methods_used = {m.get("name") for m in shipped.run.config.get("methods") or [] if isinstance(m, dict)}
    return {"emissions": grams, "source": source,
            "training_type": "fine-tuning" if methods_used & set(FINE_TUNING) else "pre-training",
            "geographical_location": location, "hardware_used": hardware(shipped.run)}, method


def hardware(run: Run) -> str:
    """'1 x NVIDIA H100 80GB HBM3' or 'CPU: AMD EPYC, 2 torch threads', from environment.json and the ledger."""
    hw = run.environment.get("hardware") or {}
    gpus = [g.get("name") if isinstance(g, dict) else str(g) for g in hw.get("gpus") or []]
    device = (run.ledger or {}).get("device") or {}
    if gpus:
        count = device.get("count") or len(gpus)
        return f"{count} x {gpus[0]}"
    threads = hw.get("torch_threads") or device.get("count")
    model = hw.get("cpu_model") or "CPU"
    return f"CPU: {model}" + (f", {threads} torch thread{'s' if threads != 1 else ''}" if threads else "")


def front_matter(shipped: Shipped, metrics: dict, co2: Optional[dict]) -> dict:
    run, cfg = shipped.run, shipped.run.config
    task, data = task_name(run), cfg.get("data") or {}
    n = len(shipped.group)  # a group of one run (listed twice) has no interval
    results = [{"type": k, "value": v["value"],
                "name": f"test {k}" + (f" (mean of {n} seeds, 95% CI {v['ci95'][0]:.4g} to {v['ci95'][1]:.4g})"
                                       if "ci95" in v else "")} for k, v in metrics.items()]
    meta: dict = {"library_name": "pytorch", "tags": ["ecotrain", task, "torch.export"],
                  "model-index": [{"name": run.summary["name"], "results": [{
                      "task": {"type": task, "name": task},
                      "dataset": {"type": str(data.get("name")), "name": _data_name(data), "split": "test"},
                      "metrics": results}]}]}
    if co2 is not None:
        meta["co2_eq_emissions"] = co2
    ours: dict = {"run": shown(str(run.path)), "selected_on": "validation",
                  "test_metrics": metrics}
    if shipped.group:
        ours.update({"group": shown(str(shipped.group_file)), "seeds": [r.seed for r in shipped.group],
                     "chosen_seed": run.seed})
    lm = language_model(run)
    if lm is not None:
        ours["language_model"] = lm
    meta["ecotrain"] = ours
    return _finite_only(meta)


def _data_name(data: dict) -> str:
    path = data.get("path")
    return f"{data.get('name')} ({Path(path).name})" if path else f"{data.get('name')} (ecotrain built-in)"


def body(shipped: Shipped, metrics: dict, co2: Optional[dict], co2_note: str, exports: dict) -> str:
    run, cfg, s = shipped.run, shipped.run.config, shipped.run.summary
    data, model = cfg.get("data") or {}, cfg.get("model") or {}
    seeds = len(shipped.group) > 1
    lines = [MARK, "", f"# {s['name']}", "",
             f"A {task_name(run).replace('_', ' ')} model (`{model.get('name')}`"
             + (f", {json.dumps(model.get('kwargs'))}" if model.get("kwargs") else "")
             + f") trained with ecotrain for {s['steps']} steps.", "",
             "## How the model was chosen", "", _chosen(shipped), "",
             "## Data", "", *_data_lines(data, s), "",
             "## Test results", "", "| metric | value |" + (" 95% interval | seeds |" if seeds else ""),
             "|---|---|" + ("---|---|" if seeds else "")]
    for k, v in metrics.items():
        row = f"| {k} | {v['value']:.4f} |"
        if seeds:
            row += f" {v['ci95'][0]:.4f} to {v['ci95'][1]:.4f} | " + ", ".join(
                f"{seed}: {x:.4f}" for seed, x in v["seeds"].items()) + " |"
        lines.append(row)
    for k in unmeasured_metrics(shipped):
        lines.append(f"| {k} | {NOT_FINITE_SUMMARY} |" + (" | |" if seeds else ""))
    lines += ["", "## Training cost", ""]
    if co2 is None:
        lines.append(f"CO2e: {co2_note}.")
    else:
        lines += [f"- CO2e: {co2['emissions']:.4g} g ({co2['source']})",
                  f"- grid: {co2['geographical_location']}; hardware: {co2['hardware_used']}",
                  f"- training type: {co2['training_type']}"]
        if seeds:
            lines.append(f"- every one of the {len(shipped.group)} seeds is counted: all were trained to choose one")
    ledger = run.ledger or {}
    if ledger:
        def said(v, fmt: str, unit: str, name: str) -> str:
            return f"{format(finite(v), fmt)} {unit}" if finite(v) is not None else f"{name} {NOT_FINITE_LEDGER}"
        energy = (ledger.get("energy") or {}).get("kwh")
        lines.append(f"- this run: {said(ledger.get('wall_seconds') or 0, '.1f', 's wall', 'wall time')}, "
                     + (f"{said(energy, '.3g', 'kWh', 'energy')}, " if energy is not None else "")
                     + f"{said((ledger.get('flops') or {}).get('total') or 0, '.3g', 'FLOPs', 'FLOPs')} "
                     f"(`ecotrain ledger {run.path}`)")
    lm = language_model(run)
    if lm is not None:
        lines += ["", "## Language model", "", *_lm_lines(lm)]
    lines += ["", *_export_lines(exports, lm is not None)]
    return "\n".join(lines) + "\n"


def _chosen(shipped: Shipped) -> str:
    run, s = shipped.run, shipped.run.summary
    es = run.config.get("early_stopping") or {}
    restored = s.get("best_step") is not None and (es.get("restore_best", True) or not es.get("enabled"))
    best = s.get("best_val_metric")
    shown_best = format(finite(best), ".6g") if finite(best) is not None else NOT_FINITE_SUMMARY
    how = (f"The weights are those of the best validation `{s['monitor']}` ({shown_best}, step "
           f"{s['best_step']})" if restored and best is not None
           else "The weights are the last evaluated ones (no best validation figure was kept)")
    text = how + ". The test split was evaluated once, at the end, and played no part in any choice."
    if shipped.group:
        text += (f" Seeds {', '.join(str(r.seed) for r in shipped.group)} were trained with one recipe; the one "
                 f"shipped is {shipped.chosen_because}. The test figures are every seed's, with their mean and "
                 "95% t-interval.")
    if shipped.repeated:
        text += " " + repeated_note(shipped) + "."
    return text


def repeated_note(shipped: Shipped) -> str:
    """The runs a group file lists more than once: one seed each, said so."""
    return (f"{', '.join(shipped.repeated)} listed more than once in {shipped.group_file}: counted once "
            f"({len(shipped.group)} distinct run{'s' if len(shipped.group) != 1 else ''})")


def _data_lines(data: dict, s: dict) -> list[str]:
    out = [f"- source: `{data.get('name')}`" + (f", file `{data['path']}`" if data.get("path") else "")
           + (f", options {json.dumps(data['kwargs'])}" if data.get("kwargs") else "")]
    out.append(f"- splits: validation {data.get('val_split')}, test {data.get('test_split')} of the data "
               "(fixed by the run's seed)")
    out.append(f"- content hash of every split: `{s.get('dataset_hash')}`")
    if (s.get("inputs") or {}).get("columns"):
        out.append(f"- input columns, by name: {', '.join(s['inputs']['columns'])}")
    return out


def _export_lines(exports: dict, lm: bool = False) -> list[str]:
    run_it = ("`ecotrain predict MODEL.pt2 --prompt \"def main(\" --max-new-tokens 50` continues a prompt (the "
              "tokenizer travels inside the file)" if lm else "`ecotrain predict MODEL.pt2 --data FILE.npz --out "
              "preds.csv` runs it")
    if not exports:
        return ["## Use", "", "`ecotrain export RUN --format pt2|onnx` writes a program that loads without the "
                f"model's class; {run_it}."]
    lines = ["## Exported files", "", "| file | format | max abs difference vs eager (test split) |", "|---|---|---|"]
    for name, r in sorted(exports.items()):
        diff = finite(r.get("max_abs_diff"))
        lines.append(f"| `{name}` | {r.get('format')} | "
                     + (f"{diff:.3g} |" if diff is not None else "not measured |"))
    lines += ["", "```python", "from ecotrain.base.safeload import load_pt2  # checks the archive: nothing in it is unpickled "
              "or evaluated", "", f"program, _ = load_pt2(\"{_first(exports, 'pt2')}\")", "model = program.module()"
              "  # no model class needed", "logits = model(input_ids)  # [batch, tokens, vocabulary]" if lm
              else "logits = model(x)", "```", "",
              "(plain `torch.export.load` unpickles what the archive says: only for a file you made yourself)", "",
              f"or {run_it}."]
    return lines


def _first(exports: dict, fmt: str) -> str:
    return next((n for n, r in sorted(exports.items()) if r.get("format") == fmt), "model.pt2")


def card_text(shipped: Shipped, exports: Optional[dict] = None) -> str:
    metrics = test_metrics(shipped)
    co2, note = emissions(shipped)
    meta = front_matter(shipped, metrics, co2)
    head = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True)
    return f"---\n{head}---\n\n{body(shipped, metrics, co2, note, exports or {})}"


def read_exports(folder: Path) -> dict:
    """The export records of a folder's export.json ({file name: record}), or {}."""
    try:
        data = safefile.read_json(folder / "export.json", "export record", RECORD_MAX_BYTES)
    except (OSError, ValueError, EcotrainError):
        return {}
    files = data.get("files") if isinstance(data, dict) else None
    return {k: v for k, v in files.items() if isinstance(v, dict)} if isinstance(files, dict) else {}


def ours(path: Path) -> bool:
    """Whether README.md at `path` is absent or one this module wrote (a user's own is never replaced)."""
    try:
        if not path.exists():
            return True
        return MARK in safefile.read_bytes(path, "model card", RECORD_MAX_BYTES).decode("utf-8", errors="replace")
    except (OSError, ValueError, EcotrainError):  # a FIFO, a folder, a huge file: not one this module wrote
        return False


def write_card(shipped: Shipped, out: Path) -> Path:
    out = Path(out)
    if out.is_dir() or not out.parent.is_dir():
        raise ConfigError(f"--out {out}: give a file path in a folder that exists")
    refuse_overwriting(out, "--out")
    if not ours(out):
        raise ConfigError(f"--out {out}: exists and was not written by ecotrain; choose another --out "
                          "(a README.md of your own is never replaced)")
    # a run folder's name need not be UTF-8 (a surrogate would not encode): its bytes are written \xNN
    atomic_write(out, shown(card_text(shipped, read_exports(out.parent))).encode())
    return out


# -- a language model ---------------------------------------------------------------------------
def language_model(run: Run) -> Optional[dict]:
    """A language model's figures for its card (None for other tasks): test (else validation) perplexity
    and bits per byte (bits per token when the data does not say its bytes), tokens trained on, the
    tokenizer, the context length and the parameters."""
    if task_name(run) != "language_model":
        return None
    s = run.summary
    split = "test" if isinstance(s.get("test_perplexity"), (int, float)) else "val"
    params, tied, rows = weights_summary(run.path / MODEL)
    kwargs = (run.config.get("model") or {}).get("kwargs") or {}
    data_kwargs = (run.config.get("data") or {}).get("kwargs") or {}
    context = kwargs.get("max_len") or rows or data_kwargs.get("seq_len")
    raw = {"perplexity": s.get(f"{split}_perplexity"), "bits_per_byte": s.get(f"{split}_bits_per_byte"),
           "bits_per_token": s.get(f"{split}_bits_per_char"), "tokens_seen": s.get("tokens_seen")}
    out = {"split": split, **{k: finite(v) for k, v in raw.items()},
           "tokenizer": tokenizer_name(run), "context_length": context if isinstance(context, int) else None,
           "parameters": params, "tied": tied}
    unmeasured = [k for k, v in raw.items() if not_finite(v)]
    if unmeasured:
        out["not_finite"] = unmeasured  # said "not measured" on the card, never a figure
    return out


def weights_summary(path: Path) -> tuple[Optional[int], dict, Optional[int]]:
    """(parameters, {tied name: the name stored}, rows of a learned position table) from a safetensors
    header: each stored tensor counted once, so a tied head and embedding count once."""
    try:
        with safefile.open_regular(path, "model weights") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size)) if size <= 1 << 27 else None
    except (OSError, ValueError, RecursionError, struct.error, EcotrainError):
        return None, {}, None
    if not isinstance(header, dict):
        return None, {}, None
    meta = header.pop("__metadata__", None) or {}
    shapes = [v.get("shape") for v in header.values() if isinstance(v, dict)]
    if not all(isinstance(sh, list) and all(isinstance(d, int) for d in sh) for sh in shapes):
        return None, {}, None
    try:
        tied = json.loads(meta.get("ecotrain.aliases") or "{}")
    except (ValueError, AttributeError, RecursionError):
        tied = {}
    # a tie names a tensor the file holds, under a name it does not (one stored twice is no tie)
    tied = {a: b for a, b in tied.items() if isinstance(a, str) and isinstance(b, str) and a not in header
            and isinstance(header.get(b), dict)} if isinstance(tied, dict) else {}
    positions = [v["shape"][0] for k, v in header.items() if k.endswith("wpe.weight") and len(v["shape"]) == 2]
    return sum(math.prod(sh) for sh in shapes), tied, \
        (positions[0] if positions else None)


def tokenizer_name(run: Run) -> str:
    """The tokenizer in words: RUN/tokenizer.json's kind and size, bytes for the built-in text source."""
    try:  # through safefile: a FIFO put there must not hang the card
        tok = safefile.read_json(run.path / TOKENIZER, "tokenizer file", TOKENIZER_MAX_BYTES)
    except FileNotFoundError:
        if (run.config.get("data") or {}).get("name") == "text":
            return "bytes: the 256 byte values (the built-in text source)"
        return "not recorded (the run's data came without tokenizer.json)"
    except (OSError, ValueError, EcotrainError):
        return "tokenizer.json is unreadable"
    if not isinstance(tok, dict):
        return "tokenizer.json is not a tokenizer"
    if tok.get("ecotrain_tokenizer") == "bytes":
        return "bytes: the 256 byte values and end of document (257 ids; tokenizer.json)"
    model = tok.get("model") if isinstance(tok.get("model"), dict) else {}
    vocab = model.get("vocab") if isinstance(model.get("vocab"), dict) else {}
    added = [t for t in tok.get("added_tokens") or [] if isinstance(t, dict) and t.get("content") not in vocab]
    byte_level = "ByteLevel" in json.dumps(tok.get("pre_tokenizer"))
    return (f"{'byte-level ' if byte_level else ''}{model.get('type') or 'unknown'} of {len(vocab) + len(added):,} ids "
            "(tokenizers library; tokenizer.json)")


def _lm_lines(lm: dict) -> list[str]:
    def fig(v, f, key=""):
        if key in lm.get("not_finite", ()):
            return NOT_FINITE_SUMMARY
        return format(v, f) if isinstance(v, (int, float)) and finite(v) is not None else "not recorded"
    tied = lm["tied"]
    params = fig(lm["parameters"], ",")
    if tied:
        params += " (tied: " + ", ".join(f"`{a}` is `{b}`" for a, b in sorted(tied.items())) + ", counted once)"
    return [f"- {lm['split']} perplexity: {fig(lm['perplexity'], '.4g', 'perplexity')}; bits per byte: "
            f"{fig(lm['bits_per_byte'], '.4g', 'bits_per_byte')}" + (
                "" if lm["bits_per_byte"] is not None else
                f" (bits per token: {fig(lm['bits_per_token'], '.4g', 'bits_per_token')})"),
            f"- tokens trained on: {fig(lm['tokens_seen'], ',.0f', 'tokens_seen')}",
            f"- tokenizer: {lm['tokenizer']}",
            f"- context length: {fig(lm['context_length'], ',')} tokens",
            f"- parameters: {params}"]
