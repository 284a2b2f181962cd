"""The `methods:` entries of a config: one section per module under methods/, joined into
`MethodConfig`, a pydantic union discriminated by `name`; a name with ':' (`pkg.module:MyMethod`) is a
third-party method (`UserMethodConfig`). config/__init__.py re-exports every name here.

A built-in method is registered once, by its section: a `_Builtin` subclass whose `name` is its recipe
name and whose `impl` is its class as 'module:Class' (methods/__init__.py imports it only when a recipe
names it, so this module stays free of torch)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Optional, Union, get_args

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from ecotrain.config.base import ModelConfig
from ecotrain.config.base import Section as _Section

_REGISTERED: list[type["_Builtin"]] = []  # every built-in method's section, in the order of this file


class _Builtin(_Section):
    """A built-in method's section. `impl`: its Method class, 'ecotrain.methods.module:Class', called as
    `Class(entry, run, trained)` (methods/base.py); defining the subclass registers it."""

    impl: ClassVar[str]

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if "impl" in vars(cls):  # a section of its own, not a shared base (_FromSection)
            _REGISTERED.append(cls)


class EmaConfig(_Builtin):
    """methods/ema.py: evaluate, test and save an exponential moving average of the weights."""

    name: Literal["ema"]
    impl: ClassVar[str] = "ecotrain.methods.ema:EMA"
    decay: float = Field(0.999, gt=0, lt=1)
    every: int = Field(1, gt=0)  # steps between updates
    warmup: bool = True  # decay min(decay, (1+n)/(10+n)) over the first updates


class BatchNormConfig(_Builtin):
    """methods/batchnorm.py: what BatchNorm's running statistics do while fine-tuning (docs/finetuning.md)."""

    name: Literal["batchnorm"]
    impl: ClassVar[str] = "ecotrain.methods.batchnorm:BatchNormPolicy"
    # train: the default (naive); freeze_stats: BN in eval mode, gamma/beta still train; recompute: exact
    # statistics of the train data after training; groupnorm: BN -> GroupNorm; momentum: BN momentum set below;
    # domain: running statistics per domain key, the pre-trained ones kept for every other domain
    policy: Literal["train", "freeze_stats", "recompute", "groupnorm", "momentum", "domain"] = "train"
    momentum: Optional[float] = Field(None, gt=0, le=1)  # policy momentum only (required there); PyTorch's is 0.1
    # policy domain: the domain key of this run's training data (required there), how its statistics are
    # made (running: BN's running average of its batches; recompute: exact statistics of its data at the end),
    # and earlier domains' statistics carried over from a run (folder or export.safetensors) trained so
    domain: Optional[str] = Field(None, pattern=r"^[A-Za-z0-9_.-]+$")
    domain_stats: Literal["running", "recompute"] = "running"
    domains_from: Optional[str] = None
    groups: Optional[int] = Field(None, gt=0)  # policy groupnorm only: groups per layer (default 32)
    recompute_batch_size: int = Field(256, gt=0)  # policy recompute: batch size of the statistics pass
    warn_gap: float = Field(0.05, ge=0, le=1)  # bn report: warn when eval- and train-mode val accuracy differ more

    @model_validator(mode="after")
    def _options_fit_policy(self) -> "BatchNormConfig":
        if self.policy == "momentum" and self.momentum is None:
            raise ValueError("policy momentum needs a value: momentum: 0.01 (PyTorch's default is 0.1)")
        if self.momentum is not None and self.policy != "momentum":
            raise ValueError(f"momentum is set but policy is {self.policy}; use policy: momentum")
        if self.groups is not None and self.policy != "groupnorm":
            raise ValueError(f"groups is set but policy is {self.policy}; use policy: groupnorm")
        if self.policy == "domain" and self.domain is None:
            raise ValueError("policy domain needs the domain key of this run's data: domain: clinic_b")
        if self.policy != "domain" and (self.domain is not None or self.domains_from is not None
                                        or self.domain_stats != "running"):
            raise ValueError(f"domain, domain_stats and domains_from are set but policy is {self.policy}; "
                             "use policy: domain")
        return self


class FinetuneConfig(_Builtin):
    """methods/finetune.py: freeze layers, per-group learning rates (docs/finetuning.md)."""

    name: Literal["finetune"]
    impl: ClassVar[str] = "ecotrain.methods.finetune:FineTune"
    freeze: list[str] = Field(default_factory=list)  # parameter-name globs; `stem` also matches `stem.*`
    freeze_depth: int = Field(0, ge=0)  # freeze the first N top-level children that hold parameters
    # glob -> multiplier of optim.lr; the first glob that matches a parameter wins, the rest get 1
    lr_multipliers: dict[str, Annotated[float, Field(gt=0)]] = Field(default_factory=dict)


