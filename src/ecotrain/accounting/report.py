"""ledger.json: write, read, print, and restate a run's CO2e on other grids (`ecotrain ledger`).

Also the one schema for reading back a run's summary.json and ledger.json (`read_summary`,
`read_ledger`, `check_numbers`): typed, and the quantities ecotrain writes (seconds, FLOPs, kWh, CO2e,
money, counts) finite and not negative, so a damaged or hand-edited file is one line naming the file
and the field, never a NaN or negative figure published by `card`, `compare` or `report`. Metrics
(`test_*`, `val_*`, `train_*`, `best_val_metric`) may be negative, and NaN (a diverged run's).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional, Sequence

from ecotrain.base.errors import ConfigError
from ecotrain.base.jsonfile import read_json
from ecotrain.base.runfiles import CONFIG, LEDGER, SUMMARY

# the figures `compare --by` and the tables use, each read from one place in ledger.json
FIGURES = {
    "flops": ("FLOPs", lambda L: (L.get("flops") or {}).get("total")),
    "wall_seconds": ("wall s", lambda L: L.get("wall_seconds")),
    "cpu_seconds": ("CPU s", lambda L: L.get("cpu_seconds")),
    "energy": ("energy kWh", lambda L: L["energy"].get("kwh")),
    "co2e": ("CO2e kg", lambda L: L["co2e"].get("kg")),
    "cost": ("cost", lambda L: L["cost"].get("amount")),
}


LEDGER_FIELDS = {"energy": dict, "co2e": dict, "cost": dict}  # the sections every reader of ledger.json meets


# metrics where less is better, by name without the split prefix (val_, test_, train_); any other is "more"
LOWER_IS_BETTER = ("loss", "perplexity", "bits_per_char", "bits_per_byte", "mse", "mae", "wer", "cer")


def lower_is_better(metric: str) -> bool:
    """The direction of a summary.json metric for `compare`, `green` and `--until-decided`: a loss, a
    perplexity, bits per char/byte and an error are better lower; accuracy, F1, R2 higher."""
    name = metric.split("_", 1)[1] if metric.startswith(("val_", "test_", "train_")) else metric
    return "loss" in name or name in LOWER_IS_BETTER


def figure(ledger: dict, key: str) -> Optional[float]:
    return FIGURES[key][1](ledger)


def contended(ledger: dict) -> bool:
    """Whether a ledger's measured figures were taken under contention (contention.py; older ledgers:
    unknown, False). Here, not in contention.py, which imports the callbacks and so torch: compare and
    report read finished runs and need none."""
    return bool((ledger.get("contention") or {}).get("seen"))


def missing_reason(ledger: dict, key: str) -> str:
    section = {"energy": "energy", "co2e": "co2e", "cost": "cost"}.get(key)
    if section:
        return ledger[section].get("missing_reason") or "not recorded"
    return "no step was measured" if key == "flops" else "not recorded"


def write_ledger(run_dir: Path, ledger: Optional[dict]) -> None:
    from ecotrain.base.rundir import write_json

    if ledger is not None:
        write_json(Path(run_dir) / LEDGER, ledger)


def read_ledger(run_dir, table: bool = False) -> dict:
    """A run folder's ledger.json; one line naming the file when it is missing or unreadable."""
    path = Path(run_dir) / LEDGER
    if not path.is_file():
        if not Path(run_dir).is_dir():
            raise ConfigError(f"{run_dir}: not a run folder (no such folder; looked for {path})")
        if not (Path(run_dir) / CONFIG).is_file():
            raise ConfigError(f"{run_dir}: not a run folder (no ledger.json, no config.yaml); "
                              "give a folder that `ecotrain fit` wrote")
        raise ConfigError(f"{run_dir}: no ledger.json (the run had ledger.enabled=false, or did not finish)")
    ledger = read_json(path, "ledger", LEDGER_FIELDS)
    check_readable(ledger, path, table)
    return ledger


def read_summary(run_dir, fields: Optional[dict] = None) -> dict:
    """A run folder's summary.json read back with the schema above (`fields`: what the caller needs
    besides, as jsonfile.read_json takes them)."""
    path = Path(run_dir) / SUMMARY
    summary = read_json(path, "run summary", fields)
    check_numbers(summary, path, SUMMARY_STRINGS)
    return summary


def check_readable(ledger: dict, path, table: bool = True) -> None:
    """The ledger read as its reader will (each figure; with `table`, also the table and the run's last
    line), once, here: a damaged file, or one from another version, is one line naming it, not a
    KeyError deep in a command."""
    check_numbers(ledger, path)
    try:
        if table:
            format_ledger(ledger)
            summary_line(ledger)
        for key in FIGURES:
            figure(ledger, key)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        what = f"no '{exc.args[0]}'" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
        raise ConfigError(f"{path}: damaged, or written by another ecotrain version ({what}); restore it, or run "
                          "the training again") from None


