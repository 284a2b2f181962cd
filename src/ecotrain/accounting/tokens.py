"""ledger.json `tokens`: a language model's cost per token, for runs whose data says how many tokens a
sample holds (`tokens_per_sample`: a packed sequence's length; the mean real length of padded ones).

Tokens trained = samples trained (all ranks) x tokens per sample. FLOPs per token are the measured
step's (forward + backward, attention included: flops.py) per sample over the tokens per
sample. The run's energy, CO2e and money (training and its evaluations) are restated per million
tokens trained.
"""

from __future__ import annotations

from typing import Optional

from ecotrain.core.flops import StepFlops

MILLION = 1e6


def tokens_section(samples: int, tokens_per_sample: float, step: Optional[StepFlops], kwh: Optional[float],
                   co2e_kg: Optional[float], cost: Optional[float], currency: str) -> dict:
    tokens = samples * tokens_per_sample

    def per_million(v: Optional[float]) -> Optional[float]:
        return v / tokens * MILLION if v is not None and tokens > 0 else None

    return {"trained": tokens, "per_sample": tokens_per_sample,
            "flops_per_token": step.per_sample / tokens_per_sample if step else None,
            "forward_flops_per_token": step.forward_per_sample / tokens_per_sample if step else None,
            "per_million": {"energy_kwh": per_million(kwh), "co2e_kg": per_million(co2e_kg),
                            "cost": per_million(cost), "currency": currency},
            "method": "samples trained x tokens per sample; FLOPs per token from the measured step; the run's "
                      "energy, CO2e and cost (training and evaluation) per million tokens trained"}


def interval_rate(tokens_now: float, tokens_then: float, seconds: float) -> Optional[float]:
    """Tokens per second over a log interval (None when no time passed)."""
    return (tokens_now - tokens_then) / seconds if seconds > 0 else None
