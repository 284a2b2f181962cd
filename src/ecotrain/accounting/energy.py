"""Energy from CodeCarbon's `OfflineEmissionsTracker` (never a network call) and grid carbon intensity.

CodeCarbon swallows its own exceptions and only logs warnings, so `EnergyMeter` captures its log
records and checks what came back: a tracker that did not start, a stop that returned nothing, or
zero kWh all end as `kwh: None` with the reason. Every figure says how it was obtained: `measured`
(RAPL, NVML, powermetrics counters) or `estimated` (TDP x CPU load, CodeCarbon's RAM model).

Live figures (progress bar, metrics.jsonl) are CodeCarbon's last background sample plus the time
since then at its last power reading: an estimate between samples, never a new measurement, so a log
line costs a few attribute reads. The final figure is CodeCarbon's own total at `stop()`.

CodeCarbon takes over a second to get ready (hardware probes: a py-cpuinfo subprocess, pandas for
its TDP table). That is the meter's cost, not the run's, and it stays out of the run's figures:
`prepare()` builds the tracker and probes the hardware in a background thread (the ledger calls it
when the run's callbacks are built, so it overlaps the rest of the set-up), and `start()`, called
just before training starts, waits for it and starts the tracker in the calling thread (a few ms).
The ledger takes its own clocks (wall, `os.times()` CPU) after `start()`, so CodeCarbon's span,
the ledger's wall time and its CPU time all begin at the same moment: the run's first step. What
the meter's start-up itself took is reported beside the figure, never inside it: `meter_startup`
(the seconds `start()` waited for it, and the CPU-seconds its thread used), measured, not counted.

Measured (recipes/mnist1d_green_measured.yaml, fresh processes, threads=1, 2-core machine): with the
start-up inside the run (a background start racing training for the GIL), ~1.2 CPU-s and ~1.7 s of
wall landed in each run's ledger; docs/efficiency.md has the figures before and after.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import math
import os
import threading
import time
from pathlib import Path
from typing import Optional

from ecotrain.base import safefile
from ecotrain.accounting import meter_plan
from ecotrain.base.errors import ConfigError

_WARM: Optional[threading.Thread] = None  # warm_up()'s thread


def warm_up(tracking_mode: str = "process") -> None:
    """Start CodeCarbon's slow probes now, in the background: `detect_cpu_model()` runs py-cpuinfo in a
    subprocess (~1.3 s of wall, little CPU) and the CPU/RAM set-up waits on its own threads (~0.4 s);
    CodeCarbon keeps both for the process (an lru_cache; `hardware_cache`, keyed by the tracking mode
    and the GPUs: none here, so a GPU run sets its own up). `ecotrain fit` calls this as soon as its
    config says energy is measured, before torch is imported, so the probes overlap that import instead
    of delaying the first step (`start()` waits for what is left)."""
    global _WARM
    if _WARM is None and importlib.util.find_spec("codecarbon") is not None:
        _WARM = threading.Thread(target=_warm, args=(tracking_mode,), name="ecotrain-codecarbon-warm", daemon=True)
        _WARM.start()


def _warm(tracking_mode: str) -> None:
    log = logging.getLogger("codecarbon")
    saved = (log.level, list(log.handlers))
    try:
        from codecarbon import OfflineEmissionsTracker

        _home_proof()
        log.setLevel(logging.ERROR)  # the tracker's own warnings: the probe's are kept by _ready
        t = OfflineEmissionsTracker(country_iso_code="USA", output_methods=[], emissions_endpoint=None,
                                    electricitymaps_api_token=None, tracking_mode=tracking_mode,
                                    allow_multiple_runs=True, log_level="error", gpu_ids=None)
        ready = getattr(t, "_ensure_hardware_ready", None)  # CodeCarbon >= 3: what the real tracker reuses
        if callable(ready):
            _ready(t, ready, None)
    except Exception:  # noqa: BLE001 - a warm-up only: the meter's own start says what went wrong
        pass
    finally:  # the tracker's __init__ adds its stderr handler: the logger as it was
        log.setLevel(saved[0])
        log.handlers = saved[1]


def _offline_geo(tracker) -> None:
    """CodeCarbon's emissions figure is not used (ecotrain computes CO2e, co2e_intensity), but at its
    first reading it would name the placeholder country and look up the grid through its tables, which
    load pandas (about 0.3 CPU-s, inside the run's last reading): the name is given here from the same
    JSON, and the grid as the world average (`force_carbon_intensity_g_co2e_kwh`, in `_prepare`)."""
    if getattr(tracker, "_country_name", "") is None:
        tracker._country_name = _energy_mix().get("USA", {}).get("country_name", "United States")


def _home_proof() -> None:
    """Every tracker's `__init__` reads CodeCarbon's global `~/.codecarbon.config` and raises where
    there is no home folder (HOME unset, no passwd entry: an arbitrary container uid), so the meter
    never started there and the run had no energy figure. With no home that file cannot exist: the
    tracker gets the rest of CodeCarbon's configuration as CodeCarbon reads it (./.codecarbon.config,
    then the CODECARBON_* variables). Called before a tracker is built; a no-op where a home exists."""
    if os.environ.get("HOME"):
        return
    try:
        Path("~").expanduser()
        return  # a passwd entry gives a home: CodeCarbon finds it
    except RuntimeError:
        pass
    import codecarbon.emissions_tracker as tracker_module
    from codecarbon.core import config as cc

    found = tracker_module.get_hierarchical_config
    if getattr(found, "ecotrain_home_proof", False):
        return

    def without_home():
        try:
            return found()
        except RuntimeError:  # "Could not determine home directory."
            conf = dict(cc.read_config_file(str(Path.cwd() / cc.CONFIG_FILE_NAME)))
            conf.update(cc.parse_env_config()[cc.CONFIG_SECTION])
            return conf

    without_home.ecotrain_home_proof = True
    tracker_module.get_hierarchical_config = without_home


def _ready(tracker, ready, gpu_ids) -> str:
    """Set `tracker`'s hardware up: from the plan saved for this machine when there is one
    (meter_plan.py), else by CodeCarbon's probe, whose answer is then saved with what CodeCarbon said
    while probing (an unknown CPU model, no readable RAPL files: `energy.notes` of every run that
    reuses the plan). `cached` or `probed`."""
    how, probe = meter_plan.install(tracker, gpu_ids)
    if not probe:  # a saved plan, or this process's earlier set-up: CodeCarbon reuses it and says nothing
        ready()
        return how
    log, capture = logging.getLogger("codecarbon"), _Capture()
    saved = (log.level, log.propagate, list(log.handlers))
    # heard, not printed (the warm-up silences the logger; the tracker's __init__ adds a stderr handler)
    log.handlers = [h for h in log.handlers if not isinstance(h, logging.StreamHandler)] + [capture]
    log.setLevel(logging.WARNING)
    log.propagate = False
    try:
        ready()
    finally:
        log.setLevel(saved[0])
        log.propagate = saved[1]
        log.handlers = saved[2]
    meter_plan.remember(tracker, gpu_ids, capture.messages)
    return how


_NOISE = ("Multiple instances of codecarbon are allowed",)  # v3's default; not news to a user


class _Capture(logging.Handler):
    """Keeps CodeCarbon's warnings and errors (it reports its failures only this way)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        msg = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            msg = f"{msg} {type(exc).__name__}: {exc}"
        msg = " ".join(msg.split())[:300]
        if msg and msg not in self.messages and not msg.startswith(_NOISE) and len(self.messages) < 20:
            self.messages.append(msg)