class DedupConfig(_Builtin):
    """methods/dedup.py: drop exact and near-duplicate training samples (docs/efficiency.md)."""

    name: Literal["dedup"]
    impl: ClassVar[str] = "ecotrain.methods.dedup:Dedup"
    near: bool = True  # also near-duplicates (same near key); false: exact copies only
    points: int = Field(16, gt=0)  # near key: the z-normalised sample averaged down to this many points,
    step: float = Field(0.25, gt=0)  # ... rounded to this grid (in standard deviations of the sample)


class CurriculumConfig(_Builtin):
    """methods/curriculum.py: the first epochs ordered easy to hard by a per-sample score."""

    name: Literal["curriculum"]
    impl: ClassVar[str] = "ecotrain.methods.curriculum:Curriculum"
    score: Literal["loss", "file"] = "loss"  # loss: each sample's loss under `reference`; file: `path`
    reference: Optional[str] = None  # score loss: a run folder or checkpoint folder (a trained model)
    path: Optional[str] = None  # score file: a .npy with one score per train sample (after dedup)
    epochs: int = Field(1, gt=0)  # epochs ordered easy to hard; later ones: the plain seeded shuffle
    window: int = Field(4, gt=0)  # batches shuffled together inside the easy-to-hard order
    count_reference: bool = True  # add the reference run's own training FLOPs (its ledger.json) to this run

    @model_validator(mode="after")
    def _source(self) -> "CurriculumConfig":
        if self.score == "loss" and not self.reference:
            raise ValueError("score loss needs reference: a trained run folder (or use score: file with path)")
        if self.score == "file" and not self.path:
            raise ValueError("score file needs path: a .npy of one score per train sample")
        return self


class SelectiveBackpropConfig(_Builtin):
    """methods/selective.py: forward the whole batch, backpropagate only its highest-loss samples."""

    name: Literal["selective_backprop"]
    impl: ClassVar[str] = "ecotrain.methods.selective:SelectiveBackprop"
    keep: float = Field(0.5, gt=0, le=1)  # fraction of each effective batch that is backpropagated
    start_step: int = Field(0, ge=0)  # full backprop before this step


class ProgressiveResizeConfig(_Builtin):
    """methods/resize.py: shorter (downsampled or cropped) inputs early in training."""

    name: Literal["progressive_resize"]
    impl: ClassVar[str] = "ecotrain.methods.resize:ProgressiveResize"
    scales: list[Annotated[float, Field(gt=0, lt=1)]] = Field(default_factory=lambda: [0.5, 0.75], min_length=1)
    until: list[Annotated[float, Field(gt=0, lt=1)]] = Field(default_factory=lambda: [0.25, 0.5], min_length=1)
    mode: Literal["auto", "downsample", "crop"] = "auto"  # auto: crop token sequences, downsample signals

    @model_validator(mode="after")
    def _stages(self) -> "ProgressiveResizeConfig":
        if len(self.scales) != len(self.until):
            raise ValueError(f"scales ({len(self.scales)}) and until ({len(self.until)}) need one entry per stage")
        if any(b <= a for a, b in zip(self.until, self.until[1:])):
            raise ValueError("until: stage ends (fractions of the planned steps) must increase")
        return self


class BatchRampConfig(_Builtin):
    """methods/batch_ramp.py: small batches first, up to data.batch_size, with an explicit LR rule."""

    name: Literal["batch_ramp"]
    impl: ClassVar[str] = "ecotrain.methods.batch_ramp:BatchRamp"
    lr_scaling: Literal["none", "linear", "sqrt"]  # lr x (batch / data.batch_size)^(0 | 1 | 1/2); no default
    start: float = Field(0.25, gt=0, lt=1)  # the first batch size, as a fraction of data.batch_size
    steps: int = Field(500, gt=0)  # optimizer steps until the full batch size
    stages: int = Field(3, gt=0)  # distinct smaller sizes on the way (each change re-measures FLOPs)


class LateFreezeConfig(_Builtin):
    """methods/late_freeze.py: freeze the first layers for the last part of training."""

    name: Literal["late_freeze"]
    impl: ClassVar[str] = "ecotrain.methods.late_freeze:LateFreeze"
    freeze: list[str] = Field(default_factory=list)  # parameter-name globs, as finetune's
    freeze_depth: int = Field(0, ge=0)  # or the first N top-level children that hold parameters
    at: float = Field(0.75, gt=0, lt=1)  # when, as a fraction of the planned steps

    @model_validator(mode="after")
    def _what(self) -> "LateFreezeConfig":
        if not self.freeze and not self.freeze_depth:
            raise ValueError("say what to freeze: freeze: [globs] or freeze_depth: N")
        return self


