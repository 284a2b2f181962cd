"""`ecotrain export RUN --format pt2|onnx [--out PATH]`: the run's weights (a seed group: the seed chosen
on validation) traced, checked on the test split against the eager model, then written with
export.json (the check's figures, one record per exported file) and the model card beside it.

A language model (export/lm.py): the program takes token ids alone, with a dynamic batch and a dynamic
sequence length from 1 token to the model's context; parity is checked on the test split's windows,
then on shorter windows (about half the length, and one token) in batches of another size, and at the
full context on random ids when the data's windows are shorter. The run's tokenizer travels inside the
file (tokenizer.json), so `ecotrain predict MODEL.pt2 --prompt TEXT` needs nothing else.

Order: every check and the whole export happen in memory first; the files are written (atomically)
only after the parity check passed, so a refused export leaves nothing behind.

BatchNorm per-domain statistics (`methods: [{name: batchnorm, policy: domain}]`): one export per
domain. The program holds one set of statistics as constants, the run's own domain's by default (what
model.safetensors holds), `--domain KEY` another's (model-KEY.pt2).
"""

from __future__ import annotations

from pathlib import Path

NAME = "export"
HELP = ("trace a run's weights with torch.export (.pt2) or to ONNX, check it against the eager model "
        "on the test split (export.json) and write the model card (docs/export.md)")
TRAINS = False
EXPORT_JSON = "export.json"


def arguments(ex) -> None:
    ex.add_argument("run", metavar="RUN", help="a run folder, or a seed group's RUN-group.json (the seed with the best "
                    "validation figure ships)")
    ex.add_argument("--format", choices=["pt2", "onnx"], default="pt2", help="pt2: torch.export.save (default); "
                    "onnx: torch.onnx.export(dynamo=True), needs the onnx extra")
    ex.add_argument("--out", help="the exported file (default RUN/model.pt2 or RUN/model.onnx); export.json and "
                    "README.md go beside it")
    ex.add_argument("--tolerance", type=float, default=1e-4, help="largest output difference vs eager, relative to "
                    "the largest eager output (at least 1); above it: exit 1, nothing written (default 1e-4)")
    ex.add_argument("--domain", help="a model trained with batchnorm policy domain: that domain's statistics in the "
                    "program (one export per domain; default the run's own)")
    ex.add_argument("--no-card", action="store_true", help="do not write README.md beside the export")


def output_path(out, fmt: str, run: Path, domain) -> Path:
    """--out, or RUN/model[-DOMAIN].FORMAT; checked before any work."""
    from ecotrain.base.errors import ConfigError
    from ecotrain.base.jsonfile import read_json
    from ecotrain.base.rundir import refuse_overwriting

    path = Path(out) if out else run / f"model{'-' + domain if domain else ''}.{fmt}"
    if path.suffix.lower() != f".{fmt}":
        raise ConfigError(f"--out {path}: a --format {fmt} file ends in .{fmt}")
    if path.is_dir() or not path.parent.is_dir():
        raise ConfigError(f"--out {path}: give a file path in a folder that exists")
    refuse_overwriting(path, "--out")
    record = path.parent / EXPORT_JSON
    if record.exists():  # ours to update, never someone else's file of that name
        read_json(record, "export record", {"files": dict}, fix="move it, or choose another --out folder")
    return path


def statistics(trained, domain) -> str:
    """Whose BatchNorm statistics the program holds (see the module docstring)."""
    from ecotrain.methods.bn_domain import serving, use_domain

    stats, _ = serving(trained, domain, [], "test", 0)  # --domain on a model without domains: one line
    if stats is None:
        return "as trained"
    if domain is None:
        return "the run's own domain (as model.safetensors)"
    return use_domain(trained.model, stats, domain)


