"""CodeCarbon's hardware plan, kept between runs on one machine.

Before its first reading CodeCarbon probes the hardware: py-cpuinfo in a subprocess (about 1.3 s of
wall) and its TDP table through pandas (about 0.25 CPU-s). It keeps the outcome, a plain
`_HardwarePlan` (which tracker reads the CPU, RAM and GPU, the CPU model and its TDP), for the rest
of the process only, so every `ecotrain fit` paid the probe again, and that CPU time shared the
interpreter with torch's import (bench/startup.py: `startup_over_hand` 1.19 with the meter, 1.09
without). This module writes the plan to the user cache (base/cachedir.py) after a real probe and puts
it back into CodeCarbon's own per-process cache before the next run's tracker sets up, so a run on
the same machine starts with the plan CodeCarbon itself would have found.

The plan is reused only where it is the same answer:
- the file records the machine it was probed on (host name, CPU model line, CPU and memory counts,
  user id, whether the RAPL counters are readable) and CodeCarbon's version and cache key; any
  difference and the plan is probed again;
- CPU and RAM plans only: a machine with an NVIDIA or AMD GPU device node, or a run that meters GPUs,
  always probes (the GPU set-up needs NVML anyway, and a swapped card keeps its device node);
- the file is checked field by field (kinds, finite TDP, RAPL only at its standard folder); a
  damaged, truncated, oversized or hand-edited file is ignored and replaced after the next probe.
What CodeCarbon said while probing (an unknown CPU model, no readable RAPL files) is kept with the
plan and in this process (`notes`), so each run's `energy.notes` says it, whoever probed.
Nothing here raises: without a cache folder, or with CodeCarbon's internals not as expected (another
major version), CodeCarbon probes as before. `EnergyMeter` reports which happened
(`meter_startup.hardware`: `cached` or `probed`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import platform
import socket
import time
from pathlib import Path
from typing import Optional

from ecotrain.base import safefile
from ecotrain.base.cachedir import cache_dir
from ecotrain.base.errors import EcotrainError
from ecotrain.base.rundir import atomic_write

FORMAT = 1
MAX_BYTES = 64 * 1024
RAPL_DIR = "/sys/class/powercap/intel-rapl/subsystem"  # CodeCarbon's default, the only one accepted
_GPU_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd")
_CPU_MODES = ("cpu_load", "constant", "intel_rapl")
_TRACKERS = ("ram_tracker", "cpu_tracker", "gpu_tracker")
_CONF = {"ram_total_size": (int, float), "cpu_count": int, "cpu_physical_count": int, "cpu_model": str,
         "gpu_count": int, "gpu_model": str, "gpu_ids": type(None)}


def _cache_module():
    """CodeCarbon's per-process hardware cache, or None where it is not the one this was written for."""
    try:
        from codecarbon.core import hardware_cache as hc
    except Exception:  # noqa: BLE001 - no CodeCarbon, or a broken one: the meter says so itself
        return None
    needed = ("_plans", "_cache_lock", "_HardwarePlan", "make_key")
    return hc if all(hasattr(hc, n) for n in needed) else None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[-1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_bytes() -> Optional[int]:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def fingerprint(key) -> dict:
    """What the plan depends on: this machine as the probe saw it, CodeCarbon's version and key."""
    import codecarbon

    rapl = Path(RAPL_DIR)  # the counters CodeCarbon would read: readable ones make it measure, not estimate
    readable = sorted(p.parent.name for p in rapl.glob("*/energy_uj") if os.access(p, os.R_OK)) if rapl.is_dir() else []
    return {"format": FORMAT, "codecarbon": str(getattr(codecarbon, "__version__", "?")),
            "key": {f.name: repr(getattr(key, f.name)) for f in dataclasses.fields(key)},
            "host": socket.gethostname(), "system": platform.system(), "machine": platform.machine(),
            "cpu_model": _cpu_model(), "cpus": os.cpu_count(), "memory_bytes": _memory_bytes(),
            "uid": os.geteuid() if hasattr(os, "geteuid") else None,
            "rapl_readable": readable}


def _file(fp: dict) -> Optional[Path]:
    root = cache_dir()
    if root is None:
        return None
    digest = hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]
    return root / "meter" / f"hardware-{digest}.json"


def _gpu_machine(gpu_ids) -> bool:
    return gpu_ids is not None or any(os.path.exists(p) for p in _GPU_NODES)


def _read(path: Path) -> Optional[dict]:
    """The file's JSON object, or None (missing, not a regular file, a link, too big, not JSON)."""
    try:
        obj = safefile.read_json(path, "meter plan", MAX_BYTES, follow_links=False)
    except (OSError, ValueError, EcotrainError):  # whatever is wrong with it: probe again and write it over
        return None
    return obj if isinstance(obj, dict) else None


def _number(v, low: float, high: float, none_ok: bool = False) -> bool:
    if v is None:
        return none_ok
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and low <= v <= high


MAX_TDP = 1_000  # watts: one CPU package's design power (the largest server parts are ~500 W); above, a typo or a lie


def _valid_spec(spec, tracking_mode: str) -> bool:
    if not isinstance(spec, dict) or spec.get("tracking_mode") != tracking_mode:
        return False
    if spec.get("kind") == "ram":
        return set(spec) == {"kind", "tracking_mode", "force_ram_power"} and spec["force_ram_power"] is None
    if spec.get("kind") != "cpu":  # GPUs, Apple and Raspberry chips always probe
        return False
    allowed = {"kind", "mode", "model", "tdp", "tracking_mode", "rapl_include_dram", "rapl_prefer_psys", "rapl_dir"}
    return (set(spec) <= allowed and spec.get("mode") in _CPU_MODES
            and isinstance(spec.get("model"), str) and len(spec["model"]) <= 300
            and _number(spec.get("tdp"), 0.1, MAX_TDP, none_ok=spec.get("mode") == "intel_rapl")
            and isinstance(spec.get("rapl_include_dram"), bool) and isinstance(spec.get("rapl_prefer_psys"), bool)
            and spec.get("rapl_dir", RAPL_DIR) == RAPL_DIR)