# where ecotrain writes numbers (or null) in summary.json and ledger.json: dotted paths from the top
NUMERIC_PATHS = frozenset("""
    co2e.g_per_kwh co2e.kg cost.amount cost.price_per_device_hour cpu_hours cpu_seconds wall_seconds
    device.count device_hours.cpu device_hours.gpu energy.components_kwh.cpu energy.components_kwh.gpu
    energy.components_kwh.ram energy.kwh energy.pue energy.startup_kwh energy.startup_seconds epochs
    energy.meter_startup.wait_seconds energy.meter_startup.cpu_seconds
    flops.eval flops.eval_passes flops.eval_samples_per_pass flops.forward_per_sample flops.measured_step_flops
    flops.measured_step_samples flops.per_train_sample flops.remeasured flops.total flops.train samples segments
    steps data_wait_share oom_recoveries rollbacks samples_per_second samples_seen skipped_nonfinite_steps
    steps_per_second train_seconds world_size contention.load contention.slowdown gpu_peak_memory_bytes
    memory.gpu_peak_allocated_bytes memory.gpu_peak_reserved_bytes memory.gpu_total_bytes memory.host_peak_rss_bytes
    tokens_seen tokens_per_second tokens.trained tokens.per_sample tokens.flops_per_token tokens.forward_flops_per_token
    tokens.per_million.energy_kwh tokens.per_million.co2e_kg tokens.per_million.cost mfu.value
    mfu.achieved_flops_per_second mfu.peak_flops_per_second mfu.devices
""".split())


SUMMARY_STRINGS = frozenset("dataset_hash device last_checkpoint monitor name stopped_because".split())
QUANTITIES = NUMERIC_PATHS | {"best_step"}  # finite and 0 or more wherever they appear
NUMERIC_PATHS = QUANTITIES | {"best_val_metric"}


def check_numbers(tree, path, strings: frozenset = frozenset(), prefix: str = "") -> None:
    """One line when a hand-edited or damaged run file holds text where ecotrain wrote a number (the
    paths above, and every top-level test_/val_/train_ metric), or a quantity that is NaN, infinite or
    negative, before any arithmetic meets it."""
    if not isinstance(tree, dict):
        return
    for k, v in tree.items():
        key = f"{prefix}{k}"
        numeric = key in NUMERIC_PATHS or (not prefix and k.startswith(("test_", "val_", "train_")))
        if numeric and v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ConfigError(f"{path}: '{key}' is {json.dumps(v)[:40]}, not a number; the file was edited or "
                              "damaged: restore it, or run the training again")
        if key in QUANTITIES and v is not None and not (math.isfinite(v) and v >= 0):
            raise ConfigError(f"{path}: '{key}' is {json.dumps(v)}, not a finite number of 0 or more; the file was "
                              "edited or damaged: restore it, or run the training again")
        if key in strings and v is not None and not isinstance(v, str):
            raise ConfigError(f"{path}: '{key}' is {json.dumps(v)[:40]}, not text; the file was edited or "
                              "damaged: restore it, or run the training again")
        if isinstance(v, dict):
            check_numbers(v, path, strings, key + ".")


def num(x, unit: str = "") -> str:
    if x is None:
        return "n/a"
    return f"{x:.3g}{unit}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = lambda r: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)  # noqa: E731
                              for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([fmt(header), "  ".join("-" * w for w in widths), *map(fmt, rows)])


def summary_line(L: dict) -> str:
    """The one line `ecotrain fit` ends with."""
    e, c, m = L["energy"], L["co2e"], L["cost"]
    why = (e.get("missing_reason") or "")[:80]
    energy = f"{num(e['kwh'])} kWh ({e['method']})" if e["kwh"] is not None else f"energy n/a ({why})"
    co2 = (f"{num(c['kg'] * 1000)} gCO2e ({c['grid']}, {c['g_per_kwh']:.0f} g/kWh)" if c["kg"] is not None
           else "CO2e n/a")
    cost = f"{num(m['amount'])} {m['currency']}" if m["amount"] is not None else "cost n/a"
    return (f"ledger: {num(figure(L, 'flops'))} FLOPs, {L['wall_seconds']:.1f} s wall, {L['cpu_seconds']:.1f} CPU-s, "
            f"{energy}, {co2}, {cost}" + ("; measured on a busy machine (ledger.json contention)"
                                          if (L.get("contention") or {}).get("seen") else ""))