def run(args, ctx) -> int:
    import torch

    from ecotrain.base.errors import ConfigError
    from ecotrain.base.rundir import atomic_write
    from ecotrain.base.version import __version__
    from ecotrain.core.task import build_task
    from ecotrain.data.tokenizer import TOKENIZER_FILE
    from ecotrain.export import onnxfile
    from ecotrain.export.card import ours, write_card
    from ecotrain.export.inference import load_trained
    from ecotrain.export.lm import CHECK_BATCH, Windows, parity_sources, run_tokenizer
    from ecotrain.export.parity import check, enforce, fold, fresh_process, with_fresh
    from ecotrain.export.program import (SEQUENCE_TASKS, context_length, example_inputs, input_spec, load_pt2,
                                         pt2_bytes, tensors_only, trace)
    from ecotrain.export.shipped import locate

    fmt, tolerance = args.format, args.tolerance
    if not tolerance >= 0:
        raise ConfigError(f"--tolerance {tolerance}: a relative difference of 0 or more, e.g. 1e-4")
    if fmt == "onnx":
        onnxfile.require()
    shipped = locate(args.run)
    run = shipped.run.path
    out = output_path(args.out, fmt, run, args.domain)
    trained = load_trained(run, device="cpu")  # the file is portable: traced on the CPU, in fp32
    bn = statistics(trained, args.domain)
    bundle = trained.bundle
    task = build_task(trained.config, bundle.sample, lm=trained.is_lm)
    split = "test" if bundle.test is not None else "val"
    source = bundle.test if bundle.test is not None else bundle.val
    if source is None:
        raise ConfigError(f"export {run}: the run has no test or validation split to check the export on")
    lm = task.name == "language_model"
    max_len, extra = None, {}
    if lm:  # token ids alone (export/lm.py), the context the model takes, the run's tokenizer
        source = Windows(source, task) if hasattr(source, "take") else source  # a user's loader: as it is
        max_len = context_length(trained.model)
        _, text = run_tokenizer(trained.out_dir, trained.config.data.name)
        extra = {TOKENIZER_FILE: text} if text else {}
    inputs, kwargs = example_inputs(task, source)
    model = tensors_only(trained.model, inputs, kwargs)  # a ModelOutput reduced to its logits
    ep = trace(model, inputs, kwargs, task.name in SEQUENCE_TASKS, max_len)
    meta = {"ecotrain": __version__, "run": str(run), "task": task.name, "num_classes": bundle.num_classes,
            "inputs": input_spec(ep), "columns": trained.columns, "target": trained.config.data.target,
            "columns_chosen": bool(trained.config.data.features),  # other columns of a CSV are ignored
            "bn_statistics": bn}
    if lm:
        meta.update({"context_length": max_len, "tokenizer": bool(extra)})
    data = pt2_bytes(ep, meta, extra)
    runners = {"program": load_pt2(data)[0].module()}  # the file's own bytes, read back as a user would
    if fmt == "onnx":
        data = onnxfile.onnx_bytes(ep, inputs, kwargs, meta, extra)
        if onnxfile.has_runtime():
            runners["onnxruntime"] = onnxfile.Session(data)
    figures = check(model, runners, task, source, trained.config.data.batch_size * 4)
    if lm and isinstance(source, Windows):  # other lengths and batch sizes than the traced example's
        for length, other in parity_sources(source, max_len, bundle.num_classes):
            figures = fold(figures, check(model, runners, task, other, CHECK_BATCH), length)
    if fmt == "pt2":  # the file read back where nothing of the training is loaded (an .onnx: onnxruntime above)
        figures = with_fresh(figures, fresh_process(model, data, inputs, kwargs, "the pt2 export"))
    record = {"format": fmt, "file": out.name, "run": str(run), "weights": trained.weights, "split": split,
              "samples": _length(source), "tolerance": tolerance, "inputs": meta["inputs"], "bn_statistics": bn,
              "torch": torch.__version__, **figures}
    if shipped.group:
        record.update({"group": str(shipped.group_file), "chosen": shipped.chosen_because})
    if fmt == "onnx" and "onnxruntime" not in runners:
        record["onnxruntime"] = "not installed: only the traced program was checked"
    enforce(record, tolerance, f"the {fmt} export")
    atomic_write(out, data)
    _record(out, record)
    card = out.parent / "README.md"
    wrote, mine = [str(out.parent / EXPORT_JSON)], ours(card)
    if mine and not args.no_card:
        wrote.append(str(write_card(shipped, card)))
    ctx.committed()
    print(f"exported: {out} ({fmt}; {_spec_line(meta['inputs'])}"
          + ("; tokenizer inside" if extra else "; no tokenizer: predict needs --tokenizer" if lm else "") + ")")
    print(_parity_line(record, split))
    print(f"wrote {' and '.join(wrote)}"
          + ("" if mine or args.no_card else f"; {card} is not ecotrain's, so no card (`ecotrain card --out`)"))
    return 0


def _length(source):
    try:
        return len(source)
    except TypeError:  # a user's DataLoader or stream: no length to say
        return None


def _record(out: Path, record: dict) -> None:
    from ecotrain.base.jsonfile import read_json
    from ecotrain.base.rundir import write_json

    path = out.parent / EXPORT_JSON
    files = read_json(path, "export record", {"files": dict})["files"] if path.exists() else {}
    write_json(path, {"schema": 1, "files": {**files, out.name: record}})


def _spec_line(spec: list[dict]) -> str:
    def dim(i, d):
        if isinstance(d, int):
            return str(d)
        return "batch" if i == 0 else f"{d['min']}..{d['max'] if d['max'] is not None else ''}"
    return ", ".join(f"{s['name']} [{', '.join(dim(i, d) for i, d in enumerate(s['shape']))}] {s['dtype']}"
                     for s in spec)


def _parity_line(record: dict, split: str) -> str:
    runners = [n for n in ("program", "onnxruntime") if isinstance(record.get(n), dict)]
    diffs = ", ".join(f"{record[n]['max_abs_diff']:.3g} ({n})" for n in runners)
    key = next(k for k in ("test_perplexity", "test_accuracy", "test_loss") if k in record["eager"])
    said = ", ".join(f"{record[n][key]:.4f} {n}" for n in runners)
    n = f"{record['samples']} samples" if record["samples"] is not None else "all of it"
    lengths = record.get("lengths") or {}
    also = f" and at sequence lengths {', '.join(lengths)} ({max(lengths.values()):.3g})" if lengths else ""
    return (f"parity on the {split} split ({n}){also}: max abs diff {diffs}; "
            f"{key.replace('test', split)} {record['eager'][key]:.4f} eager, {said}")
