"""The levers `ecotrain green` may pull on a recipe, and how a trial's choice becomes overrides.

A lever applies to a recipe or it does not (`levers(cfg)` says which, and why not): the schedule
and the batch size apply to every recipe with a step or epoch budget, the LR factor to every recipe; the width to the built-in
models; the depth to the built-in transformers; mixed fidelity (half-size inputs early) to models that
pool over their input's size; structured pruning to `cnn` and `mlp`; selective backprop to a classification task; EMA and
the stability stop to any run with a validation split. Each trial's values become dotted overrides
of the recipe (`to_overrides`), so every trial is an ordinary `ecotrain fit` run and the chosen one
an ordinary recipe.

The schedule is searched as the *fraction of the baseline's training samples* (steps x batch), not
as a step count: together with the batch size it sets the steps, and the FLOPs of a trial that keeps
the model as it is are that fraction of the baseline's, known before it trains (`predicted_cost`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import yaml

from ecotrain.base.errors import ConfigError
from ecotrain.base.data_formats import data_format

SAMPLES = (0.1, 0.5)  # fraction of the baseline's training samples, log-uniform: the cheap end is sampled most
SAMPLES_MEASURED = (0.1, 1.0)  # a measured search: larger batches cost less per sample, so up to all of them
# a measured search that may shrink the model: a smaller model trained on more samples can match a larger one
# for less (the compute-optimal trade), so up to twice the baseline's samples
SAMPLES_SMALLER = (0.1, 2.0)
SIZE_LEVERS = ("width", "depth")
BATCH_FRACTIONS = (0.16, 0.25, 0.32, 0.5, 0.75, 1.0)  # of the baseline's batch size
# a measured search only: fewer, larger steps cut the per-step overhead that a FLOPs count does not see
# (a larger batch takes the LR up by the square root of its growth, `to_overrides`)
BATCH_GROWTH = (2.0, 3.0, 5.0)
WIDTH_FACTORS = (0.6, 0.8, 1.0)
# the LR, times the batch rule's: a short schedule of few, large steps wants more than the square root
# of its batch growth (docs/efficiency.md: batch 500 x 1000 steps did best at 3x the LR, not 2.24x)
LR_FACTORS = (0.7, 1.0, 1.4, 2.0)
PRUNE_AMOUNTS = (0.0, 0.3)  # structured, reached by mid-run
KEEP = (1.0, 0.5, 0.3)  # selective backprop: 1.0 is off
MIN_BATCH = 8
WIDTH_KEYS = {"cnn": ("channels", 25), "mlp": ("hidden", [128, 128]), "resnet": ("widths", [32, 64, 128]),
              "cnn2d": ("widths", [16, 32, 64]), "causal_lm": ("d_model", 256), "nanogpt": ("d_model", 256),
              "charlm": ("d_model", 256)}
LM_MODELS = ("causal_lm", "nanogpt", "charlm")  # a transformer's width is d_model, a multiple of its heads
DEPTH_FACTORS = (0.5, 0.75, 1.0)  # of a transformer's layers (NAS-lite: a shallower student, its cost measured)
# mixed fidelity: inputs at half size (images: half the side, a quarter of the pixels; token sequences: half
# the length) for this fraction of the schedule, then full size; 0 is off. Not later than half way: a net
# trained on half-size images for 80% of its schedule was at chance on full-size ones at its end (glyphs)
FIDELITY = (0.0, 0.3, 0.5)
FIDELITY_MODELS = ("cnn2d", "resnet", *LM_MODELS)  # models that pool over their input's size (resize.py)
ALL = ("schedule", "batch", "lr", "width", "depth", "fidelity", "prune", "selective", "ema", "stability")


@dataclass(frozen=True)
class Lever:
    name: str
    what: str


def levers(cfg, only: Optional[list[str]] = None) -> tuple[list[Lever], dict[str, str]]:
    """(the levers that apply to `cfg`, {lever: why not} for the others). `only`: the user's
    `--levers` list; a name there that does not apply is refused in one line."""
    unknown = [n for n in only or () if n not in ALL]
    if unknown:
        raise ConfigError(f"--levers: unknown lever {unknown[0]!r}; choose from {', '.join(ALL)}")
    model, task = cfg.model.name, cfg.task.name
    has_val = cfg.data.val_split > 0
    why_not = {}
    if not (cfg.loop.max_steps or cfg.loop.max_epochs):
        why_not["schedule"] = why_not["batch"] = "the recipe has no step or epoch budget"
    if model not in WIDTH_KEYS:
        why_not["width"] = f"model {model!r} is not a built-in model with a width ({', '.join(WIDTH_KEYS)})"
    if model not in LM_MODELS:
        why_not["depth"] = f"model {model!r} is not a built-in transformer with layers ({', '.join(LM_MODELS)})"
    if model not in FIDELITY_MODELS:
        why_not["fidelity"] = (f"model {model!r} does not pool over its input's size; mixed fidelity needs one of "
                               f"{', '.join(FIDELITY_MODELS)}")
    if model not in ("cnn", "mlp"):
        why_not["prune"] = f"structured pruning needs model cnn or mlp, not {model!r}"
    fmt = data_format(cfg.data.name)
    if task not in ("auto", "classification") or model in LM_MODELS or (fmt is not None and fmt.tokens):
        why_not["selective"] = f"selective backprop needs a classification task, not {task!r} on {model!r}"
    if not has_val:
        why_not["stability"] = why_not["ema"] = "the recipe has no validation split"
    names = [n for n in ALL if n not in why_not] if only is None else list(only)
    refused = [n for n in names if n in why_not]
    if refused:
        raise ConfigError(f"--levers {refused[0]}: does not apply to this recipe ({why_not[refused[0]]})")
    if not has_val:
        raise ConfigError("ecotrain green: the recipe needs a validation split (data.val_split > 0): the search "
                          "chooses on validation accuracy only")
    table = {"schedule": "training samples as a fraction of the baseline's", "batch": "batch size (a larger one with the LR x the square root of its growth)",
             "lr": "the learning rate x a factor (after the batch size's rule)",
             "width": "model width", "depth": "a transformer's layers (a shallower model)",
             "fidelity": "half-size inputs (images: half resolution; sequences: half length) early, then full",
             "prune": "structured pruning of channels by mid-run",
             "selective": "selective backprop (backpropagate the hardest fraction)",
             "ema": "evaluate an EMA of the weights", "stability": "stop once validation loss is stable"}
    return [Lever(n, table[n]) for n in names], {n: w for n, w in why_not.items() if only is None or n in only}


def batch_choices(base_batch: int, largest: int = 0) -> list[int]:
    """The batch sizes searched: fractions of the recipe's, and with `largest` > 0 (a measured search)
    multiples of it up to `largest` (half the training set: two steps an epoch at least)."""
    out = {max(MIN_BATCH, min(base_batch, round(base_batch * f))) for f in BATCH_FRACTIONS}
    return sorted(out | {round(base_batch * g) for g in BATCH_GROWTH if round(base_batch * g) <= largest})


def suggest(trial, chosen: list[Lever], base_batch: int, largest: int = 0, measured: bool = False) -> dict:
    """The trial's values, one Optuna suggestion per lever (levers not searched keep the recipe's).
    `measured`: a measured search (up to all the samples, or twice them with a model-size lever);
    `largest` > 0: its larger batches (batch_choices)."""
    names = {lv.name for lv in chosen}
    p: dict = {}
    if "schedule" in names:
        span = SAMPLES if not (measured or largest) else SAMPLES_SMALLER if names & set(SIZE_LEVERS) else SAMPLES_MEASURED
        p["samples"] = trial.suggest_float("samples", *span, log=True)
    if "batch" in names:
        p["batch"] = trial.suggest_categorical("batch", batch_choices(base_batch, largest))
    if "lr" in names:
        p["lr"] = trial.suggest_categorical("lr", list(LR_FACTORS))
    if "width" in names:
        p["width"] = trial.suggest_categorical("width", list(WIDTH_FACTORS))
    if "depth" in names:
        p["depth"] = trial.suggest_categorical("depth", list(DEPTH_FACTORS))
    if "fidelity" in names:
        p["fidelity"] = trial.suggest_categorical("fidelity", list(FIDELITY))
    if "prune" in names:
        p["prune"] = trial.suggest_categorical("prune", list(PRUNE_AMOUNTS))
    if "selective" in names:
        p["keep"] = trial.suggest_categorical("keep", list(KEEP))
    if "ema" in names and not p.get("prune"):  # prune refuses EMA (methods/prune.py): never propose both
        p["ema"] = trial.suggest_categorical("ema", [False, True])
    if "stability" in names:
        p["stability"] = trial.suggest_categorical("stability", [False, True])
    return values(p)


# the first trials: each model, data or schedule lever alone at its cheap end, the rest as the recipe has it,
# before the sampler combines them (a random start over eight levers spent a 20-trial search on mixtures
# and never tried the narrower net alone, the pick it needed on the image recipe)
ALONE = (("width", 0.6), ("depth", 0.5), ("fidelity", 0.5), ("prune", 0.3), ("schedule", 0.5))


def first_trials(chosen: list[Lever], base_batch: int, measured: bool) -> list[dict]:
    """One trial's values per lever in ALONE that is searched: that lever at its cheap end, every other
    at the recipe's own value (all the samples a measured search may take; a FLOPs search's most)."""
    names = {lv.name for lv in chosen}
    neutral = {"samples": 1.0 if measured else SAMPLES[1], "batch": base_batch, "lr": 1.0, "width": 1.0,
               "depth": 1.0, "fidelity": 0.0, "prune": 0.0, "keep": 1.0, "ema": False, "stability": False}
    key = {"schedule": "samples", "batch": "batch", "lr": "lr", "width": "width", "depth": "depth",
           "fidelity": "fidelity", "prune": "prune", "selective": "keep", "ema": "ema", "stability": "stability"}
    base = {key[n]: neutral[key[n]] for n in names}
    out = []
    for lever, cheap in ALONE:
        if lever in names:
            out.append({**base, key[lever]: cheap})  # the schedule's: half the baseline's samples
    return out


def values(params: dict) -> dict:
    """A trial's values as the run uses them (the samples fraction to 3 digits): one place, for a new
    trial, a trial continued after a kill, and one read back from the study."""
    return {**params, "samples": round(params["samples"], 3)} if "samples" in params else dict(params)


def _scaled(value, factor: float, multiple: int = 1):
    """`value` (a size or a list of sizes) x `factor`, rounded to a multiple of `multiple` (a transformer's
    heads must divide its width), never below one multiple."""
    if isinstance(value, (list, tuple)):
        return [_scaled(v, factor, multiple) for v in value]
    return max(1, round(value * factor / multiple)) * multiple


def to_overrides(cfg, params: dict, base_samples: int, evals: int = 4) -> list[str]:
    """Dotted overrides of `cfg` that train with `params`; `base_samples` is the baseline run's
    training samples (its ledger), so a recipe with an epoch budget is searched too. The trial is
    evaluated `evals` times, at even fractions of its schedule (the pruner reads them)."""
    out: list[str] = []
    batch = int(params.get("batch", cfg.data.batch_size))
    if batch != cfg.data.batch_size:
        out.append(f"data.batch_size={batch}")
    lr = cfg.optim.lr * params.get("lr", 1.0)
    if batch > cfg.data.batch_size:  # the square-root rule for Adam-like optimizers; a smaller batch keeps the LR
        lr *= (batch / cfg.data.batch_size) ** 0.5
    if lr != cfg.optim.lr:
        out.append(f"optim.lr={lr:.6g}")
    samples = params.get("samples", 1.0) * base_samples
    steps = max(evals, round(samples / batch))
    out += [f"loop.max_steps={steps}", "loop.max_epochs=null", f"loop.eval_every={max(1, -(-steps // evals))}"]
    if cfg.schedule.warmup and cfg.schedule.interval == "step" and cfg.schedule.warmup >= steps // 2:
        out.append(f"schedule.warmup={steps // 10}")  # a warmup as long as a short schedule is no schedule
    kwargs, lm = cfg.model.kwargs, cfg.model.name in LM_MODELS
    if params.get("width", 1.0) != 1.0:
        key, default = WIDTH_KEYS[cfg.model.name]
        heads = int(kwargs.get("n_heads", 4)) if lm else 1
        out.append(f"model.kwargs.{key}={_flow(_scaled(kwargs.get(key, default), params['width'], heads))}")
    if params.get("depth", 1.0) != 1.0:
        layers = int(kwargs.get("n_layers", 6 if cfg.model.name == "charlm" else 4))
        out.append(f"model.kwargs.n_layers={_scaled(layers, params['depth'])}")
    methods = [m.model_dump(exclude_defaults=False) for m in cfg.methods]
    if params.get("fidelity", 0.0) > 0 and not any(m["name"] == "progressive_resize" for m in methods):
        methods.append({"name": "progressive_resize", "scales": [0.5], "until": [params["fidelity"]]})
    if params.get("prune", 0.0) > 0:
        methods.append({"name": "prune", "kind": "structured", "amount": params["prune"], "end_step": steps // 2,
                        "every": max(1, steps // 20)})
    if params.get("keep", 1.0) < 1.0:
        methods.append({"name": "selective_backprop", "keep": params["keep"]})
    if params.get("ema"):
        methods.append({"name": "ema"})
    if params.get("stability"):
        methods.append({"name": "stability_stop", "monitor": "val_loss", "window": 3, "tolerance": 0.01})
    if len(methods) != len(cfg.methods):
        out.append(f"methods={_flow(methods)}")
    return out


def _flow(value) -> str:
    if not isinstance(value, (list, tuple, dict)):  # a scalar: safe_dump would add a document end
        return str(value)
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()


def predicted_cost(params: dict) -> Optional[float]:
    """The trial's FLOPs as a fraction of the baseline's, before it trains, when that is known: the
    samples fraction, when the per-sample work is the baseline's (no width, pruning or selective
    backprop change; EMA and the stability stop add no training FLOPs, and a stop only lowers it)."""
    if (params.get("width", 1.0) != 1.0 or params.get("depth", 1.0) != 1.0 or params.get("fidelity", 0.0) > 0
            or params.get("prune", 0.0) > 0 or params.get("keep", 1.0) < 1.0):
        return None
    return params.get("samples", 1.0)