def valid_plan(plan, tracking_mode: str) -> bool:
    """Is `plan` (JSON) a CPU/RAM plan of the shape CodeCarbon's cache holds, with sane figures?"""
    if not isinstance(plan, dict) or set(plan) != {*_TRACKERS, "conf", "hardware_specs"}:
        return False
    if not all(isinstance(plan[t], str) and len(plan[t]) <= 200 for t in _TRACKERS):
        return False
    conf, specs = plan["conf"], plan["hardware_specs"]
    if not isinstance(conf, dict) or not set(conf) <= set(_CONF):
        return False
    for k, v in conf.items():
        kinds = _CONF[k]
        if isinstance(v, bool) or not isinstance(v, kinds):
            return False
        if isinstance(v, (int, float)) and not _number(v, 0, 1e9):
            return False
        if isinstance(v, str) and len(v) > 300:
            return False
    if conf.get("gpu_count", 0) != 0 or conf.get("gpu_model", "") != "":
        return False
    kinds = [s.get("kind") if isinstance(s, dict) else None for s in specs] if isinstance(specs, list) else None
    return kinds is not None and sorted(kinds) == ["cpu", "ram"] and all(_valid_spec(s, tracking_mode) for s in specs)


_NOTES: dict = {}  # CodeCarbon's cache key -> what it said when it probed (this process's or the file's)
_SOURCE: dict = {}  # CodeCarbon's cache key -> `cached` (from the file) or `probed` (in this process)
MAX_NOTES, NOTE_CHARS = 20, 300


def notes(tracker) -> list:
    """What CodeCarbon said while probing the hardware `tracker` uses (an unknown CPU model, no readable
    RAPL files), whether the probe ran in this process or in the run that saved the plan."""
    hc = _cache_module()
    try:
        return list(_NOTES.get(hc.make_key(tracker), ())) if hc is not None else []
    except Exception:  # noqa: BLE001 - a tracker of another CodeCarbon: no notes, not an error
        return []


def _valid_notes(v) -> bool:
    return (isinstance(v, list) and len(v) <= MAX_NOTES
            and all(isinstance(n, str) and len(n) <= NOTE_CHARS for n in v))


def install(tracker, gpu_ids) -> tuple[str, bool]:
    """Before `tracker` sets its hardware up: `(how, probe)`. Where this process set the same hardware up
    before (a saved plan, or a probe: the CLI's warm-up thread), CodeCarbon holds it: that `how`, no
    probe. Else the plan saved for this machine goes into CodeCarbon's cache: `cached`, no probe. Else
    `probed`, and CodeCarbon will probe: `remember` keeps its answer and what it said."""
    hc = _cache_module()
    if hc is None:
        return "probed", True
    try:
        key = hc.make_key(tracker)
        with hc._cache_lock:
            if key in hc._plans:
                return _SOURCE.get(key, "probed"), False
        if _gpu_machine(gpu_ids):
            return "probed", True
        fp = fingerprint(key)
        path = _file(fp)
        obj = _read(path) if path is not None else None
        if (not obj or obj.get("fingerprint") != fp or not valid_plan(obj.get("plan"), key.tracking_mode)
                or not _valid_notes(obj.get("notes", []))):
            return "probed", True
        rapl = any(s.get("mode") == "intel_rapl" for s in obj["plan"]["hardware_specs"])
        if rapl and not fp["rapl_readable"]:  # counters the plan would read that this machine does not show
            return "probed", True
        plan = hc._HardwarePlan(**obj["plan"])
        with hc._cache_lock:
            if key not in hc._plans:
                hc._plans[key] = plan
                _NOTES[key], _SOURCE[key] = list(obj.get("notes", [])), "cached"
        return _SOURCE.get(key, "cached"), False
    except Exception:  # noqa: BLE001 - a cache: CodeCarbon probes as it would without it
        return "probed", True


def remember(tracker, gpu_ids, said: list = ()) -> None:
    """After a probe: keep what CodeCarbon `said` while probing for this process, and write the plan it
    found for `tracker`, with those notes, to the cache, atomically (two runs racing each write a whole
    file; the last one stays)."""
    hc = _cache_module()
    if hc is None:
        return
    try:
        key = hc.make_key(tracker)
        said = [str(n)[:NOTE_CHARS] for n in said][:MAX_NOTES]
        _NOTES[key], _SOURCE[key] = said, "probed"
        if _gpu_machine(gpu_ids):
            return
        with hc._cache_lock:
            plan = hc._plans.get(key)
        if plan is None:
            return
        data = dataclasses.asdict(plan)
        fp = fingerprint(key)
        path = _file(fp)
        if path is None or not valid_plan(data, key.tracking_mode):
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"fingerprint": fp, "plan": data, "notes": said}, sort_keys=True, indent=1, allow_nan=False)
        atomic_write(path, text.encode("utf-8"))  # base/rundir.py: temp name, fsync, rename
        _sweep(path.parent)
    except Exception:  # noqa: BLE001 - a cache that cannot be written is no cache, not an error
        return


def _sweep(folder: Path, older_than: float = 3600.0) -> None:
    """Temporary files a killed writer left (a run stopped between its write and its rename)."""
    now = time.time()
    for tmp in folder.glob(".hardware-*.tmp-*"):  # atomic_write's `.NAME.tmp-PID`
        with contextlib.suppress(OSError):
            if now - tmp.lstat().st_mtime > older_than:
                tmp.unlink()
