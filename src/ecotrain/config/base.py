"""The strict base of every config section, and the model section (shared by a run and by a
distillation teacher). Kept apart from config/__init__.py so that the method configs (config/methods.py) can
use them without an import cycle."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Section(BaseModel):
    # allow_inf_nan=False: every float of the schema (nested ones too: betas, prices) must be finite
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class ModelConfig(Section):
    name: str = Field("cnn", description="mlp | cnn | resnet | cnn2d | charlm | nanogpt | causal_lm | pkg.module:Class")
    kwargs: dict[str, Any] = Field(default_factory=dict)
    dropout: float = Field(0.0, ge=0, lt=1)
