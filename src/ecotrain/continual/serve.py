"""A deployment served from the registry: the base version, one version per cohort, and a router.

    ecotrain predict current --registry REG --data requests.npz --out preds.csv [--cohort de]
    ecotrain eval current --registry REG --data labelled.npz [--cohort de]

Which model reads an example (its route):
1. the cohort the request carries (`--cohort C` for the whole file, or the file's integer `cohort`
   column per row): that cohort's promoted version (`index.json` `cohorts`), or the base when the
   cohort has none (an unknown cohort is served, never refused);
2. no cohort: the learned router (router.py) on the base model's pooled features, fitted on the
   examples each serving version stored at registration (`router.safetensors`: up to 256 of its
   training inputs); below its confidence threshold, the base.

The same routing serves the gate of a cohort's update (update.py), so what is promoted is what
predict will serve. Predictions carry their route (`version` column).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import torch
from torch import nn

from ecotrain.base import safefile
from ecotrain.continual.gate import predict_proba
from ecotrain.continual.incoming import checked_cohort, checked_labels, checked_x, load_npz
from ecotrain.continual.registry_mlflow import open_registry
from ecotrain.continual.router import MIN_CONFIDENCE, CohortRouter, pooled_features
from ecotrain.continual.versions import load_version_model
from ecotrain.base.errors import CheckpointError, ConfigError, DataError
from ecotrain.export.inference import writable, write_out

ROUTER_FILE = "router.safetensors"
ROUTER_SAMPLE = 256  # inputs per version kept for the router: enough for a linear model, kilobytes
BASE = "(base)"  # the router's class for what the base version serves


def router_sample(x: torch.Tensor, seed: int) -> torch.Tensor:
    """Up to ROUTER_SAMPLE rows of `x` (seeded): the examples a version keeps for the router."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(len(x), generator=g)[:ROUTER_SAMPLE].sort().values
    return x[idx].float().contiguous()