class StabilityStopConfig(_Builtin):
    """methods/stability.py: stop once the validation metric has stopped moving."""

    name: Literal["stability_stop"]
    impl: ClassVar[str] = "ecotrain.methods.stability:StabilityStop"
    monitor: str = "val_loss"
    window: int = Field(5, ge=2)  # the last N evaluations
    tolerance: float = Field(0.005, gt=0)  # stable: (max - min) over the window <= tolerance x |mean|
    min_steps: int = Field(0, ge=0)  # never before this step


class DistillConfig(_Builtin):
    """methods/distill.py: train this (smaller) model on a teacher's soft targets (docs/efficiency.md)."""

    name: Literal["distill"]
    impl: ClassVar[str] = "ecotrain.methods.distill:Distill"
    teacher: str = Field(description="the teacher: a run folder, a checkpoint folder or a .safetensors file")
    teacher_model: Optional[ModelConfig] = None  # the teacher's model section; default: its run's config.yaml
    alpha: float = Field(0.5, ge=0, le=1)  # loss = alpha * KD + (1 - alpha) * task loss
    temperature: float = Field(2.0, gt=0)
    cache: bool = True  # the teacher's logits over the train set once (a one-off pass in the ledger)
    count_teacher: bool = True  # add the teacher's own training FLOPs (its ledger.json) to this run's


class PruneConfig(_Builtin):
    """methods/prune.py: magnitude pruning on a gradual schedule; structured pruning shrinks the layers."""

    name: Literal["prune"]
    impl: ClassVar[str] = "ecotrain.methods.prune:Prune"
    kind: Literal["unstructured", "structured"] = "unstructured"
    amount: float = Field(0.5, gt=0, lt=1)  # the final fraction of weights (unstructured) or channels (structured)
    scope: Literal["global", "layer"] = "global"  # unstructured: one magnitude threshold for all layers, or each its own
    norm: Literal[1, 2] = 1  # structured: channels ranked by the L1 or L2 norm of their weights
    start_step: int = Field(0, ge=0)
    end_step: Optional[int] = Field(None, gt=0)  # the final amount is reached here; None: half the planned steps
    every: int = Field(10, gt=0)  # steps between pruning stages
    schedule: Literal["cubic", "linear"] = "cubic"  # cubic (Zhu & Gupta 2017): prune fast early, gently late
    modules: list[str] = Field(default_factory=list)  # module-name globs; empty: every Conv1d/Linear (but the head)

    @model_validator(mode="after")
    def _steps(self) -> "PruneConfig":
        if self.end_step is not None and self.end_step <= self.start_step:
            raise ValueError(f"end_step ({self.end_step}) must be after start_step ({self.start_step})")
        return self


class QatConfig(_Builtin):
    """methods/qat.py: quantization-aware training with torchao (the `qat` extra); nn.Linear layers only."""

    name: Literal["qat"]
    impl: ClassVar[str] = "ecotrain.methods.qat:QAT"
    weight_dtype: Literal["int8", "int4"] = "int8"  # activations: int8, dynamic, per token
    group_size: Optional[int] = Field(None, gt=0)  # weight scales per group of inputs; None: one per output row
    modules: list[str] = Field(default_factory=list)  # module-name globs; empty: every nn.Linear


class _FromSection(_Builtin):
    # `from` is a Python keyword: the field is `from_`, read and written as `from`
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False, populate_by_name=True,
                              serialize_by_alias=True)


class ReplayConfig(_FromSection):
    """methods/replay.py: a bounded buffer of past examples, replayed in every step (docs/continual.md)."""

    name: Literal["replay"]
    impl: ClassVar[str] = "ecotrain.methods.replay:Replay"
    size: int = Field(500, gt=0)  # examples kept, at most
    ratio: float = Field(0.2, gt=0, lt=1)  # replay rows' share of each step's rows (0.2: 80% new, 20% replay)
    weight: float = Field(1.0, ge=0)  # lambda: loss = CE(new) + lambda * CE(replay)
    selection: Literal["balanced", "reservoir"] = "balanced"  # class-balanced, or a uniform sample of the stream
    hard_weight: float = Field(1.0, ge=1)  # loss weight of kept examples the model gets wrong (1: off)
    rare_weight: bool = False  # loss weight median/count for classes rarer than the median (at most 10)
    from_: Optional[str] = Field(None, alias="from")  # the previous version's buffer: run folder or .safetensors
    # DER++ (Buzzega et al. 2020): the buffer keeps each example's logits; loss += logit_weight * MSE(logits, stored)
    logits: bool = False
    logit_weight: float = Field(0.5, ge=0)  # the paper's alpha (its beta, the replayed labels' CE, is `weight`)


