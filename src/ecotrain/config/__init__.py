"""The typed schema of a whole run, YAML loading and dotted command-line overrides.

The schema is the single source of truth: every key a recipe may hold is declared here, unknown
keys are refused, and every error names the dotted key (`optim.lr`) and what is wrong with it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from ecotrain.base import safefile
from ecotrain.base.errors import ConfigError
from ecotrain.base.userpath import user_path
from ecotrain.config.base import ModelConfig, Section as _Section  # noqa: F401 (re-exported)
from ecotrain.config.carbon import CarbonConfig
from ecotrain.config.memory import EveryN, MemoryConfig, NamedModules  # noqa: F401 (re-exported)
from ecotrain.config.run import (  # noqa: F401 (re-exported)
    CheckpointConfig, DistributedConfig, FsdpConfig, PreemptionConfig)
from ecotrain.base.data_formats import data_format
from ecotrain.config.methods import (  # noqa: F401 (re-exported: `from ecotrain.config import EmaConfig`)
    EmaConfig, BatchNormConfig, FinetuneConfig, DedupConfig, CurriculumConfig, SelectiveBackpropConfig,
    ProgressiveResizeConfig, BatchRampConfig, LateFreezeConfig, StabilityStopConfig, DistillConfig,
    PruneConfig, QatConfig, ReplayConfig, EwcConfig, LwfConfig, AdaptersConfig, AverageConfig, MethodConfig,
)

# mnist1d: 10 classes, split 80/20 into train/test by the generator, then a validation split of train
MIN_MNIST1D_SAMPLES = 100
# run names become folder names (runs/<name>-<timestamp>): a name, never a path
_NAME_RE = re.compile(r"\w[\w.+-]{0,127}")


def safe_name(text: str) -> str:
    """`text` (e.g. a recipe file's stem) made into a valid run name."""
    out = re.sub(r"[^\w.+-]+", "-", text).lstrip(".+-").rstrip("-")[:128]
    return out or "run"


class AugmentConfig(_Section):
    """Training-batch augmentation for 1-D signals (seeded; never applied to val/test)."""

    shift: int = Field(0, ge=0, description="max circular shift in samples")
    scale: float = Field(0.0, ge=0, lt=1, description="multiply by 1+U(-scale, scale)")
    noise: float = Field(0.0, ge=0, description="std of added Gaussian noise")


class DataConfig(_Section):
    name: str = Field("mnist1d", description="mnist1d | digits | glyphs | text | npz | csv | pkg.module:Dataset")
    path: Optional[str] = None  # for npz / csv
    target: str = "label"  # csv label column
    kwargs: dict[str, Any] = Field(default_factory=dict)  # for an import-path Dataset
    num_samples: int = Field(5000, gt=0)  # mnist1d (at least MIN_MNIST1D_SAMPLES) and glyphs only
    # the classifier's output size when the data holds only some classes (a continual task: labels 2 and 3
    # of a 10-way head); None: the largest label + 1. Labels at or above it are refused.
    num_classes: Optional[int] = Field(None, ge=2)
    batch_size: int = Field(100, gt=0)
    val_split: float = Field(0.1, ge=0, lt=1)
    test_split: float = Field(0.2, ge=0, lt=1)  # when the source has no test set of its own
    stratify: bool = True
    augment: AugmentConfig = Field(default_factory=AugmentConfig)
    bucketing: bool = False  # variable-length sequences (data.name=text, mode: paragraphs): batch similar lengths
    # csv, hf:PATH, parquet:PATH (docs/data.md): feature columns by name, in this order (None: every column but
    # data.target, in the file's order)
    features: Optional[list[str]] = None
    shuffle_window: int = Field(4096, gt=0)  # shards:/parquet: rows shuffled together after the seeded shard order
    # shards:/parquet: a truncated or corrupt shard (or sample): stop with one line, or leave it out and
    # count it (summary.json data_skipped)
    on_bad_shard: Literal["fail", "skip"] = "fail"
    # loader workers (data/loader.py): 0 reads batches in the training process (the fast path for in-memory data)
    workers: int = Field(0, ge=0)
    prefetch: int = Field(2, gt=0)  # batches each worker prepares ahead
    # page-locked batches, so the loop's non_blocking host-to-GPU copies do not wait (CUDA only);
    # auto: on when training on CUDA, with or without workers (data/loader.py `pins`)
    pin_memory: Union[bool, Literal["auto"]] = "auto"
    persistent_workers: bool = False  # keep workers across epochs and evaluations
    input_bound_share: float = Field(0.3, gt=0, le=1)  # warn when the loop waits for data more than this share
    # names the data's content for the resume check (a version tag, a manifest hash); None: ecotrain hashes
    # in-memory arrays whole and a map-style Dataset by its length and a fixed sample of 16 items
    fingerprint: Optional[str] = Field(None, min_length=1)

    @model_validator(mode="after")
    def _workers_options(self) -> "DataConfig":
        if self.persistent_workers and self.workers == 0:
            raise ValueError("persistent_workers needs data.workers > 0")
        if self.kwargs and (fmt := data_format(self.name)) is not None and not fmt.kwargs:
            # these read none: a kwarg here (data.kwargs.num_samples=500 for digits) was silently ignored
            raise ValueError(f"data.kwargs {sorted(self.kwargs)}: data.name={self.name} takes none (they are for "
                             "mnist1d, text, tokens:, .bin shards and an import-path Dataset); remove them")
        return self

    @field_validator("num_samples")
    @classmethod
    def _enough_samples(cls, v: int) -> int:
        if v < MIN_MNIST1D_SAMPLES:
            raise ValueError(f"must be >= {MIN_MNIST1D_SAMPLES}: mnist1d makes num_samples // 10 per class, "
                             "then splits them into train, validation and test")
        return v




OPTIMIZERS = ("adamw", "adam", "sgd")  # the built-in optim.name values (optim.py)


class OptimConfig(_Section):
    """A built-in optimizer, or any torch.optim.Optimizer subclass by import path (`torch.optim:RAdam`),
    built with the parameter groups (each with optim.lr and its weight decay) and optim.kwargs."""

    name: str = Field("adamw", description="adamw | adam | sgd | pkg.module:Optimizer")
    kwargs: dict[str, Any] = Field(default_factory=dict)  # an import-path optimizer's other arguments (eps, ...)
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    momentum: float = Field(0.9, ge=0, lt=1)  # sgd only
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = (0.9, 0.999)  # adam(w) only
    # auto: fused Adam/AdamW kernels (one kernel for all parameters; ~1.4x a tiny model's step on CPU)
    implementation: Literal["auto", "fused", "foreach", "for-loop"] = "auto"  # built-ins only

    @field_validator("name")
    @classmethod
    def _builtin_or_path(cls, v: str) -> str:
        module, sep, attr = v.partition(":")
        if v in OPTIMIZERS or (sep and module and attr):
            return v
        raise ValueError(f"one of {', '.join(OPTIMIZERS)}, or the import path 'pkg.module:Class' of a "
                         "torch.optim.Optimizer subclass, e.g. 'torch.optim:RAdam'")

    @field_validator("kwargs")
    @classmethod
    def _kwargs_for_paths(cls, v: dict, info) -> dict:
        owned = sorted({"params", "lr", "weight_decay"} & set(v))
        if owned:
            raise ValueError(f"'{owned[0]}' comes from the parameter groups: set optim.{owned[0]}, not in kwargs"
                             if owned[0] != "params" else "'params' are the model's parameter groups, not a kwarg")
        if v and info.data.get("name") in OPTIMIZERS:
            raise ValueError(f"kwargs are for an import-path optimizer (optim.name=pkg.module:Class, e.g. "
                             f"torch.optim:AdamW); the built-in {info.data['name']} is set by optim.betas, "
                             "optim.momentum and optim.implementation")
        return v


class ScheduleConfig(_Section):
    name: Literal["constant", "cosine", "onecycle", "step"] = "constant"
    interval: Literal["step", "epoch"] = "step"
    warmup: int = Field(0, ge=0, description="linear warmup length, in `interval` units")
    min_lr_ratio: float = Field(0.0, ge=0, le=1)  # cosine / onecycle floor, as a fraction of lr
    step_size: int = Field(1000, gt=0)  # step schedule: decay every step_size intervals
    gamma: float = Field(0.1, gt=0, le=1)
    pct_start: float = Field(0.3, gt=0, lt=1)  # onecycle: fraction spent rising


class LoopConfig(_Section):
    max_steps: Optional[int] = Field(None, gt=0)
    max_epochs: Optional[int] = Field(10, gt=0)
    accumulate: int = Field(1, gt=0, description="micro-batches per optimizer step")
    # the optimizer step stays data.batch_size * accumulate samples; each rank splits its share into
    # micro-batches of this size, so a run resumed on fewer ranks accumulates more (distributed.py)
    micro_batch_size: Optional[int] = Field(None, gt=0, description="samples per micro-batch on each rank")
    grad_clip: Optional[float] = Field(None, gt=0, description="max global grad norm")
    eval_every: Optional[int] = Field(None, gt=0, description="steps between evals; None: each epoch")
    log_every: int = Field(50, gt=0)
    label_smoothing: float = Field(0.0, ge=0, lt=1)

    @model_validator(mode="after")
    def _some_budget(self) -> "LoopConfig":
        if self.max_steps is None and self.max_epochs is None:
            raise ValueError("set loop.max_steps or loop.max_epochs (or both)")
        return self


class TaskConfig(_Section):
    """What is learned (task.py): the loss, its units and the metrics. auto: from the data (a dict
    batch: the model returns its loss; float targets: regression; else classification)."""

    name: Literal["auto", "classification", "multilabel", "regression", "sequence", "language_model",
                  "model_loss"] = "auto"
    loss: Literal["mse", "l1", "huber"] = "mse"  # regression only
    target: Optional[Union[int, str]] = None  # the batch's target: tuple position or dict key; None: last tensor / 'labels'
    threshold: float = Field(0.5, gt=0, lt=1)  # multilabel: a label is on when its sigmoid is above this


class EarlyStoppingConfig(_Section):
    enabled: bool = False
    monitor: str = "val_loss"
    mode: Literal["min", "max"] = "min"
    patience: int = Field(5, gt=0, description="evaluations without improvement")
    min_delta: float = Field(0.0, ge=0)
    restore_best: bool = True


class DivergenceConfig(_Section):
    """What a diverging step (a non-finite loss or gradient, or a loss spike) does: stop the run, skip
    the step, or roll back to the last good checkpoint with a lower LR (docs/reliability.md)."""

    action: Literal["stop", "skip", "rollback"] = "stop"
    max_skips: int = Field(10, ge=0)  # skip mode: stop after this many non-finite steps
    check_every: int = Field(1, gt=0)  # >1 avoids a host sync per step on GPUs
    check_grads: bool = False  # one process: also check the gradients (a NaN gradient under a finite loss)
    spike_factor: Optional[float] = Field(None, gt=1)  # a loss above this x its running mean diverges too
    max_rollbacks: int = Field(3, ge=0)  # rollback mode: stop after this many rollbacks
    rollback_lr_factor: float = Field(0.5, gt=0, le=1)  # each rollback multiplies the LR by this


class CallbackSpec(_Section):
    path: str = Field(description="pkg.module:Class of an ecotrain Callback")
    kwargs: dict[str, Any] = Field(default_factory=dict)


class LoggingConfig(_Section):
    # auto: a bar when stderr is a TTY, else a plain log line every `progress_seconds` (CI, nohup, a pipe)
    progress: Literal["auto", "on", "off"] = "auto"
    progress_seconds: float = Field(30.0, gt=0)

    @field_validator("progress", mode="before")
    @classmethod
    def _yaml_on_off(cls, v):  # YAML 1.1 reads a bare on/off as true/false
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v


class LedgerConfig(_Section):
    """The cost ledger (docs/ledger.md): FLOPs, hours, energy, CO2e and money of every run."""

    enabled: bool = True
    energy: Literal["codecarbon", "off"] = "codecarbon"  # CodeCarbon's OfflineEmissionsTracker; never online

    @field_validator("energy", mode="before")
    @classmethod
    def _yaml_off(cls, v):  # YAML 1.1 reads a bare `off` as false
        return "off" if v is False else v
    country: Optional[str] = Field(None, description="ISO code of the grid (FR or FRA); None: world average")
    carbon_intensity: Optional[float] = Field(None, ge=0, description="g CO2e/kWh; overrides the country's")
    pue: float = Field(1.0, ge=1.0, description="data-centre power usage effectiveness")
    tracking_mode: Literal["process", "machine"] = "process"  # process: this run's CPU share, not the neighbours'
    sample_seconds: float = Field(2.0, gt=0)  # CodeCarbon's power sampling interval (a background thread)
    prices: dict[str, float] = Field(default_factory=dict, description="price per device-hour by device name")
    currency: str = "USD"
    # dense peak FLOP/s of one device for MFU, where accounting/peaks.py has none (a CPU: a measured matmul peak)
    peak_flops: Optional[float] = Field(None, gt=0)


class BudgetConfig(_Section):
    """Stop cleanly (`stopped_because: budget:<name>`) once a budget is spent; None: no limit."""

    max_flops: Optional[float] = Field(None, gt=0)  # training + evaluation FLOPs
    max_wall_seconds: Optional[float] = Field(None, gt=0)
    max_cpu_hours: Optional[float] = Field(None, gt=0)
    max_energy_kwh: Optional[float] = Field(None, gt=0)
    max_co2e_kg: Optional[float] = Field(None, gt=0)
    max_cost: Optional[float] = Field(None, gt=0)  # in ledger.currency


class MlflowConfig(_Section):
    """tracking/mlflow_tracker.py: params, per-step metrics, the ledger and the run folder in an MLflow store."""

    tracking_uri: Optional[str] = Field(None, description="None: sqlite:///mlflow.db in the working directory "
                                        "(what `mlflow ui` opens there); or sqlite:///path.db, http://server")
    experiment: str = "ecotrain"
    run_name: Optional[str] = None  # None: the config's name
    artifacts: bool = True  # upload the run folder's files at the end (checkpoints/ only with `checkpoints`)
    checkpoints: bool = False
    registered_model: Optional[str] = None  # register_champion's model name (the continual registry's promotions)


class TensorboardConfig(_Section):
    """tracking/tensorboard_tracker.py: torch.utils.tensorboard event files."""

    log_dir: Optional[str] = None  # None: RUN/tensorboard


class TrackingConfig(_Section):
    """Trackers beside metrics.jsonl, each one an optional extra: `tracking: {mlflow: {}, tensorboard: {}}`;
    on the command line `tracking.tensorboard=true`."""

    mlflow: Optional[MlflowConfig] = None
    tensorboard: Optional[TensorboardConfig] = None

    @field_validator("mlflow", "tensorboard", mode="before")
    @classmethod
    def _on_off(cls, v):  # true: on with the defaults; false: off
        return {True: {}, False: None}.get(v, v) if isinstance(v, bool) else v


class Config(_Section):
    """A whole run. `ecotrain fit RECIPE key.sub=value ...` builds one of these."""

    name: str = "run"  # a name (letters, digits, . _ + -), not a path: the run folder is runs/<name>-<time>
    seed: int = Field(0, ge=0, lt=2**32)  # what numpy and every sampler accept (seed + epoch must not overflow)
    deterministic: bool = True  # torch.use_deterministic_algorithms; needed for exact resume
    device: Literal["auto", "cpu", "cuda"] = "auto"
    precision: Literal["fp32", "bf16-mixed", "fp16-mixed"] = "fp32"
    # TF32 for fp32 matmuls and convolutions (precision.use_tf32): auto = on for fp32 on an Ampere or newer
    # GPU (compute capability >= 8.0), where it is several times faster at ~1e-3 relative error; off elsewhere
    tf32: Literal["auto", "on", "off"] = "auto"
    compile: bool = False  # torch.compile the model (checkpoints keep the plain module's keys)
    # torch's intra-op threads; auto: the cores this process may use (affinity, cgroup quota, ranks, loader
    # workers, other busy processes; threads.py); the user's OMP_NUM_THREADS wins over auto
    threads: Union[Literal["auto"], Annotated[int, Field(gt=0)]] = "auto"
    task: TaskConfig = Field(default_factory=TaskConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    loop: LoopConfig = Field(default_factory=LoopConfig)
    early_stopping: EarlyStoppingConfig = Field(default_factory=EarlyStoppingConfig)
    divergence: DivergenceConfig = Field(default_factory=DivergenceConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    preemption: PreemptionConfig = Field(default_factory=PreemptionConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    callbacks: list[CallbackSpec] = Field(default_factory=list)
    methods: list[MethodConfig] = Field(default_factory=list)
    ledger: LedgerConfig = Field(default_factory=LedgerConfig)
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    carbon: CarbonConfig = Field(default_factory=CarbonConfig)  # timing by a grid forecast (config/carbon.py)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)

    @field_validator("name")
    @classmethod
    def _name_not_path(cls, v: str) -> str:
        if not _NAME_RE.fullmatch(v):
            raise ValueError("a run name is a name, not a path: letters, digits and . _ + - (up to 128), "
                             "not starting with '.', '+' or '-'; choose the folder with --run-dir")
        return v

    @model_validator(mode="after")
    def _budget_needs_ledger(self) -> "Config":
        spent = [k for k, v in self.budget.model_dump().items() if v is not None]
        if spent and not self.ledger.enabled:
            raise ValueError(f"budget.{spent[0]} needs the ledger (ledger.enabled=true)")
        energy = [k for k in spent if k in ("max_energy_kwh", "max_co2e_kg")]
        if energy and self.ledger.energy == "off":
            raise ValueError(f"budget.{energy[0]} needs energy measurement (ledger.energy=codecarbon)")
        return self

    @model_validator(mode="after")
    def _chunked_loss_needs_whole_parameters(self) -> "Config":
        if (self.memory.chunked_loss == "on" and self.distributed.strategy == "fsdp"
                and self.distributed.fsdp.reshard_after_forward):  # zero2 keeps them gathered: allowed
            raise ValueError("memory.chunked_loss=on with distributed.strategy=fsdp: the chunked head multiplies "
                             "by the LM head's weight, which FSDP keeps sharded between its forward and backward; "
                             "use distributed.strategy=zero2 (parameters whole) or ddp, or memory.chunked_loss=off")
        return self

    @model_validator(mode="after")
    def _rollback_needs_checkpoints(self) -> "Config":
        if self.divergence.action == "rollback" and not (self.checkpoint.every_n_steps or self.checkpoint.every_epoch):
            raise ValueError("divergence.action=rollback needs checkpoints to roll back to: set "
                             "checkpoint.every_n_steps (or checkpoint.every_epoch)")
        return self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


# every character str.splitlines breaks at: a key or value holding one must not split the error line
_LINE_BREAKS = str.maketrans({c: repr(c)[1:-1] for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"})


def _one_line(text: str) -> str:
    return text.translate(_LINE_BREAKS)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


# the tag pydantic puts at the end of a loc for each member of a Union (`threads.literal['auto']`,
# `...constrained-int`, `...EveryN`); config keys are snake_case, so a tag is never a key
_UNION_MEMBER = re.compile(r"literal\[.*\]|constrained-\w+|function-\w+\[.*\]|int|float|str|bool|[A-Z]\w*")


def _merge_union_members(errors: list[dict]) -> list[dict]:
    """A value no member of a Union takes is reported once per member, under a loc ending in the member's
    tag: one error for the key, the members' wants joined ("should be 'auto', or greater than 0"), not
    "config key 'threads.literal['auto']': Input should be 'auto' (and 1 more problem after this one)"."""
    out: list[dict] = []
    for e in errors:
        loc = e["loc"]
        if not (loc and isinstance(loc[-1], str) and _UNION_MEMBER.fullmatch(loc[-1])):
            out.append(e)
            continue
        prev = out[-1] if out else None
        if prev is not None and prev.get("union") == loc[:-1] and prev.get("input") == e.get("input"):
            prev["msg"] += ", or " + e["msg"].removeprefix("Input should be ")
        else:
            out.append({**e, "loc": loc[:-1], "union": loc[:-1]})
    return out


def _format(err: ValidationError, source: str) -> str:
    errors = _merge_union_members(err.errors())
    e = errors[0]
    key = ".".join(str(p) for p in e["loc"]) or "(top level)"
    if e["type"] == "extra_forbidden":
        msg = "unknown key"
    elif e["type"] == "union_tag_invalid":  # pydantic's words name its own machinery ("method_name()")
        ctx = e.get("ctx", {})
        msg = (f"'{ctx.get('tag')}' is not one of {ctx.get('expected_tags')}"
               + (", nor a third-party `pkg.module:Class`" if key.startswith("methods") else ""))
    elif e["type"] == "union_tag_not_found":
        msg = "needs a 'name' key"
    else:
        msg = e["msg"].removeprefix("Value error, ")
        if "input" in e and not isinstance(e["input"], dict):
            msg += f" (got {_short(e['input'])})"
    n = len(errors)
    more = f" (and {n - 1} more problem{'s' if n > 2 else ''} after this one)" if n > 1 else ""
    return _one_line(f"{source}: config key '{key}': {msg}{more}")


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for p in parts[:-1]:
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise ConfigError(_one_line(f"override '{dotted}': '{p}' is not a section"))
        node = child
    node[parts[-1]] = value


MAX_YAML_NODES = 1_000_000  # a recipe is small; aliases that expand past this are a "billion laughs"


class _RecipeLoader(yaml.SafeLoader):
    """safe_load that refuses a key given twice in one mapping (with its line): the last one would
    silently win, and a recipe whose `lr:` appears twice is a mistake to point at, not to guess."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise ConfigError(f"line {key_node.start_mark.line + 1}: key '{key}' is given twice in this "
                                  f"mapping (first on line {seen[key]}); keep one")
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _expanded_size(tree, limit: int = MAX_YAML_NODES) -> int:
    """Nodes of `tree` once its aliases are expanded, stopping past `limit` (shared nodes counted once per
    use, memoised: a DAG of aliases is measured without expanding it)."""
    memo: dict[int, int] = {}

    def size(x) -> int:
        if isinstance(x, (dict, list)):
            if id(x) not in memo:
                memo[id(x)] = 0  # a cycle counts as nothing more
                items = x.values() if isinstance(x, dict) else x
                total = 1
                for v in items:
                    total += size(v)
                    if total > limit:
                        break
                memo[id(x)] = total
            return memo[id(x)]
        return 1
    return size(tree)


def load_yaml(text: str, where: str):
    """A recipe's YAML: safe, no duplicate keys, aliases bounded. One ConfigError line for anything else."""
    try:
        tree = yaml.load(text, Loader=_RecipeLoader)  # noqa: S506 (a SafeLoader subclass)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if _expanded_size(tree) > MAX_YAML_NODES:
        raise ConfigError(f"{where}: its aliases expand to more than {MAX_YAML_NODES:,} values (a 'billion "
                          "laughs'); write the recipe out without nested aliases")
    return tree


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`["optim.lr=3e-3", "loop.max_epochs=5"]` -> nested dict; values parsed as YAML scalars."""
    tree: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(_one_line(f"override '{item}': expected key.sub=value"))
        if not all(part.strip() for part in key.split(".")):
            raise ConfigError(_one_line(f"override '{item}': an empty key part in '{key}'; expected key.sub=value"))
        try:
            value = load_yaml(raw, f"override '{item}'") if raw != "" else None
        except (yaml.YAMLError, ValueError, RecursionError):  # PyYAML: a bad date is a ValueError; deep nesting
            value = raw  # taken as the string it is
        _set_dotted(tree, key.strip(), value)
    return tree


def merge_trees(base: dict, extra: dict) -> dict:
    """`extra` over `base`, section by section; an empty mapping (`data={}`) empties the section, so it
    takes every default, instead of changing nothing."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = merge_trees(out[k], v) if isinstance(v, dict) and v and isinstance(out.get(k), dict) else v
    return out




def build_config(tree: dict[str, Any], source: str = "config") -> Config:
    try:
        return Config.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(_format(err, source)) from None


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> Config:
    """Load a recipe YAML (or the defaults when `path` is None) and apply dotted overrides."""
    tree: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        p = Path(path)
        source = str(p)
        user_path(p, "recipe", "give a recipe file (YAML), e.g. recipes/mnist1d_cnn.yaml")  # no FIFO, no device
        try:
            text = safefile.read_bytes(p, "recipe", 16 * safefile.MiB, fix="a recipe is YAML text").decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{p}: not a text file (byte {exc.start} is not UTF-8); a recipe is YAML text") from None
        except OSError as exc:
            raise ConfigError(f"{p}: cannot read the recipe ({exc.strerror or exc})") from None
        try:
            tree = load_yaml(text, str(p))
        except yaml.YAMLError as exc:
            where = getattr(exc, "problem_mark", None)
            line = f" line {where.line + 1}" if where else ""
            raise ConfigError(f"{p}:{line} not valid YAML") from None
        except ValueError as exc:  # PyYAML builds dates with datetime: `2001-02-30` raises here
            raise ConfigError(_one_line(f"{p}: not valid YAML: {exc}")) from None
        except RecursionError:
            raise ConfigError(f"{p}: not valid YAML: nested too deeply") from None
        if tree is None:
            raise ConfigError(f"{p}: the recipe is empty; put in it the keys to set, e.g. 'data: {{name: digits}}' "
                              "and 'model: {name: mlp}' (an empty mapping '{}' takes every default)")
        if not isinstance(tree, dict):
            raise ConfigError(f"{p}: a recipe must be a mapping of keys")
        tree.setdefault("name", safe_name(p.stem))
    if overrides:
        tree = merge_trees(tree, parse_overrides(overrides))
        source += " + overrides"
    return build_config(tree, source)


def diff_configs(old: dict, new: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ: `['optim.lr: 0.01 -> 0.003']`."""
    out = []
    for k in sorted(set(old) | set(new)):
        a, b, key = old.get(k), new.get(k), f"{prefix}{k}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += diff_configs(a, b, key + ".")
        elif a != b:
            out.append(f"{key}: {a!r} -> {b!r}")
    return out
