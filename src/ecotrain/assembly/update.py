"""`ecotrain update BASE NEW_DATA`: train a new version from a registered one, gate it, record it.

1. the incoming .npz (x, y[, x_test, y_test, cohort, cohort_test]): labels normalised (labels.py),
   checked against the base model's shape and classes; the recent slice is its test split (or a
   seeded, stratified 20% of it when it has none);
2. label check (labels the base model strongly contradicts) and drift (drift.py), both through the
   base model; alert lines logged and kept in the version's meta;
3. training: the base's config (or `--recipe`) + overrides, its data the incoming training part,
   initialised from the base's weights; `replay`/`ewc` entries without `from` read the base version's
   export.safetensors, `lwf` without `teacher` the base's weights;
4. the gate (gate.py) on the holdout (the base's slices) and the recent slice;
5. under the registry lock: the version written (registry.py) and marked promoted (it becomes
   `current`, if `current` is still the base) or rejected, with the reason.

Training runs outside the lock, so two updates can train at once; only the short write is serial.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ecotrain.checkpoint.format import load_state_dict_file
from ecotrain.config import build_config, load_config, merge_trees, parse_overrides
from ecotrain.continual.drift import DriftThresholds, drift_report
from ecotrain.continual.gate import GatePolicy, choose_average, decide, lineage_metrics, predict_proba, slice_metrics
from ecotrain.continual.incoming import (RECENT_FRACTION, checked_cohort, checked_labels, checked_x, load_npz,  # noqa: F401
                                        read_incoming, recent_split)
from ecotrain.continual.labels import contradicted, contradictions, load_label_map
from ecotrain.assembly.update_lm import is_lm, register_lm_run, update_lm
from ecotrain.continual.registry import Slice, file_hash
from ecotrain.continual.registry_mlflow import open_registry
from ecotrain.continual.serve import ROUTER_FILE, Deployment, router_sample, writestored_router_sample
from ecotrain.continual.versions import (LOAD_ONLY_SKIP, Outcome, build_bare, check_trained, lineage, settler,  # noqa: F401
                                         load_version_model)
from ecotrain.base.errors import ConfigError, DataError
from ecotrain.base.tensorfile import save_weights
from ecotrain.export.inference import load_trained
from ecotrain.base.log import log
from ecotrain.methods.adapters import is_adapted, merge
from ecotrain.base.tensorfile import cpu_copy
from ecotrain.assembly.trainer import fit
from ecotrain.base.runfiles import CONFIG, EXPORT, MODEL

FROM_EXPORT = ("replay", "ewc")  # methods whose `from` is the base version's export.safetensors


@dataclass
class UpdateOptions:
    policy: GatePolicy = field(default_factory=GatePolicy)
    drift: DriftThresholds = field(default_factory=DriftThresholds)
    label_map: Optional[str] = None
    contradiction_threshold: float = 0.9
    drop_contradicted: bool = False
    slice_name: Optional[str] = None
    recipe: Optional[str] = None
    quiet: bool = True
    cohort: Optional[str] = None  # a cohort's own version (serve.py): served to that cohort, gated as served
    average: tuple[float, ...] = ()  # alphas: the candidate averaged with the base, the largest the gate takes
    hold: bool = False  # a version that passes the gate stays a candidate for the canary (canary.py)


# -- incoming data ----------------------------------------------------------------------------------


# -- models of versions -----------------------------------------------------------------------------


# -- the update -------------------------------------------------------------------------------------
def training_config(base_meta: dict, base_dir: Path, init_file: Path, train_npz: Path, overrides: list[str],
                    recipe: Optional[str]):
    if recipe:
        tree = load_config(recipe).to_dict()
    else:  # the base's own methods; their `from`/`teacher` pointed at the base's parent: re-pointed below
        tree = dict(base_meta["config"])
        tree["methods"] = [{k: v for k, v in m.items() if k not in ("from", "teacher")}
                           for m in tree.get("methods", [])]
    tree = merge_trees(tree, parse_overrides(overrides)) if overrides else tree
    # the head keeps the base's width: the incoming data may hold only some (new) classes
    tree["data"] = {**tree.get("data", {}), "name": "npz", "path": str(train_npz), "kwargs": {},
                    "num_classes": base_meta["num_classes"], "test_split": 0.0}
    methods = []
    for m in tree.get("methods") or []:
        m = dict(m)
        if m.get("name") in FROM_EXPORT and not m.get("from"):
            if (base_dir / EXPORT).is_file():
                m["from"] = str(base_dir / EXPORT)
            else:
                what = "replay buffer" if m["name"] == "replay" else "Fisher information"
                raise ConfigError(f"methods.{m['name']}: the base version {base_dir.name} has no {what} (its run "
                                  f"was not trained with methods.{m['name']}), so this update would not be "
                                  f"protected; point `from:` at a run's export.safetensors that has one, or "
                                  f"register a base trained with {m['name']}")
        if m.get("name") == "lwf" and not m.get("teacher"):
            m["teacher"] = str(init_file)
        methods.append(m)
    tree["methods"] = methods
    return build_config(tree, "update config" + (" + overrides" if overrides else ""))


def update(registry: str | Path, base: str, data: str | Path, overrides: list[str], opts: UpdateOptions,
           preemption=None) -> Outcome:
    reg = open_registry(registry)
    base = base_of(reg, registry, base)
    base_meta = reg.read_meta(base)  # verified: a damaged base is one line, before any work
    if is_lm(base_meta):  # a language model: token data, perplexity gate (assembly/update_lm.py)
        return update_lm(reg, base, base_meta, data, overrides, opts, preemption)
    if base_meta.get("cohort") is not None:
        raise ConfigError(f"{base} is cohort {base_meta['cohort']}'s version; update from the base version "
                          f"(`current`) with --cohort {base_meta['cohort']}")
    data = Path(data)
    label_map = load_label_map(opts.label_map)
    x, y, c, test = read_incoming(data, label_map, tuple(base_meta["input_shape"]), base_meta["num_classes"])
    (x, y, c), (rx, ry, rc) = recent_split(x, y, c, test, base_meta["config"].get("seed", 0))
    holdout = [reg.get_slice(sid) for sid in base_meta["slices"]]
    name = opts.slice_name or data.stem
    if name in {s.name for s in holdout}:
        raise ConfigError(f"slice '{name}': the base already has a slice of that name; pass --slice NAME")
    recent = Slice(name, rx, ry, rc)

    work = reg.root / "work" / f"{base}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    init_file, train_npz = work / "base.safetensors", work / "train.npz"
    # checked now, before any model runs: a typo in the overrides is one line, at once
    cfg = training_config(base_meta, reg.path(base), init_file, train_npz, overrides, opts.recipe)
    if opts.average and any(m.name == "adapters" for m in cfg.methods):
        raise ConfigError("--average: an adapter version holds only the adapter; weight averaging needs full "
                          "weights (drop --average, or train without adapters)")

    base_model = load_version_model(reg, base)
    probs = predict_proba(base_model, x)
    label_report = contradictions(probs, y, set(base_meta["classes_seen"]), opts.contradiction_threshold)
    if label_report["contradicted"]:
        log.warning(f"labels: the base model ({base}) contradicts {label_report['contradicted']} of "
                    f"{label_report['checked']} labels of known classes with confidence >= "
                    f"{opts.contradiction_threshold}" + ("; dropped from training" if opts.drop_contradicted else
                                                         "; see `ecotrain review-queue`"))
    if opts.drop_contradicted and label_report["contradicted"]:
        keep = ~contradicted(probs, y, set(base_meta["classes_seen"]), opts.contradiction_threshold)
        x, y, c, probs = x[keep], y[keep], (c[keep] if c is not None else None), probs[keep]
        if len(y) == 0:
            raise DataError(f"{data}: every training label is contradicted by {base}; nothing left to train on "
                            "(check the labels with `ecotrain review-queue`, or drop --drop-contradicted)")
    ref_x = torch.cat([s.x for s in holdout]) if holdout else None
    ref_y = torch.cat([s.y for s in holdout]) if holdout else None
    drift = drift_report(predict_proba(base_model, ref_x) if ref_x is not None else None, ref_y, probs, y, c,
                         opts.drift)
    for line in drift["alerts"]:
        log.warning(line)

    work.mkdir(parents=True)
    try:
        save_weights(init_file, base_model)  # the base's full weights (an adapter version merged)
        with open(train_npz, "wb") as f:
            np.savez(f, x=x.numpy(), y=y.numpy())
        result = fit(cfg, run_dir=work / "run", quiet=opts.quiet, init_from=init_file, preemption=preemption)
        check_trained(result.summary)
        run_dir = result.run_dir
        cand, averaged = result.model.eval(), None
        if opts.average:
            if opts.cohort is not None:
                raise ConfigError("--average with --cohort: a cohort's version is gated as served; average without "
                                  "--cohort, or train the cohort's version plain")
            cand, averaged = choose_average(base_model, cand, slice_metrics(base_model, [*holdout, recent])["tasks"],
                                            holdout, recent, opts.average, opts.policy,
                                            lambda m, sl: slice_metrics(m, sl)["tasks"], decide)
        outcome = _gate_and_register(reg, base, base_meta, base_model, cand, cfg, run_dir, holdout, recent, opts,
                                     {"incoming": file_hash(data), "train": file_hash(train_npz),
                                      "incoming_file": str(data)}, drift, label_report, y, result.summary, x,
                                     averaged)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return outcome


def base_of(reg, registry, base: str) -> str:
    """BASE as a version name: a version or `current`, or a finished run folder (`ecotrain update RUN`):
    registered first when the registry is empty, else the version registered from it."""
    run = Path(base)
    if not (run.is_dir() and (run / CONFIG).is_file()):
        return reg.resolve(base)
    idx = reg.index()
    if not idx["versions"]:
        out = register_run(registry, run)
        log.info(f"update: {run} registered as {out.version} ({out.reason})")
        return out.version
    where = str(run.resolve())
    for name in sorted(idx["versions"], reverse=True):
        if str(Path((reg.read_meta(name).get("data") or {}).get("run") or "/nonexistent").resolve()) == where:
            return name
    raise ConfigError(f"BASE {run}: a run folder, and the registry {reg.where} holds versions none of which was "
                      f"registered from it; register it first (`ecotrain versions add {run}`) or give a version")


def served_metrics(dep, slices: list[Slice], cohort: str) -> dict:
    """A deployment's per-slice accuracy as served: the recent slice (the last) with its cohort given,
    as the requests that carried the feedback; the holdout with no cohort given (the router decides),
    the product's worst case, where a new cohort's version can reach old users."""
    tasks = {}
    for s in slices:
        given = [cohort] * len(s.x) if s is slices[-1] else None
        p = dep.proba(s.x, dep.routes(s.x, given))
        tasks[s.name] = round(float((p.argmax(-1) == s.y).float().mean()), 6)
    return {"tasks": tasks, "average_accuracy": round(sum(tasks.values()) / len(tasks), 6)}


def _gate_and_register(reg, base, base_meta, base_model, cand, cfg, run_dir, holdout, recent, opts, hashes,
                       drift, label_report, y_train, summary, x_train=None, averaged=None) -> Outcome:
    slices = [*holdout, recent]
    if opts.cohort is None:
        base_m, cand_m = slice_metrics(base_model, slices), slice_metrics(cand, slices)
    else:  # the deployment before and after, as predict serves it
        seed = cfg.seed
        before = Deployment.load(reg, base, seed=seed)
        # the router's examples of this version as predict will have them: the stored sample, not all of x
        after = Deployment.load(reg, base, candidate=(opts.cohort, cand, router_sample(x_train, seed)), seed=seed)
        cohorts_gated = dict(reg.index()["cohorts"])  # what the gate served; promoted only if still so
        base_m, cand_m = served_metrics(before, slices, opts.cohort), served_metrics(after, slices, opts.cohort)
    ok, reason = decide(base_m["tasks"], cand_m["tasks"], [s.name for s in holdout], recent.name, opts.policy)
    ancestors = lineage(reg, base)
    history = [a["metrics"]["tasks"] for a in ancestors]
    learnt_at = {**base_meta.get("learnt_at", {}), recent.name: cand_m["tasks"][recent.name]}
    metrics = {**cand_m, **lineage_metrics(cand_m["tasks"], history, base_meta.get("learnt_at", {})),
               "base": base_m, "gate": {"promote": ok, "reason": reason, "tolerance": opts.policy.tolerance,
                                        "min_gain": opts.policy.min_gain, "cap": opts.policy.cap,
                                        "before": base_m["tasks"], "after": cand_m["tasks"]}}
    if averaged is not None:
        metrics["gate"]["average"] = averaged
    adapter = run_dir / "adapter"
    weights_kind = "adapter" if (adapter / "adapter_model.safetensors").is_file() else "full"
    files = {}
    if (run_dir / EXPORT).is_file():
        files[EXPORT] = run_dir / EXPORT
    if x_train is not None:  # the router's examples of what this version serves
        files[ROUTER_FILE] = writestored_router_sample(x_train, cfg.seed, run_dir / "router")
    if weights_kind == "adapter":
        files.update({f"adapter/{p.name}": p for p in sorted(adapter.iterdir()) if p.is_file()})
    weights = None if weights_kind == "adapter" else load_state_dict_file(run_dir / MODEL)
    if averaged is not None:  # what the gate measured: the averaged model, not the run's own weights
        weights = cpu_copy(cand.state_dict())
    seen = sorted(set(base_meta["classes_seen"]) | set(int(v) for v in torch.unique(y_train)))
    meta = {"format": "ecotrain-version/1", "parent": base, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "config": cfg.to_dict(), "input_shape": base_meta["input_shape"], "num_classes": base_meta["num_classes"],
            "classes_seen": seen, "weights": weights_kind, "data": hashes, "metrics": metrics, "learnt_at": learnt_at,
            "drift": drift, "labels": label_report, "run_summary": {k: summary.get(k) for k in
                                                                    ("steps", "epochs", "train_seconds", "stopped_because")}}
    if opts.cohort is not None:
        meta["cohort"] = str(opts.cohort)
    verdict = {"ok": ok, "reason": reason}

    def cohorts_moved(idx: dict, name: str):
        if opts.cohort is not None and idx["cohorts"] != cohorts_gated:
            return (f"candidate: passed the gate as served, but cohort versions changed meanwhile; promote it with "
                    f"`ecotrain promote {name}` if wanted ({reason})")
        return None

    settle = settler(reg, base, ok, reason, verdict, cohorts_moved, opts.hold)
    name = reg.commit(weights, meta, files, slices, settle)
    return Outcome(name, verdict["ok"], verdict["reason"], meta, verdict.get("held", False))


def register_run(registry: str | Path, run: str | Path, slice_name: Optional[str] = None,
                 data: Optional[str] = None, label_map: Optional[str] = None) -> Outcome:
    """Bootstrap: register a finished run as a version. Its evaluation slice is `data`'s test split (or
    all of it), else the run's own test split (validation when it has none). The first version becomes
    `current`; later ones are candidates until promoted."""
    reg = open_registry(registry)
    run = Path(run)
    trained = load_trained(run, "cpu")  # config, weights, the run's data: one line for anything missing
    if trained.prefix or not (run / MODEL).is_file():
        raise ConfigError(f"{run}: give a finished run folder (config.yaml + model.safetensors), not a checkpoint")
    if trained.is_lm:  # a language model: token windows, perplexity (assembly/update_lm.py)
        return register_lm_run(reg, run, trained, slice_name, data)
    if trained.bundle.num_classes is None:
        raise ConfigError(f"{run}: the registry holds classifiers and language models; this run is neither")
    bundle, model = trained.bundle, trained.model
    shape, k = tuple(bundle.input_shape), int(bundle.num_classes)
    if data is not None:
        x, y, c, test = read_incoming(Path(data), load_label_map(label_map), shape, k)
        sx, sy, sc = test if test is not None else (x, y, c)
        name = slice_name or Path(data).stem
    else:
        src = bundle.test if bundle.test is not None else bundle.val
        if src is None:
            raise ConfigError(f"{run}: the run has no test or validation split to evaluate on; pass --data FILE.npz")
        sx, sy = src.take(torch.arange(len(src)))
        sc, name = None, slice_name or "base"
    recent = Slice(name, sx.float(), sy.long(), sc)
    metrics = slice_metrics(model, [recent])
    cfg = trained.config.to_dict()
    meta = {"format": "ecotrain-version/1", "parent": None, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "config": cfg, "input_shape": list(shape), "num_classes": k,
            "classes_seen": sorted(int(v) for v in torch.unique(bundle.train.labels())), "weights": "full",
            "data": {"run": str(run), "dataset_hash": bundle.content_hash}, "learnt_at": dict(metrics["tasks"]),
            "metrics": {**metrics, "gate": {"promote": True, "reason": f"registered from run {run}"}}}
    files = {EXPORT: run / EXPORT} if (run / EXPORT).is_file() else {}

    g = torch.Generator().manual_seed(int(cfg.get("seed", 0)))  # the router's examples of the base
    tx, _ = bundle.train.take(torch.randperm(len(bundle.train), generator=g)[:4096].sort().values)
    work = reg.root / "work" / f"register-{os.getpid()}"
    files[ROUTER_FILE] = writestored_router_sample(tx.float(), cfg.get("seed", 0), work)
    if any(m.get("name") == "adapters" for m in cfg.get("methods", [])):  # stored plain: adapters folded in
        model = merge(model) if is_adapted(model) else model
    weights = cpu_copy(model.state_dict())
    why = f"registered from run {run}"

    def settle(idx: dict, name: str) -> None:
        if idx["current"] is None:
            reg.make_current(idx, name, why)
        else:
            reg.set_status(idx, name, "candidate", f"{why}; promote it to use it")

    try:
        name = reg.commit(weights, meta, files, [recent], settle)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    status = reg.index()["versions"][name]
    return Outcome(name, status["status"] == "promoted", status["reason"], meta)