class EwcConfig(_FromSection):
    """methods/ewc.py: elastic weight consolidation, beta * sum F (theta - theta_old)^2 (docs/continual.md)."""

    name: Literal["ewc"]
    impl: ClassVar[str] = "ecotrain.methods.ewc:EWC"
    beta: float = Field(100.0, ge=0)
    gamma: float = Field(1.0, gt=0, le=1)  # online EWC: the previous Fisher's decay when this version's is added
    samples: int = Field(1000, gt=0)  # training examples the Fisher is estimated on (a seeded subset)
    fisher: Literal["empirical", "expected"] = "empirical"  # grads of log p(label), or E over the model's classes
    from_: Optional[str] = Field(None, alias="from")  # the previous version's Fisher/theta: run folder or .safetensors


class LwfConfig(_Builtin):
    """methods/lwf.py: learning without forgetting, KL to the previous version's outputs (docs/continual.md)."""

    name: Literal["lwf"]
    impl: ClassVar[str] = "ecotrain.methods.lwf:LwF"
    teacher: Optional[str] = None  # the previous version: run folder or model.safetensors; None: the term is off
    alpha: float = Field(1.0, ge=0)
    temperature: float = Field(2.0, gt=0)
    on_new: bool = True  # distil on the new rows (false, with replay: the old examples only, as DER does)
    on_replay: bool = True  # also distil on the replay rows when methods.replay is on


class AverageConfig(_FromSection):
    """methods/average.py: the final weights become alpha * trained + (1 - alpha) * previous (docs/continual.md)."""

    name: Literal["average"]
    impl: ClassVar[str] = "ecotrain.methods.average:Average"
    # previous: the weights the run was initialised from (fit's init_from); else a run folder or .safetensors file
    with_: str = Field("previous", alias="with", min_length=1)
    alpha: Union[float, Literal["auto"]] = 0.5  # the trained weights' share; auto: the best of `grid` on val
    grid: list[float] = Field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0], min_length=1)  # alpha auto

    @model_validator(mode="after")
    def _alphas_in_range(self) -> "AverageConfig":
        named = ([("alpha", self.alpha)] if self.alpha != "auto" else []) + [("grid value", a) for a in self.grid]
        for what, a in named:
            if not 0.0 <= a <= 1.0:
                raise ValueError(f"{what} {a} is outside [0, 1] (1: the trained weights, 0: the previous ones)")
        return self


class AdaptersConfig(_FromSection):
    """methods/adapters.py: LoRA adapters through PEFT on a frozen backbone (the `adapters` extra)."""

    name: Literal["adapters"]
    impl: ClassVar[str] = "ecotrain.methods.adapters:Adapters"
    target_modules: list[str] = Field(min_length=1)  # module names (PEFT matches name suffixes), Linear or Conv1d
    r: int = Field(8, gt=0)
    alpha: float = Field(16.0, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    train_modules: list[str] = Field(default_factory=list)  # trained in full beside the adapters (a new head)
    merge: bool = False  # fold the adapters into the weights at the end: model.safetensors is a plain model
    from_: Optional[str] = Field(None, alias="from")  # continue from a PEFT adapter folder (RUN/adapter)


class UserMethodConfig(BaseModel):
    """A third-party method by import path: `{name: pkg.module:MyMethod, alpha: 0.1}` builds
    `MyMethod(alpha=0.1)` (a Method subclass or a factory returning one; methods/__init__.py)."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)  # every key but name: its kwargs
    name: str = Field(description="pkg.module:Method")  # resolved (and refused) when the methods are built

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


BUILTIN_METHODS = tuple(_REGISTERED)
USER_METHOD = "pkg.module:Method"  # the tag of an import-path entry, listed beside the built-in names in errors


def method_name(entry) -> Any:
    """The tag that picks an entry's section: its name, or USER_METHOD for an import path."""
    name = entry.get("name") if isinstance(entry, dict) else getattr(entry, "name", None)
    return USER_METHOD if isinstance(name, str) and ":" in name else name


def _tagged(cls: type[BaseModel]):
    return Annotated[cls, Tag(get_args(cls.model_fields["name"].annotation)[0])]


# One section per method module under methods/, picked by `name` (a discriminated union; an error's key
# is `methods.<i>.<name>.<field>`), and any Method by import path.
MethodConfig = Annotated[Union[(*map(_tagged, BUILTIN_METHODS), Annotated[UserMethodConfig, Tag(USER_METHOD)])],
                         Discriminator(method_name)]