def nvml_gpu_ids(device, visible: Optional[str], current: int = 0) -> Optional[list]:
    """The NVML id CodeCarbon should meter for `device`: its physical GPU, not GPU 0.

    `device.index` is the CUDA (logical) index, `current` stands in when the device has none
    (`cuda`: torch.cuda.current_device(), which torchrun's set_device chose). NVML counts physical
    GPUs, so the index goes through `visible` (CUDA_VISIBLE_DEVICES): `2,3` makes cuda:1 GPU 3; a
    UUID or MIG entry is passed on as text, which CodeCarbon resolves. None off CUDA."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else current
    entries = [e.strip() for e in (visible or "").split(",") if e.strip()]
    if visible is None or index >= len(entries):  # unset (or too short to map): logical is physical
        return [index]
    entry = entries[index]
    return [int(entry) if entry.isdigit() else entry]


class EnergyMeter:
    """Start before training, `live_kwh()` at log intervals, `stop()` once at the end."""

    def __init__(self, pue: float, tracking_mode: str, sample_seconds: float, gpu_ids: Optional[list] = None):
        self.pue, self.tracking_mode = pue, tracking_mode
        self.sample_seconds, self.gpu_ids = sample_seconds, gpu_ids
        self.tracker = None
        self.reason: Optional[str] = None  # why there is no energy figure
        self.version: Optional[str] = None
        self._capture = _Capture()
        self._saved: Optional[tuple] = None
        self._thread: Optional[threading.Thread] = None
        self._requested = 0.0  # perf_counter() when the run's span began (CodeCarbon's own start time)
        self.startup_seconds = 0.0  # of the run's span not covered by CodeCarbon (0 since start() waits)
        self.startup_wait: Optional[float] = None  # seconds start() waited for the preparation
        self.startup_cpu: Optional[float] = None  # CPU-seconds the preparation thread used
        self.hardware: Optional[str] = None  # `cached` (meter_plan.py) or `probed`

    def _quiet_logger(self) -> None:
        log = logging.getLogger("codecarbon")
        self._saved = (log.level, list(log.handlers))
        log.setLevel(logging.WARNING)
        log.handlers = [self._capture]

    def _restore_logger(self) -> None:
        if self._saved is not None:
            log = logging.getLogger("codecarbon")
            log.setLevel(self._saved[0])
            log.handlers = self._saved[1]
            self._saved = None

    def _drop_stream_handlers(self) -> None:
        log = logging.getLogger("codecarbon")  # the tracker's __init__ adds a stderr handler each time
        log.handlers = [h for h in log.handlers if h is self._capture or not isinstance(h, logging.StreamHandler)]
        log.setLevel(logging.WARNING)

    def _why(self, what: str) -> str:
        said = "; ".join(self._capture.messages[-3:])
        return f"{what}" + (f" (CodeCarbon said: {said})" if said else "")

    def prepare(self) -> None:
        """Build CodeCarbon's tracker and probe the hardware in a background thread; return at once."""
        if self._thread is not None or self.tracker is not None or self.reason:
            return
        self._thread = threading.Thread(target=self._prepare_now, name="ecotrain-codecarbon-start", daemon=True)
        self._thread.start()

    def start(self) -> None:
        """Wait for `prepare()` (calling it first if nobody did) and start the tracker here: from now on
        it covers the run. The wait and the start-up's CPU are `meter_startup`, outside the figure."""
        t0 = time.perf_counter()
        self.prepare()
        self.wait()
        self.startup_wait = time.perf_counter() - t0
        self._requested = time.perf_counter()
        if self.tracker is None:
            return
        try:
            self.tracker.start()
        except Exception as exc:
            self.reason = self._why(f"CodeCarbon failed to start: {type(exc).__name__}: {exc}")
        else:
            started = getattr(self.tracker, "_start_time", None)
            if started is None:  # start() swallowed an exception
                self.reason = self._why("CodeCarbon did not start")
            else:
                self._requested = float(started)  # the span is CodeCarbon's own: the same moment
        if self.reason:
            self.tracker = None
            self._restore_logger()

    def wait(self) -> None:
        """Until the background preparation has finished (ready, or failed with `reason`)."""
        t = self._thread
        if t is not None:
            t.join()
            self._thread = None

    def _prepare_now(self) -> None:
        cpu0 = time.thread_time()
        try:
            self._prepare()
        except BaseException as exc:  # never let the thread die with the tracker half set up
            self.reason = self._why(f"CodeCarbon failed to start: {type(exc).__name__}: {exc}")
            self.tracker = None
            self._restore_logger()
        finally:
            self.startup_cpu = time.thread_time() - cpu0

    def _prepare(self) -> None:
        if _WARM is not None:  # the CPU model probe warm_up() began: its answer, not a second subprocess
            _WARM.join()
        try:
            import codecarbon
            from codecarbon import OfflineEmissionsTracker
        except Exception as exc:  # ImportError, or a broken install
            self.reason = f"CodeCarbon is not available ({type(exc).__name__}: {exc}); pip install codecarbon"
            return
        self.version = getattr(codecarbon, "__version__", "?")
        self._quiet_logger()
        try:
            _home_proof()
            kwargs = dict(
                country_iso_code="USA",  # a placeholder: ecotrain computes CO2e itself (co2e_intensity)
                output_methods=[], emissions_endpoint=None, electricitymaps_api_token=None,
                measure_power_secs=self.sample_seconds, tracking_mode=self.tracking_mode, pue=self.pue,
                allow_multiple_runs=True, log_level="warning", gpu_ids=self.gpu_ids)
            try:  # the grid given (_offline_geo); a CodeCarbon without the argument looks it up itself
                self.tracker = OfflineEmissionsTracker(**kwargs, force_carbon_intensity_g_co2e_kwh=co2e_intensity(None, None)[0])
            except TypeError as exc:
                if "force_carbon_intensity" not in str(exc):
                    raise
                self.tracker = OfflineEmissionsTracker(**kwargs)
            self._drop_stream_handlers()
            _offline_geo(self.tracker)
            if getattr(self.tracker, "_electricitymaps_api_token", None):  # from a user config file: stay offline
                self.tracker._electricitymaps_api_token = None
            ready = getattr(self.tracker, "_ensure_hardware_ready", None)  # the slow probes (CodeCarbon >= 3)
            if callable(ready):
                self.hardware = _ready(self.tracker, ready, self.gpu_ids)
        except Exception as exc:
            self.reason = self._why(f"CodeCarbon did not start: {type(exc).__name__}: {exc}")
        if self.reason:
            self.tracker = None
            self._restore_logger()

    def live_kwh(self) -> Optional[float]:
        """Energy so far (an estimate between CodeCarbon's samples, at its last power reading); None
        without a started tracker."""
        t = self.tracker
        if t is None or getattr(t, "_start_time", None) is None:
            return None
        if t is None:
            return None
        try:  # CodeCarbon's running totals; reading them costs no measurement
            watts = t._cpu_power.W + t._ram_power.W + t._gpu_power.W
            unseen = max(time.perf_counter() - t._last_measured_time, 0.0) + self.startup_seconds
            return t._total_energy.kWh + watts * unseen / 3.6e6
        except Exception:
            return None

    def stop(self) -> dict:
        """The final reading: `kwh` (None with `missing_reason`); `method` is `measured` only when every
        component was; `how`, per-component kWh, notes; `meter_startup`: what CodeCarbon's own start-up
        took, outside the figure (module doc). `startup_seconds`/`startup_kwh`: 0 (the run's span is
        CodeCarbon's own; kept for older readers)."""
        self.wait()
        out: dict = {"kwh": None, "method": None, "how": None, "components_kwh": None, "components_method": None,
                     "startup_seconds": None, "startup_kwh": None, "pue": self.pue,
                     "meter_startup": {"wait_seconds": self.startup_wait, "cpu_seconds": self.startup_cpu,
                                       "counted": False, "hardware": self.hardware, "method": "measured: wait_seconds by perf_counter; cpu_seconds the "
                                       "start-up thread's own CPU time (its subprocesses and imports another "
                                       "thread finished are not in it)"},
                     "source": f"CodeCarbon {self.version} OfflineEmissionsTracker" if self.version else None,
                     "missing_reason": self.reason, "notes": []}
        t, self.tracker = self.tracker, None
        heard = meter_plan.notes(t) if t is not None else []  # what CodeCarbon said when it probed this machine
        if t is not None and getattr(t, "_start_time", None) is None:  # prepared, never started
            out["missing_reason"] = self.reason or "the run ended before training started (the meter never started)"
            t = None
        if t is not None:
            try:
                t.stop()
                data = getattr(t, "final_emissions_data", None)
            except Exception as exc:
                data, self._capture.messages = None, [*self._capture.messages, f"{type(exc).__name__}: {exc}"]
            kwh = getattr(data, "energy_consumed", None)
            if data is None:
                out["missing_reason"] = self._why("CodeCarbon failed at stop and returned no data")
            elif not isinstance(kwh, (int, float)) or not math.isfinite(kwh) or kwh <= 0:
                out["missing_reason"] = self._why(f"CodeCarbon reported {kwh!r} kWh: no usable power source")
            else:
                out["kwh"] = float(kwh)
                out["startup_seconds"], out["startup_kwh"] = 0.0, 0.0
                out["components_kwh"] = {"cpu": data.cpu_energy, "gpu": data.gpu_energy, "ram": data.ram_energy}
                parts = [describe(hw, self.tracking_mode) for hw in getattr(t, "_hardware", [])]
                out["components_method"] = {c: m for c, m, _ in parts}
                out["method"] = "measured" if parts and all(p[1] == "measured" for p in parts) else "estimated"
                out["how"] = "; ".join(f"{c} {m}: {how}" for c, m, how in parts) + f"; pue {self.pue}"
                if self.startup_wait is not None:
                    out["how"] += (f"; from the first step on: CodeCarbon's own start-up ({self.startup_wait:.2f} s "
                                   f"waited, {self.startup_cpu or 0.0:.2f} CPU-s) not counted")
        out["notes"] = list(dict.fromkeys([*heard, *self._capture.messages]))[:20]
        self._restore_logger()
        return out