def format_ledger(L: dict) -> str:
    f, e, c, m, b = L["flops"], L["energy"], L["co2e"], L["cost"], L["budget"]
    hours = ", ".join(f"{k}: {v:.3g}" for k, v in L["device_hours"].items())
    lines = [
        f"run {L['name']}: {L['steps']} steps, {L['samples']} samples, stopped: {L['stopped_because']}"
        + (f", {L['segments']} segments" if L["segments"] > 1 else ""),
        f"wall          {L['wall_seconds']:.3f} s",
        f"CPU           {L['cpu_seconds']:.3f} s ({L['cpu_hours']:.3g} CPU-hours, children included)",
        f"device-hours  {hours} ({L['device']['count']} x {L['device']['unit']})",
        (f"FLOPs         {num(f['total'])} = {num(f['train'])} train + {num(f['eval'])} eval  [{f['method']}]"
         if f else "FLOPs         n/a (no step was measured)"),
        (f"energy        {num(e['kwh'])} kWh, {e['method']}: {e['how']}  [{e['source']}]" if e["kwh"] is not None
         else f"energy        n/a: {e['missing_reason']}"),
        (f"CO2e          {num(c['kg'] * 1000)} g at {c['g_per_kwh']:.1f} g/kWh ({c['grid']}; {c['source']})"
         if c["kg"] is not None else f"CO2e          n/a: {c['missing_reason']}"),
        (f"cost          {num(m['amount'])} {m['currency']} at {m['price_per_device_hour']} per device-hour "
         f"({m['source']})" if m["amount"] is not None else f"cost          n/a: {m['missing_reason']}"),
        "budget        " + (", ".join(f"{k}={v:g}" for k, v in b["limits"].items()) or "none")
        + (f" (stopped by {b['stopped_by']})" if b["stopped_by"] else ""),
    ]
    lines += lm_lines(L)
    fc = L.get("forecast")
    if fc:
        over = ", ".join(f"{o['budget']} near step {o['stops_near_step']}" for o in fc["over_budget"]) or "no budget"
        lines.append(f"forecast      at step {fc['at_step']} of {fc['planned_steps']}: over budget: {over}  "
                     f"[{fc['method']}]")
    busy = L.get("contention") or {}
    if busy.get("seen"):
        lines.append(f"contention    measured on a busy machine: load up to {busy['load']} on {busy['cpus']} CPUs, steps "
                     f"up to {busy['slowdown']}x slower than the fastest; time, CPU and energy are inflated")
    mem = L.get("memory") or {}  # older ledgers have none
    if mem.get("gpu_peak_allocated_bytes") is not None:
        lines.append(f"GPU memory    peak {mib(mem['gpu_peak_allocated_bytes'])} allocated, "
                     f"{mib(mem['gpu_peak_reserved_bytes'])} reserved of {mib(mem['gpu_total_bytes'])} "
                     f"({mem['gpu_name']}; the largest rank's)")
    if mem.get("host_peak_rss_bytes") is not None:
        lines.append(f"host memory   peak RSS {mib(mem['host_peak_rss_bytes'])} (the process: interpreter, "
                     "libraries and data included)")
    lines += [f"note          {n}" for n in e.get("notes", [])]
    return "\n".join(lines)


def lm_lines(L: dict) -> list[str]:
    """A language model's per-token figures (ledger.json `tokens`) and MFU (`mfu`; older ledgers: none)."""
    out, t, u = [], L.get("tokens"), L.get("mfu")
    if t:
        pm = t["per_million"]
        cost = f"{num(pm['cost'])} {pm['currency']}" if pm["cost"] is not None else "cost n/a"
        out.append(f"tokens        {num(t['trained'])} trained ({num(t['per_sample'])} a sample), "
                   f"{num(t['flops_per_token'])} FLOPs a token (forward + backward, attention included)")
        out.append(f"per 1M tokens {num(pm['energy_kwh'])} kWh, "
                   f"{num(pm['co2e_kg'] * 1000 if pm['co2e_kg'] is not None else None)} gCO2e, {cost}")
    if u:
        out.append(f"MFU           {u['value']:.2%} of {num(u['peak_flops_per_second'])} FLOP/s x {u['devices']} "
                   f"({u['source']})" if u["value"] is not None else f"MFU           {u['missing_reason']}")
    return out


def mib(n) -> str:
    return "n/a" if n is None else f"{n / 2**20:,.0f} MiB"


def restate(L: dict, regions: Sequence[str]) -> str:
    """This run's energy at other grids' carbon intensity (CodeCarbon's per-country data)."""
    from ecotrain.accounting.energy import country_intensity, country_iso3

    kwh = L["energy"]["kwh"]
    if kwh is None:
        raise ConfigError(f"--regions: the run has no energy figure ({L['energy']['missing_reason']})")
    here = L["co2e"]["kg"]
    rows = []
    for r in regions:
        iso3 = country_iso3(r)
        g, source = country_intensity(iso3)
        kg = kwh * g / 1000
        rows.append([r, iso3, f"{g:.0f}", num(kg * 1000), f"{kg / here:.2f}x" if here else "n/a", source])
    head = (f"CO2e of this run's {num(kwh)} kWh ({L['energy']['method']}) on other grids; "
            f"recorded: {num(here * 1000 if here is not None else None)} g on {L['co2e']['grid']}")
    return head + "\n" + table(["region", "grid", "g/kWh", "CO2e g", "vs recorded", "source"], rows)
