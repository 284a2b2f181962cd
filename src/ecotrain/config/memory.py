"""The `memory:` section of a run's config (core/levers.py, memory/planner.py): activation
checkpointing, offload, the chunked loss, optimizer-state offload, OOM recovery and the byte budget."""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import Field, field_validator, model_validator

from ecotrain.config.base import Section as _Section
from ecotrain.base.units import parse_bytes


class EveryN(_Section):
    every_n: int = Field(gt=0)  # checkpoint blocks 0, K, 2K, ...


class NamedModules(_Section):
    modules: list[str] = Field(min_length=1)  # qualified-name globs (`blocks.*`) or class names (`Block`)


class MemoryConfig(_Section):
    """Memory levers (core/levers.py): activation checkpointing and out-of-memory recovery."""

    activation_checkpointing: Union[Literal["off", "all"], EveryN, NamedModules] = "off"
    min_micro_batch: int = Field(1, gt=0)  # OOM recovery halves the micro-batch down to this, then gives up
    release_freed: bool = False  # glibc: return freed tensors >= 1 MiB to the OS, so RSS follows live tensors
    # bytes ("2GiB", "512MiB"): measure exactly-equivalent plans and train with the fastest that fits (memory/planner.py)
    budget: Optional[int] = None
    budget_margin: float = Field(0.05, ge=0, lt=0.5)  # the chosen plan's measured peak stays under budget * (1 - margin)
    allow_precision_change: bool = False  # the budget search may switch fp32 <-> bf16-mixed (not exact maths)
    search_steps: int = Field(3, ge=2)  # training steps per measured plan (the first is not timed)
    # plans measured after the baseline, at most (+1 when none fits); a plan at 95% of the usable budget ends it
    search_candidates: int = Field(8, ge=1)
    # what a checkpointed block keeps (core/selective.py): attention outputs, or every matmul output
    checkpoint_policy: Literal["attention", "matmuls"] = "attention"
    # saved activations of the blocks not checkpointed go to host memory (CUDA) or a file in the run
    # folder (CPU) (core/offload.py); bf16: stored as bfloat16 (lossy: needs allow_precision_change)
    activation_offload: Literal["off", "on", "bf16"] = "off"
    # how many of those blocks are offloaded, from the first (a finer step for memory.budget); None: all
    offload_blocks: Optional[int] = Field(None, ge=1)
    offload_dir: Optional[str] = None  # where CPU offload writes; None: the run folder
    eval_batch_size: Optional[int] = Field(None, gt=0)  # evaluation's batch; None: data.batch_size * 4
    # the LM head + cross-entropy over chunks of loss_chunk tokens, logits recomputed in backward (core/chunked_loss.py)
    chunked_loss: Literal["off", "on"] = "off"
    loss_chunk: int = Field(1024, gt=0)  # tokens per chunk: one chunk's logits [loss_chunk, vocab] is the peak
    # optimizer state between steps: in the run folder (CPU) or pinned host memory (CUDA) (core/optim_offload.py)
    optimizer_offload: Literal["off", "on"] = "off"
    # the levers memory.budget may pull (micro_batches and chunked_loss out: bit-identical losses); shard:
    # under torchrun, the strategy too (ddp, zero2 or fsdp: memory/shard.py), else the configured one
    budget_levers: list[Literal["checkpoint", "selective", "offload", "micro_batches", "chunked_loss",
                                "optimizer_offload", "shard"]] = Field(
        default_factory=lambda: ["checkpoint", "selective", "offload", "micro_batches", "chunked_loss",
                                 "optimizer_offload", "shard"])

    @field_validator("activation_offload", "chunked_loss", "optimizer_offload", mode="before")
    @classmethod
    def _yaml_on_off(cls, v):  # YAML 1.1 reads a bare on/off as true/false
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v

    @model_validator(mode="after")
    def _lossy_needs_permission(self) -> "MemoryConfig":
        if self.activation_offload == "bf16" and not self.allow_precision_change:
            raise ValueError("activation_offload=bf16 stores activations in bfloat16 (gradients change): set "
                             "memory.allow_precision_change=true, or activation_offload=on (lossless)")
        return self

    @field_validator("budget", mode="before")
    @classmethod
    def _bytes(cls, v):
        return None if v is None else parse_bytes(v)

    @field_validator("activation_checkpointing", mode="before")
    @classmethod
    def _yaml_off(cls, v):
        return {False: "off", True: "all"}.get(v, v) if isinstance(v, bool) else v  # YAML reads `off` as false