def combine_ranks(readings: list[dict], tracking_mode: str) -> dict:
    """One energy figure for a torchrun job from every rank's own `stop()` reading, each tagged with
    `host` and `gpu_ids` (the physical GPUs it metered).

    GPU energy counts once per (host, GPU): each rank meters its own device. CPU and RAM: in `process`
    mode each rank's figure is its own process's share, so all count; in `machine` mode each is the
    whole machine, so each host counts once (its largest reading). Each reading's kWh (PUE included)
    is kept in the proportion of its components that count. A rank without a figure makes the total
    missing, naming the rank: a partial sum would look complete."""
    first = dict(readings[0])
    if len(readings) == 1:
        return first
    out = {**first, "ranks": len(readings), "per_rank_kwh": [x.get("kwh") for x in readings]}
    missing = next(((r, x.get("missing_reason")) for r, x in enumerate(readings) if x.get("kwh") is None), None)
    if missing is not None:
        return {**out, "kwh": None, "components_kwh": None, "method": None,
                "missing_reason": f"rank {missing[0]}: {missing[1]}"}
    parts = [{k: float(v or 0.0) for k, v in (x.get("components_kwh") or {"cpu": x["kwh"]}).items()}
             for x in readings]
    gpu_owner, host_owner = {}, {}  # who counts each GPU, each host's CPU+RAM (machine mode)
    for r, (x, p) in enumerate(zip(readings, parts)):
        gpu_owner.setdefault((x.get("host"), tuple(x.get("gpu_ids") or ())), r)
        key = x.get("host") if tracking_mode == "machine" else r
        rest = p.get("cpu", 0.0) + p.get("ram", 0.0)
        if key not in host_owner or rest > host_parts(parts[host_owner[key]]):
            host_owner[key] = r
    kwh, components = 0.0, {"cpu": 0.0, "gpu": 0.0, "ram": 0.0}
    for r, (x, p) in enumerate(zip(readings, parts)):
        kept = {"gpu": p.get("gpu", 0.0) if r in gpu_owner.values() else 0.0}
        counted = r in host_owner.values()
        kept.update(cpu=p.get("cpu", 0.0) if counted else 0.0, ram=p.get("ram", 0.0) if counted else 0.0)
        whole = sum(p.values())
        kwh += x["kwh"] * (sum(kept.values()) / whole if whole > 0 else 1.0)
        for k, v in kept.items():
            components[k] += v
    how = (f"{first.get('how')}; {len(readings)} ranks: GPU per device, CPU and RAM "
           + ("once per host (tracking_mode machine)" if tracking_mode == "machine" else "per process, summed"))
    methods = {x.get("method") for x in readings}
    return {**out, "kwh": kwh, "components_kwh": components, "how": how,
            "method": "measured" if methods == {"measured"} else "estimated"}