def writestored_router_sample(x: torch.Tensor, seed: int, folder: Path) -> Path:
    """folder/router.safetensors: `router_sample(x, seed)`, for a version's files."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / ROUTER_FILE
    save_file({"x": router_sample(x, seed)}, str(path))
    return path


def stored_router_sample(reg, name: str) -> Optional[torch.Tensor]:
    from safetensors.torch import load_file

    path = reg.path(name) / ROUTER_FILE
    if not path.is_file():
        return None
    # verified with the version (manifest); by name to safetensors, so no FIFO or device first
    return load_file(str(safefile.regular(path, "router sample", error=CheckpointError)))["x"]


@dataclass
class Deployment:
    base: str  # the base version's name
    model: nn.Module
    cohorts: dict[str, str]  # cohort -> version serving it
    models: dict[str, nn.Module]
    router: Optional[CohortRouter]

    @classmethod
    def load(cls, reg, version: str = "current", candidate: Optional[tuple] = None,
             min_confidence: float = MIN_CONFIDENCE, seed: int = 0) -> "Deployment":
        """The deployment as the registry serves it; `candidate` = (cohort, model, router inputs) puts a
        model not yet registered in its cohort's place (the gate's "after")."""

        idx = reg.existing_index()
        base = reg.resolve(version)
        if idx["versions"][base].get("cohort") is not None:
            raise ConfigError(f"{base} serves cohort {idx['versions'][base]['cohort']}; give the base version "
                              "(`current`) and pick the cohort with --cohort")
        if reg.read_meta(base).get("task") == "language_model":  # verified (manifest, checksums) first
            raise ConfigError(f"{base} is a language model; the registry serves classifiers' predictions (run "
                              "`ecotrain predict` on a run folder to continue prompts)")
        # a cohort's version was trained on a base: after `current` moved (a rollback, a promotion) the
        # versions made on another base are not served (the base reads their cohort) until re-made on it
        cohorts = {c: n for c, n in idx["cohorts"].items() if reg.read_meta(n).get("parent") == base}
        models = {c: load_version_model(reg, n) for c, n in cohorts.items()}
        samples = {BASE: stored_router_sample(reg, base), **{c: stored_router_sample(reg, n) for c, n in cohorts.items()}}
        if candidate is not None:
            c, models[c], samples[c] = candidate
            cohorts[c] = "(candidate)"
        model = load_version_model(reg, base)
        got = [(c, x) for c, x in samples.items() if x is not None and len(x)]
        router = None
        if len({c for c, _ in got}) >= 2:
            feats = torch.cat([pooled_features(model, x) for _, x in got])
            router = CohortRouter(min_confidence, seed).fit(feats.numpy(), [c for c, x in got for _ in range(len(x))])
        return cls(base, model, cohorts, models, router)

    def routes(self, x: torch.Tensor, cohorts: Optional[Sequence[Optional[str]]] = None) -> list[Optional[str]]:
        """Per example: the cohort whose version reads it, or None for the base. A given cohort wins;
        the router decides for the rest."""
        given = list(cohorts) if cohorts is not None else [None] * len(x)
        out: list[Optional[str]] = [c if c in self.models else None for c in given]
        ask = [i for i, c in enumerate(given) if c is None]
        if ask and self.router is not None:
            picked = self.router.route(pooled_features(self.model, x[ask]).numpy())
            for i, c in zip(ask, picked):
                out[i] = c if c in self.models else None  # BASE, unsure, or no version: the base
        return out

    def proba(self, x: torch.Tensor, routes: Sequence[Optional[str]]) -> torch.Tensor:
        """Class probabilities, each example read by the model of its route."""
        if len(x) == 0:
            raise DataError("no examples to serve (the data holds 0 rows)")
        out = None
        for r in set(routes):
            idx = torch.tensor([i for i, q in enumerate(routes) if q == r], dtype=torch.long)
            p = predict_proba(self.models[r] if r is not None else self.model, x[idx])
            out = torch.zeros(len(x), p.shape[1]) if out is None else out
            out[idx] = p
        return out if out is not None else torch.zeros(0, 0)

    def version_of(self, route: Optional[str]) -> str:
        return self.cohorts[route] if route is not None else self.base


# -- the commands -----------------------------------------------------------------------------------
def read_requests(path: Path, meta: dict, cohort: Optional[str]):
    """(x, y or None, per-row cohorts or None) of an .npz: `x` (the version's input shape), optional `y`
    and integer `cohort`, checked as `update` checks NEW_DATA; `--cohort` overrides the column."""

    arrays = load_npz(path, "give an .npz with x (and optionally y and an integer cohort per row)")
    if "x" not in arrays:
        raise DataError(f"{path}: missing array 'x' (found {sorted(arrays)})")
    x = checked_x(arrays, "x", meta["input_shape"], path)
    y = checked_labels(arrays, "y", len(x), None, meta["num_classes"], path) if "y" in arrays else None
    if cohort is not None:
        return x, y, [str(cohort)] * len(x)
    c = checked_cohort(arrays, "cohort", len(x), path)
    return x, y, None if c is None else [str(int(v)) for v in c]


def _serve(registry, version: str, data: str, cohort: Optional[str]):
    reg = open_registry(registry)
    dep = Deployment.load(reg, version)
    x, y, given = read_requests(Path(data), reg.read_meta(dep.base), cohort)
    routes = dep.routes(x, given)
    return dep, x, y, given, routes, dep.proba(x, routes)


def predict(registry, version: str, data: str, out: str, cohort: Optional[str] = None) -> tuple[int, Path, dict]:
    """CSV: index, prediction, [label], cohort given, version that served it, prob_0..prob_{K-1}."""
    path = writable(Path(out), "--out", [data])
    dep, x, y, given, routes, probs = _serve(registry, version, data, cohort)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    k = probs.shape[1] if len(probs) else 0
    w.writerow(["index", "prediction", *(["label"] if y is not None else []), "cohort", "version",
                *(f"prob_{j}" for j in range(k))])
    for i in range(len(x)):
        w.writerow([i, int(probs[i].argmax()), *([int(y[i])] if y is not None else []),
                    given[i] if given and given[i] is not None else "", dep.version_of(routes[i]),
                    *(f"{float(p):.6g}" for p in probs[i])])
    write_out(path, buf.getvalue().encode(), "--out")
    return len(x), path, _counts(dep, routes)


def evaluate(registry, version: str, data: str, out: Optional[str], cohort: Optional[str] = None) -> tuple[dict, Path]:
    """Accuracy of the deployment as served (routes as in predict), overall and per route."""
    path = Path(out) if out else Path(data).with_suffix("").with_name(Path(data).stem + "-eval.json")
    writable(path, "--out", [data])
    dep, x, y, given, routes, probs = _serve(registry, version, data, cohort)
    if y is None:
        raise DataError(f"{data}: no 'y' array; eval needs labels (predict does not)")
    hit = (probs.argmax(1) == y).float()
    per = {}
    for r in sorted(set(routes), key=str):
        m = torch.tensor([q == r for q in routes])
        per[dep.version_of(r)] = {"samples": int(m.sum()), "accuracy": round(float(hit[m].mean()), 6)}
    record = {"registry": str(registry), "base": dep.base, "cohorts": dep.cohorts, "data": str(data),
              "cohort": cohort, "samples": len(x), "accuracy": round(float(hit.mean()), 6) if len(x) else None,
              "routes": per, "router": dep.router is not None}
    write_out(path, (json.dumps(record, indent=2, sort_keys=True) + "\n").encode(), "--out")
    return record, path


def _counts(dep: Deployment, routes) -> dict:
    out: dict = {}
    for r in routes:
        v = dep.version_of(r)
        out[v] = out.get(v, 0) + 1
    return out
