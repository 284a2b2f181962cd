"""The stakeholder's plan (`ecotrain green` writes OUT/plan.json and OUT/plan.md, and a section of
green.html): what a production run of the green recipe costs against the baseline's, in CO2e and
money, in three families, each said to be measured or modelled.

- **model and data** (measured): the green recipe against the baseline, the same grid and price on
  both sides. From the confirmation on fresh seeds when there is one (paired means; 95% interval of
  each ratio, compare.cut_interval), else the search's design-seed ratio (one pair: no interval).
- **infrastructure**, on top of it, never instead:
  - *grid region* (modelled): the region's annual mean intensity over the run's (CodeCarbon's
    per-country data; `--plan-region`). CO2e only: a price per hour is not a region's.
  - *carbon-aware timing* (modelled): the mean forecast intensity of the cleanest slots that hold a
    run before the deadline, over the intensity at the forecast's start (accounting/forecast.py
    `chosen_slots`; `--carbon-forecast`, `--deadline`, default 24 h). CO2e only.
  - *spot / preemptible capacity*: the price ratio (modelled: `--spot-price-ratio`, default 0.35 of
    on-demand) times 1 + the overhead of preemptions: `--preemptions-per-hour` (modelled) x what one
    costs, **measured** on this search's runs: the checkpoint save time the loop waited
    (summary.json `checkpoint_blocked_seconds`), a restart (a timed resume of the chosen trial's
    finished run: data, model, checkpoint read and checks, in process), and the work redone since the
    last save (half the checkpoint interval at the run's measured step rate). Money only; the
    redone work's energy is in the CO2e factor too.
- **total**: the factors multiplied (CO2e: model x region x timing; money: model x spot) with the
  measured family's interval (the modelled factors are points, said so), and each family's share of
  the total saving (its log factor over the total's).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Optional

from ecotrain.accounting.compare import cut_interval
from ecotrain.accounting.energy import co2e_intensity
from ecotrain.accounting.forecast import chosen_slots, intensity_at, parse_deadline, read_forecast
from ecotrain.accounting.report import figure, read_ledger, read_summary
from ecotrain.base.errors import ConfigError
from ecotrain.base.rundir import atomic_write, write_json
from ecotrain.base.runfiles import SUMMARY

SPOT_PRICE_RATIO = 0.35  # spot / on-demand: the big clouds' spot discounts are ~60-90%; a round, modest one
PREEMPTIONS_PER_HOUR = 0.2  # modelled; put your provider's interruption rate


def _ratio(base: list[str], green: list[str], key: str) -> dict:
    b = [float(figure(read_ledger(r), key) or 0.0) for r in base]
    g = [float(figure(read_ledger(r), key) or 0.0) for r in green]
    mb, mg = sum(b) / len(b), sum(g) / len(g)
    out = {"ratio": mg / mb if mb else None, "low": None, "high": None, "n": len(b)}
    if len(b) > 1 and len(g) > 1 and mb:
        low_cut, high_cut = cut_interval(b, g, 0.5, len(b) == len(g))
        out.update(low=1 - high_cut, high=1 - low_cut)  # the ratio's interval is 1 - the cut's
    return out


def model_family(search, confirmation) -> dict:
    """Measured: the green recipe over the baseline in energy, CO2e and money."""
    if confirmation is not None:
        from ecotrain.base.groupfile import read_group

        base, green = read_group(confirmation.base_group), read_group(confirmation.green_group)
        how = f"measured: the confirmation on fresh seeds, {len(base)} paired runs per side, ratio of the means"
    else:
        base, green = [search.baseline["run_dir"]], [search.chosen.run_dir]
        how = "measured: the design seed's pair (baseline and chosen trial), one run per side: no interval"
    return {"family": "model and data", "kind": "measured", "how": how,
            "co2e": _ratio(base, green, "co2e"), "money": _ratio(base, green, "cost"),
            "energy": _ratio(base, green, "energy")}


def check_region(region: Optional[str]) -> None:
    """--plan-region read before the search trains (the plan is written after it: a region CodeCarbon
    does not know must not cost the whole search first)."""
    if region is None:
        return
    if not region.strip():
        raise ConfigError("--plan-region is empty; give a country code, e.g. SE, or leave the flag out")
    try:
        co2e_intensity(region, None)
    except ConfigError as exc:
        raise ConfigError(f"--plan-region {region}: {exc}") from None


def region_factor(ledger: dict, region: Optional[str]) -> dict:
    now = (ledger.get("co2e") or {}).get("g_per_kwh")
    out = {"family": "grid region", "kind": "modelled", "co2e": 1.0, "money": 1.0}
    if not region or not now:
        return {**out, "how": "not assessed (give --plan-region, a country code, e.g. SE)"}
    g, grid, source = co2e_intensity(region, None)
    return {**out, "co2e": g / now, "how": f"{grid} {g:.0f} g/kWh over the run's {ledger['co2e'].get('grid')} "
            f"{now:.0f} g/kWh ({source}; annual means); the price per hour taken as the same"}


def timing_factor(forecast: Optional[str], deadline: Optional[str], run_seconds: float) -> dict:
    out = {"family": "carbon-aware timing", "kind": "modelled", "co2e": 1.0, "money": 1.0}
    if not forecast:
        return {**out, "how": "not assessed (give --carbon-forecast FILE)"}
    slots = read_forecast(forecast)
    start = slots[0].start
    end = parse_deadline(deadline, start) if deadline else start + 24 * 3600
    picked = chosen_slots(slots, start, run_seconds, end)
    now = intensity_at(slots, start)
    if not picked or now <= 0:
        return {**out, "how": f"{forecast}: no cleaner slots before the deadline hold the run; train now"}
    held = sum(p.seconds for p in picked)
    mean = sum(p.g_per_kwh * p.seconds for p in picked) / held
    return {**out, "co2e": mean / now, "how": f"{forecast}: the cleanest slots before the deadline average "
            f"{mean:.0f} g/kWh against {now:.0f} at its start (a {run_seconds:.0f} s run; the forecast's own figures)"}


def restart_seconds(recipe: str, overrides: list[str], row, seed: int, fit=None) -> Optional[float]:
    """Measured: a resume of the chosen trial's finished run, in process (assemble, checkpoint read
    and the resume's checks) through `fit` (trainer.fit, handed in by the command: the plan is a wing
    below the assembly); None when it cannot be timed."""
    from ecotrain.config import load_config

    if fit is None or row is None or not row.run_dir or not (Path(row.run_dir) / SUMMARY).is_file():
        return None
    cfg = load_config(recipe, [*overrides, f"seed={seed}", *row.overrides])
    t = time.perf_counter()
    try:
        fit(cfg, run_dir=row.run_dir, resume="auto", quiet=True)
    except Exception:  # noqa: BLE001 - a plan is written without the figure rather than not at all
        return None
    return time.perf_counter() - t


def spot_factor(run_dir: str, cfg_every_minutes: Optional[float], restart: Optional[float], price_ratio: float,
                per_hour: float) -> dict:
    s = read_summary(Path(run_dir), {})
    wall = float(read_ledger(run_dir).get("wall_seconds") or 0.0)
    save = float(s.get("checkpoint_blocked_seconds") or 0.0)
    interval = (cfg_every_minutes or 10.0) * 60
    redo = min(interval, wall) / 2  # on average half the interval since the last save is trained again
    per_event = save + (restart or 0.0) + redo
    overhead = per_hour * per_event / 3600
    how = (f"spot price {price_ratio:g}x on-demand (modelled), {per_hour:g} preemptions per training hour "
           f"(modelled), each costing {per_event:.1f} s (measured: checkpoint save {save:.2f} s, restart "
           + (f"{restart:.2f} s, a resume of the finished run in process; a fresh process adds its interpreter and "
              "torch import" if restart is not None else "not timed")
           + f"; redone work {redo:.1f} s, half the {interval / 60:g}-minute checkpoint interval or of a run "
           f"of {wall:.1f} s): overhead {overhead * 100:.2f}% of the time")
    return {"family": "spot capacity", "kind": "modelled price and rate, measured overhead", "how": how,
            "co2e": 1 + overhead, "money": price_ratio * (1 + overhead), "overhead": overhead,
            "per_preemption_seconds": per_event, "save_seconds": save, "restart_seconds": restart,
            "redo_seconds": redo}


def total(model: dict, infra: list[dict]) -> dict:
    out = {}
    for key in ("co2e", "money"):
        m = model[key]
        if m["ratio"] is None:
            out[key] = None
            continue
        f = math.prod(x[key] for x in infra)
        whole = m["ratio"] * f
        logs = {"model and data": math.log(m["ratio"]), **{x["family"]: math.log(x[key]) for x in infra}}
        saved = math.log(whole)
        out[key] = {"ratio": whole, "low": m["low"] * f if m["low"] is not None else None,
                    "high": m["high"] * f if m["high"] is not None else None,
                    "saving": 1 - whole,
                    "shares": {k: (v / saved if saved < 0 else None) for k, v in logs.items()},
                    "interval": "the measured family's 95% interval times the modelled factors (points)"
                    if m["low"] is not None else "no interval: one run per side"}
    return out


def write_plan(out: Path, search, confirmation, recipe: str, overrides: list[str], seed: int,
               region: Optional[str] = None, forecast: Optional[str] = None, deadline: Optional[str] = None,
               price_ratio: float = SPOT_PRICE_RATIO, per_hour: float = PREEMPTIONS_PER_HOUR,
               every_minutes: Optional[float] = None, fit=None) -> dict:
    """plan.json and plan.md in `out`; `fit` (trainer.fit, from green's command) times the restart."""
    model = model_family(search, confirmation)
    green_run = search.chosen.run_dir
    ledger = read_ledger(green_run)
    restart = restart_seconds(recipe, overrides, search.chosen, seed, fit)
    infra = [region_factor(ledger, region), timing_factor(forecast, deadline, float(ledger.get("wall_seconds") or 0)),
             spot_factor(green_run, every_minutes, restart, price_ratio, per_hour)]
    plan = {"families": [model, *infra], "total": total(model, infra),
            "note": "the model and data family is the headline (same grid and price on both sides); the "
                    "infrastructure families are on top of it, modelled where said"}
    write_json(out / "plan.json", plan)
    atomic_write(out / "plan.md", markdown(plan).encode())
    return plan


def _pct(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.3f}x"


def lines(plan: dict) -> list[tuple[str, str, str, str, str]]:
    """(family, kind, CO2e factor, money factor, how) rows, then the total."""
    rows = []
    for f in plan["families"]:
        c, m = f["co2e"], f["money"]
        c = c if isinstance(c, dict) else {"ratio": c, "low": None}
        m = m if isinstance(m, dict) else {"ratio": m, "low": None}
        cell = lambda d: _pct(d["ratio"]) + (f" [{d['low']:.3f}, {d['high']:.3f}]" if d.get("low") is not None else "")  # noqa: E731
        rows.append((f["family"], f["kind"], cell(c), cell(m), f["how"]))
    for key in ("co2e", "money"):
        t = plan["total"].get(key)
        if t:
            shares = ", ".join(f"{k} {v * 100:.0f}%" for k, v in t["shares"].items() if v is not None)
            rows.append((f"total {key}", "", _pct(t["ratio"]) + (f" [{t['low']:.3f}, {t['high']:.3f}]"
                                                                 if t["low"] is not None else ""), "",
                         f"saving {t['saving'] * 100:.1f}%; shares of the saving: {shares}; {t['interval']}"))
    return rows


def markdown(plan: dict) -> str:
    out = ["# The plan: CO2e and money of a production run, green recipe over the baseline", "",
           plan["note"] + ".", "", "| family | measured or modelled | CO2e | money | how |", "|---|---|---|---|---|"]
    out += [f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in lines(plan)]
    return "\n".join(out) + "\n"