def host_parts(p: dict) -> float:
    return p.get("cpu", 0.0) + p.get("ram", 0.0)


def describe(hw, tracking_mode: str) -> tuple[str, str, str]:
    """(component, measured|estimated, how) for one of CodeCarbon's hardware objects."""
    kind = type(hw).__name__
    if kind == "CPU":
        mode, tdp = getattr(hw, "_mode", "?"), getattr(hw, "_tdp", None)
        if mode in ("intel_rapl", "intel_power_gadget", "windows_emi"):
            return "cpu", "measured", f"{mode} energy counters"
        if mode == "cpu_load":
            return "cpu", "estimated", f"TDP {tdp} W x {tracking_mode} CPU load"
        return "cpu", "estimated", f"constant TDP {tdp} W"
    if kind == "GPU":
        return "gpu", "measured", "device energy counters (NVML / AMD SMI), whole device"
    if kind == "RAM":
        return "ram", "estimated", "CodeCarbon's RAM power model"
    if kind in ("AppleSiliconChip", "Raspberry"):
        return getattr(hw, "chip_part", kind).lower(), "measured", f"{kind} power sensors"
    return kind.lower(), "estimated", repr(hw)


# -- carbon intensity of a grid ------------------------------------------------------------------

class GridDataMissing(ConfigError):
    """CodeCarbon (and with it the per-country grid data) is not installed."""


