"""Budgets: which one is spent, and the forecast from the first epoch.

`spend` dicts use the ledger's own names (flops, wall_seconds, cpu_hours, energy_kwh, co2e_kg, cost).
When each budget is checked (the Ledger callback does it):
  max_flops            every step, exact; the run never starts a training step it cannot afford
  max_wall_seconds,    every 8 steps (two clock reads); overshoot at most 8 steps
  max_cpu_hours, max_cost
  max_energy_kwh,      at each log interval (loop.log_every) and epoch end, on the live estimate
  max_co2e_kg
"""

from __future__ import annotations

from typing import Optional

SPEND_OF = {"max_flops": "flops", "max_wall_seconds": "wall_seconds", "max_cpu_hours": "cpu_hours",
            "max_energy_kwh": "energy_kwh", "max_co2e_kg": "co2e_kg", "max_cost": "cost"}
CLOCK_BUDGETS = ("max_wall_seconds", "max_cpu_hours", "max_cost")
ENERGY_BUDGETS = ("max_energy_kwh", "max_co2e_kg")


def spent(spend: dict, limits: dict, names=SPEND_OF) -> Optional[str]:
    """The first budget in `names` whose spend reached its limit, else None."""
    for name in names:
        limit, value = limits.get(name), spend.get(SPEND_OF[name])
        if limit is not None and value is not None and value >= limit:
            return name
    return None


def forecast(spend: dict, step: int, planned_steps: int, limits: dict) -> dict:
    """Linear extrapolation of `spend` at `step` to `planned_steps` (the schedule's budget)."""
    scale = planned_steps / step
    totals = {k: (v * scale if isinstance(v, (int, float)) else None) for k, v in spend.items()}
    over = []
    for name, limit in limits.items():
        total = totals.get(SPEND_OF[name])
        if total is not None and total > limit:
            per_step = spend[SPEND_OF[name]] / step
            over.append({"budget": name, "limit": limit, "forecast": total,
                         "stops_near_step": int(limit / per_step) if per_step > 0 else None})
    return {"method": f"forecast: linear extrapolation from step {step} (end of the first epoch) "
                      f"to the {planned_steps} planned steps; early stopping may end the run sooner",
            "at_step": step, "planned_steps": planned_steps, "totals": totals, "over_budget": over}


def warning_lines(fc: dict) -> list[str]:
    return [f"forecast (linear, from the first epoch): budget.{o['budget']}={o['limit']:g} "
            f"will be spent before the {fc['planned_steps']} planned steps (about {o['forecast']:.3g} needed); "
            f"the run will stop near step {o['stops_near_step']}" for o in fc["over_budget"]]
