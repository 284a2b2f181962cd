"""The run's survival sections of the config: `checkpoint:`, `preemption:` and `distributed:`
(callbacks/checkpointing.py, preemption.py, distributed.py; docs/distributed.md). Kept apart from
config/__init__.py, which only holds the fields; `ecotrain.config` re-exports them."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, field_validator, model_validator

from ecotrain.config.base import Section as _Section


class CheckpointConfig(_Section):
    every_n_steps: Optional[int] = Field(None, gt=0)
    # by default a save at least every 10 minutes of training (null: off), never more than ~1% of the
    # run's time: a killed run loses minutes, not the run
    every_minutes: Optional[float] = Field(10.0, gt=0)
    every_epoch: bool = False
    on_best: bool = False  # save when the monitored validation metric improves
    at_end: bool = True  # a final checkpoint, so the run can be extended later
    keep_last: int = Field(2, ge=1)  # plus the best, when on_best
    background: bool = False  # write in a thread; tensors are snapshot first


MAX_POLL_SECONDS = 3600.0


class PreemptionConfig(_Section):
    """How a spot machine's notice reaches the run (preemption.py): SIGTERM always; a file that appears
    or an HTTP endpoint that answers (the cloud's metadata server) when set."""

    grace_seconds: float = Field(25.0, gt=0)  # notice -> complete checkpoint must fit in this (warned when not)
    notice_file: Optional[str] = None  # a path whose appearance is the notice (a SLURM/K8s preStop hook touches it)
    notice_url: Optional[str] = None  # polled; a 200 answer other than "", "false", "none" is the notice
    poll_seconds: float = Field(1.0, gt=0)  # how often notice_file / notice_url are checked (in a thread)

    @field_validator("poll_seconds")
    @classmethod
    def _poll_bound(cls, v: float) -> float:
        if v > MAX_POLL_SECONDS:  # a notice comes minutes before the machine goes; 1e10 s overflowed the wait
            raise ValueError(f"at most {MAX_POLL_SECONDS:g} seconds; a notice comes 30 s to 2 minutes before the "
                             "machine is taken, so poll every few seconds (default 1)")
        return v

    @field_validator("notice_url")
    @classmethod
    def _http(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError(f"{v!r} is not an http:// or https:// address (e.g. GCP's "
                             "http://metadata.google.internal/computeMetadata/v1/instance/preempted)")
        return v


class FsdpConfig(_Section):
    cpu_offload: bool = False  # parameters, gradients and optimizer state live on the CPU
    reshard_after_forward: bool = True  # ZeRO-3; False keeps parameters gathered until backward (ZeRO-2-like)


class DistributedConfig(_Section):
    """Picked up from torchrun's environment; gloo on CPU, nccl on CUDA. data.batch_size is global."""

    # zero2: FSDP2 with gradients and optimizer state sharded, parameters kept gathered from forward to
    # backward (fsdp.reshard_after_forward=false); read as that fsdp config, so resume, resharding and
    # every FSDP rule apply to it unchanged
    strategy: Literal["none", "ddp", "fsdp", "zero2"] = "none"
    fsdp: FsdpConfig = Field(default_factory=FsdpConfig)

    @model_validator(mode="before")
    @classmethod
    def _zero2_is_fsdp(cls, v):
        if isinstance(v, dict) and v.get("strategy") == "zero2":
            fsdp = v.get("fsdp") or {}
            fsdp = fsdp.model_dump() if hasattr(fsdp, "model_dump") else fsdp
            v = {**v, "strategy": "fsdp", "fsdp": {**fsdp, "reshard_after_forward": False}}
        return v
    timeout_seconds: float = Field(300, gt=0)  # a collective waiting longer than this fails with a clear error
    # rank 0's own work (a synchronous checkpoint write, the final weights, files and trackers' upload) may take
    # this long: the other ranks wait for it on a CPU barrier, never inside a collective of training
    rank0_timeout_seconds: float = Field(3600, gt=0)