@functools.lru_cache(maxsize=None)
def _codecarbon_json(relpath: str) -> dict:
    """One of the JSON files CodeCarbon ships, read directly: the same data as its `DataSource`, without
    importing CodeCarbon, whose `DataSource` loads all its tables (pandas: about 1 s) on first use."""
    try:
        spec = importlib.util.find_spec("codecarbon")  # locates the package without importing it
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError("No module named 'codecarbon'")
        path = Path(next(iter(spec.submodule_search_locations))) / "data" / relpath
        return safefile.read_json(path, "CodeCarbon data file", 64 * safefile.MiB, fix="reinstall codecarbon")
    except Exception as exc:
        raise GridDataMissing(f"grid carbon intensity needs CodeCarbon's data ({type(exc).__name__}: {exc}); "
                              "pip install codecarbon") from None


def _energy_mix() -> dict:
    return _codecarbon_json("private_infra/global_energy_mix.json")


def country_iso3(code: str) -> str:
    """'SE' or 'SWE' -> 'SWE', checked against CodeCarbon's per-country data."""
    mix, c = _energy_mix(), code.strip().upper()
    if len(c) == 2:
        import pycountry  # a CodeCarbon dependency

        hit = pycountry.countries.get(alpha_2=c)
        c = hit.alpha_3 if hit else c
    if c not in mix:
        raise ConfigError(f"country '{code}': not in CodeCarbon's grid data (use an ISO code like FR or FRA)")
    return c


def world_average() -> float:
    return float(_codecarbon_json("private_infra/carbon_intensity_per_source.json")["world_average"])


def country_intensity(iso3: str) -> tuple[float, str]:
    """(g CO2e/kWh, source) from CodeCarbon's shipped data, computed the way CodeCarbon does."""
    from codecarbon.core.emissions import Emissions

    mix = _energy_mix()[iso3]
    g = Emissions._global_energy_mix_to_emissions_rate(mix).kgs_per_kWh * 1000
    return float(g), f"CodeCarbon global_energy_mix: {mix.get('country_name', iso3)} {mix.get('year', '')}".strip()


def co2e_intensity(country: Optional[str], override: Optional[float]) -> tuple[float, str, str]:
    """(g CO2e/kWh, grid, source) for the run: the override, else the country's, else the world average."""
    if override is not None:
        return float(override), country or "custom", "ledger.carbon_intensity (configured)"
    if country:
        iso3 = country_iso3(country)
        g, src = country_intensity(iso3)
        return g, iso3, src
    try:
        return world_average(), "world", "CodeCarbon world average (set ledger.country for your grid)"
    except Exception:
        return 475.0, "world", "world average 475 g/kWh (IEA 2019; CodeCarbon's data unavailable)"


def cpu_time_kwh(ledger: dict) -> Optional[float]:
    """The run's energy with the wall-time terms counted over the time it held a CPU: a figure a busy
    machine cannot inflate. Where a meter measured it (RAPL, NVML: `energy.method` measured), that
    figure as it is. Where it is estimated (TDP x this process's CPU load, plus a RAM power x wall
    time), the CPU part follows CPU-seconds already and the RAM part is scaled by the share of the
    wall time the run was on a CPU (`cpu_seconds / (wall_seconds x threads)`, at most 1): a run that
    waited for a core behind other processes is not charged RAM power for the wait. None without an
    energy figure. A GPU run's figure is returned as it is."""
    e = ledger.get("energy") or {}
    kwh = e.get("kwh")
    if kwh is None or e.get("method") == "measured" or (ledger.get("device") or {}).get("name") != "cpu":
        return kwh  # metered, or a GPU run (its CPU time says nothing of its GPU's)
    parts = e.get("components_kwh") or {}
    whole = sum(float(v or 0.0) for v in parts.values())
    wall, cpu = ledger.get("wall_seconds") or 0.0, ledger.get("cpu_seconds") or 0.0
    threads = max(1, int((ledger.get("device") or {}).get("count") or 1))
    if whole <= 0 or wall <= 0:
        return kwh
    busy = min(1.0, cpu / (wall * threads))
    kept = float(parts.get("cpu") or 0.0) + float(parts.get("gpu") or 0.0) + float(parts.get("ram") or 0.0) * busy
    return float(kwh) * kept / whole
