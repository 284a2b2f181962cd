"""How many threads torch uses: the cores this process may really get, not the cores the machine has.

torch starts one OpenMP thread per CPU it sees; a container with a CPU quota (Kubernetes
`limits.cpu: 2` on a 64-core node shows 64), a `taskset` mask, torchrun ranks or DataLoader workers
sharing the machine, or other busy processes leave those threads spinning for cores they cannot get
(the demo CNN ran ~19x slower with two threads than with one on a loaded 2-core machine).

`choose` picks, in this order of precedence:

    config      `threads: N` in the recipe
    OMP_NUM_THREADS   the user's own value (not one this module set)
    auto        min(affinity, ceil(cgroup quota)) // local ranks - loader workers, and no more than the
                machine's CPUs that other processes leave free right now; at least 1

The CLI calls `preset_env` before torch is imported (torch reads OMP_NUM_THREADS once, when its
pool starts); `fit()` calls `for_fit`, which sets torch's count for the call and restores it after.
The choice and its reasons are recorded in environment.json (`hardware.threads`).

The cgroup is read from the process's own cgroup folders under /sys/fs/cgroup (v2 `cpu.max`, v1
`cpu.cfs_quota_us` / `cpu.cfs_period_us`); ECOTRAIN_CGROUP_ROOT names one folder to read instead
(a test or benchmark simulating a quota).
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Iterator, Optional, Union

from ecotrain.base import safefile
from ecotrain.base.cachedir import cache_dir
from ecotrain.base.errors import ConfigError, EcotrainError
from ecotrain.base.runfiles import LEDGER

CGROUP_ENV = "ECOTRAIN_CGROUP_ROOT"
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
CGROUP_MOUNT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    source: str  # "auto", "config" (threads: N), "OMP_NUM_THREADS" or "resume" (the checkpoint's, for exactness)
    cores: int  # the cores this process may use: min(affinity, quota)
    affinity: Optional[int]  # CPUs in this process's affinity mask
    quota: Optional[float]  # the cgroup CPU quota in CPUs; None: no quota
    local_ranks: int = 1  # torchrun processes on this machine (LOCAL_WORLD_SIZE)
    workers: int = 0  # data.workers: loader processes that need CPU too
    busy: int = 0  # runnable tasks of other processes when chosen (auto only)

    def why(self) -> str:
        if self.source == "config":
            return f"threads: {self.threads} in the config"
        if self.source == "OMP_NUM_THREADS":
            return f"OMP_NUM_THREADS={self.threads} set by the user"
        if self.source == "resume":
            return (f"{self.threads}, as when the checkpoint resumed from was saved (another count would change "
                    f"the order of CPU reductions: the resume would not be bit-exact); {self.cores} usable cores")
        parts = [f"affinity {self.affinity}" if self.affinity is not None else "affinity unknown",
                 f"cgroup quota {self.quota:g} CPUs" if self.quota is not None else "no cgroup quota"]
        if self.local_ranks > 1:
            parts.append(f"{self.local_ranks} local ranks share them")
        if self.workers:
            parts.append(f"{self.workers} loader workers")
        if self.busy:
            parts.append(f"{self.busy} runnable tasks of other processes")
        return f"{self.threads} of {self.cores} usable cores ({', '.join(parts)})"

    def to_json(self) -> dict:
        return {**asdict(self), "why": self.why()}


def affinity() -> Optional[int]:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return None


def read_quota(folder: Path) -> Optional[float]:
    """The CPU quota set in one cgroup folder, in CPUs (v2 `cpu.max` "QUOTA PERIOD", "max": none; v1
    `cpu.cfs_quota_us` / `cpu.cfs_period_us`, -1: none); None when it sets none or cannot be read."""
    try:
        v2 = folder / "cpu.max"
        if v2.is_file():
            quota, _, period = v2.read_text().strip().partition(" ")
            return None if quota == "max" else int(quota) / int(period or 100000)
        v1 = folder / "cpu.cfs_quota_us"
        if v1.is_file():
            quota_us = int(v1.read_text().strip())
            return None if quota_us <= 0 else quota_us / int((folder / "cpu.cfs_period_us").read_text().strip())
    except (OSError, ValueError, ZeroDivisionError):  # unreadable or garbled: no quota known
        return None
    return None


def _cgroup_folders() -> list[Path]:
    """This process's cgroup folders and their parents (a parent's quota limits its children too),
    from /proc/self/cgroup: v2 `0::/path`, v1 `N:cpu,cpuacct:/path`."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    out: list[Path] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            base = CGROUP_MOUNT
        elif "cpu" in controllers.split(","):
            base = next((CGROUP_MOUNT / n for n in (controllers, "cpu", "cpu,cpuacct") if (CGROUP_MOUNT / n).is_dir()),
                        None)
            if base is None:
                continue
        else:
            continue
        folder = base / path.lstrip("/")
        out += [folder, *[p for p in folder.parents if p.is_relative_to(base)]]
    return out


def cgroup_quota(root: Union[str, Path, None] = None) -> Optional[float]:
    """The smallest CPU quota over this process's cgroups, in CPUs; None: no quota. `root` (or
    ECOTRAIN_CGROUP_ROOT) names the one folder to read instead."""
    root = root or os.environ.get(CGROUP_ENV)
    folders = [Path(root)] if root else _cgroup_folders()
    quotas = [q for q in map(read_quota, folders) if q is not None]
    return min(quotas) if quotas else None


def usable_cores(root: Union[str, Path, None] = None) -> tuple[int, Optional[int], Optional[float]]:
    """(cores, affinity, quota): the cores this process may use, at least 1."""
    mask, quota = affinity(), cgroup_quota(root)
    limits = [n for n in (mask, math.ceil(quota) if quota is not None else None) if n]
    return max(1, min(limits) if limits else (os.cpu_count() or 1)), mask, quota


def runnable_now(reads: int = 5, gap: float = 0.01) -> Optional[int]:
    """Runnable tasks on the machine now (the median of a few reads of /proc/loadavg's `R/T` field,
    this reader included); None where there is no /proc."""
    counts = []
    for i in range(reads):
        try:
            counts.append(int(Path("/proc/loadavg").read_text().split()[3].split("/")[0]))
        except (OSError, ValueError, IndexError):
            return None
        if i + 1 < reads:
            time.sleep(gap)
    return int(statistics.median(counts))


def _user_value(env) -> Optional[int]:
    raw = env.get("OMP_NUM_THREADS")
    if raw is None or (_PRESET is not None and raw == str(_PRESET.threads)):
        return None  # unset, or the value preset_env wrote (the user's would not have been replaced)
    try:
        n = int(raw)
    except ValueError:
        return None  # OpenMP's own syntax ("4,2"): torch applies it; not ours to pick
    return n if n > 0 else None


def choose(setting: Union[int, str] = "auto", workers: int = 0, env=None, root=None,
           busy: Optional[int] = None) -> ThreadChoice:
    """The thread count for torch and why. `busy`: runnable tasks of other processes (None: read now)."""
    env = os.environ if env is None else env
    cores, mask, quota = usable_cores(root)
    ranks = max(1, int(env.get("LOCAL_WORLD_SIZE", "1") or 1))
    fixed = dict(cores=cores, affinity=mask, quota=quota, local_ranks=ranks, workers=workers)
    if setting != "auto":
        return ThreadChoice(int(setting), "config", **fixed)
    user = _user_value(env)
    if user is not None:
        return ThreadChoice(user, "OMP_NUM_THREADS", **fixed)
    if busy is None:
        running = runnable_now()
        busy = max(0, running - ranks) if running is not None else 0  # every local rank is starting too
    share = cores // ranks - workers
    free = ((os.cpu_count() or cores) - busy) // ranks  # what other processes leave of the whole machine
    return ThreadChoice(max(1, min(share, free)), "auto", busy=busy, **fixed)


# The choice preset_env wrote into OMP_NUM_THREADS before torch was imported: fit() keeps it rather than
# reading that value back as the user's.
_PRESET: Optional[ThreadChoice] = None


def preset() -> Optional[ThreadChoice]:
    """The choice the CLI preset before torch started (None: a library call, nothing preset)."""
    return _PRESET


def preset_env(choice: ThreadChoice, env=None) -> None:
    """Before torch is imported: OMP_NUM_THREADS and MKL_NUM_THREADS, where the user set neither."""
    global _PRESET
    env = os.environ if env is None else env
    if choice.source == "OMP_NUM_THREADS":
        return
    for var in THREAD_VARS:
        if var not in env or (_PRESET is not None and env[var] == str(_PRESET.threads)):  # ours to replace
            env[var] = str(choice.threads)
    _PRESET = choice


def current(setting: Union[int, str] = "auto", workers: int = 0) -> ThreadChoice:
    """The choice preset before torch started, when it still holds; else a fresh one."""
    preset = _PRESET
    if (preset is not None and os.environ.get("OMP_NUM_THREADS") == str(preset.threads)
            and preset.source == ("auto" if setting == "auto" else "config") and preset.workers == workers
            and (setting == "auto" or preset.threads == int(setting))):
        return preset
    return choose(setting, workers)


def recorded(checkpoint) -> Optional[int]:
    """The thread count a checkpoint was saved with (its meta.json `env.threads`), or None."""
    try:
        meta = safefile.read_json(Path(checkpoint) / "meta.json", "checkpoint record", META_LIMIT)
        n = meta.get("env", {}).get("threads")
    except (OSError, ValueError, AttributeError, EcotrainError):
        return None  # unreadable here: the resume itself says so in one line
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else None


@contextlib.contextmanager
def for_fit(setting: Union[int, str] = "auto", workers: int = 0, resume=None) -> Iterator[ThreadChoice]:
    """torch's intra-op thread count for one fit() call, restored after. Resuming under `auto`, the
    count the checkpoint was saved with: a load that changed since would otherwise change it, and a
    different count sums CPU reductions in another order (the resume would not be bit-exact)."""
    import torch  # here only: the CLI imports this module before torch, to preset OMP_NUM_THREADS

    choice = current(setting, workers)
    saved = recorded(resume) if resume is not None and choice.source == "auto" else None
    if saved is not None and saved != choice.threads:
        choice = replace(choice, threads=saved, source="resume")
    before = torch.get_num_threads()
    if choice.threads != before:
        torch.set_num_threads(choice.threads)
    try:
        yield choice
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


# -- `threads: auto` by what is paid: a short probe on a copy of the run, decided once, then fixed -----

OBJECTIVE_ENV = "ECOTRAIN_THREADS_FOR"  # energy (default) | time | money
PROBE_ENV = "ECOTRAIN_THREADS_PROBE"  # "0": no probe (auto as the cores allow, as before)
OBJECTIVES = ("energy", "time", "money")
# each count runs at both lengths; per-step figures are the difference over the steps between, so set-up,
# test evaluation and checkpoint save (most of a short run) cancel: a 40-step probe read 3x the real step
PROBE_STEPS = (20, 220)  # 200 steps between: ~0.5 s of the demo, next to ~7 s of process start
PROBE_METHOD = "steady"  # threads.json entries without it were measured with set-up counted: probed again
TIE = 0.03  # within 3% of the best: the fewer threads (less CPU held, the same figure within the probe's noise)
CACHE_LIMIT = safefile.MiB  # threads.json: a few KiB a recipe; a bigger file is not ours to trust
META_LIMIT = 16 * safefile.MiB  # a checkpoint's meta.json (KiBs)
_KEY_SECTIONS = ("model", "data", "optim", "precision", "methods", "task", "device", "memory", "compile")


def objective(env=None) -> str:
    env = os.environ if env is None else env
    got = (env.get(OBJECTIVE_ENV) or "energy").strip().lower()
    if got not in OBJECTIVES:
        raise ConfigError(f"{OBJECTIVE_ENV}={got}: one of {', '.join(OBJECTIVES)}; set one, or unset it (energy)")
    return got


def candidates(most: int) -> list[int]:
    """1, 2, 4, ... and `most` itself."""
    out, n = [], 1
    while n < most:
        out.append(n)
        n *= 2
    return [*out, most]


def probe_key(cfg: dict, goal: str, cores: int) -> str:
    """What the per-step cost depends on: the model, data, optimizer, precision and methods sections,
    this machine and its usable cores, the objective; not the seed or the schedule's length."""
    import hashlib
    import json
    import socket

    what = {k: cfg.get(k) for k in _KEY_SECTIONS}
    text = json.dumps([what, socket.gethostname(), cores, goal], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_file() -> Optional[Path]:
    """Where the decisions are kept (base/cachedir.py); None with no home folder: nothing is kept."""
    root = cache_dir()
    return root / "threads.json" if root is not None else None


def _probe_run(cfg: dict, n: int, steps: int, folder: Path) -> dict:
    """`ecotrain fit` of a copy of the run's config for `steps` steps with `n` threads, in its own
    process; its ledger's totals (set-up, test and save included)."""
    import subprocess
    import sys

    import yaml

    recipe = folder / f"probe-{n}-{steps}.yaml"
    recipe.write_text(yaml.safe_dump(cfg, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    run = folder / f"run-{n}-{steps}"
    cmd = [sys.executable, "-m", "ecotrain", "fit", str(recipe), f"threads={n}", f"loop.max_steps={steps}",
           "loop.max_epochs=null", "loop.eval_every=null", "--run-dir", str(run), "--overwrite", "--quiet"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"probe with {n} threads failed: {(r.stderr or r.stdout).strip()[-300:]}")
    L = safefile.read_json(run / LEDGER, "probe's ledger", 64 * safefile.MiB)
    return {"steps": int(L.get("steps") or steps), "wall": L.get("wall_seconds"), "cpu": L.get("cpu_seconds"),
            "kwh": (L.get("energy") or {}).get("kwh"), "cost": (L.get("cost") or {}).get("amount")}


def _per_step(short: dict, long: dict, k: str) -> tuple[Optional[float], bool]:
    """(one step's `k`, fell back): the long run's figure less the short one's over the steps between,
    so set-up, test evaluation and checkpoint save cancel; where load noise makes that difference not
    positive (or a figure is missing), the long run's own average, an overestimate but never a crash."""
    a, b = short.get(k), long.get(k)
    if b is None:
        return None, False
    span = long["steps"] - short["steps"]
    if a is not None and span > 0:
        d = (float(b) - float(a)) / span
        if math.isfinite(d) and d > 0:
            return d, False
    avg = float(b) / max(1, long["steps"])
    return (avg if math.isfinite(avg) else None), True


def steady(short: dict, long: dict, n: int) -> dict:
    """A candidate's steady-state figures per training step from its short and long probe runs."""
    got = {k: _per_step(short, long, k) for k in ("wall", "cpu", "kwh", "cost")}
    per = {f"{k}_per_step": v for k, (v, _) in got.items()}
    return {"threads": n, "short_steps": short["steps"], "long_steps": long["steps"], **per,
            "fallbacks": sum(fell for _, fell in got.values()),  # figures read as the long run's average
            **{f"probe_{k}": sum(float(r.get(s) or 0.0) for r in (short, long))
               for k, s in (("wall_seconds", "wall"), ("cpu_seconds", "cpu"), ("kwh", "kwh"))}}


def probe_once(cfg: dict, n: int, steps: tuple[int, int], folder: Path) -> dict:
    """`n` threads' steady-state figures per step: the run at two lengths (`steps`: short, long)."""
    short, long = (_probe_run(cfg, n, s, folder) for s in steps)
    return steady(short, long, n)


def score(p: dict, goal: str) -> float:
    """Lower is better: kWh per step (energy; CPU-seconds per step where the probe had no energy
    figure), seconds per step (time), money per step (money: core-seconds where no price)."""
    return {"energy": _energy, "time": lambda p: float(p["wall_per_step"]), "money": _money}[goal](p)


def _energy(p: dict) -> float:
    v = p.get("kwh_per_step")
    return float(v if v is not None else p["cpu_per_step"])


def _money(p: dict) -> float:
    v = p.get("cost_per_step")
    return float(v if v is not None else p["wall_per_step"] * p["threads"])  # core-seconds: what a price multiplies


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else (1.0 if a == b else math.inf)


def decide(probes: list[dict], goal: str) -> tuple[dict, str]:
    """(the chosen probe, why). More threads only where they beat 1 thread on `goal` by more than TIE and
    pay no more energy and no more money per step than 1 thread (within TIE): more cores held must not
    raise what the run pays; among those, the fewest threads within TIE of the best."""
    one = next(p for p in probes if p["threads"] == 1)
    vs_one = lambda p: (_ratio(score(p, goal), score(one, goal)), _ratio(_energy(p), _energy(one)),  # noqa: E731
                        _ratio(_money(p), _money(one)))
    pool, held_back = [one], []
    for p in probes:
        s, e, m = vs_one(p)
        if p is not one and s < 1 - TIE:
            (pool if e <= 1 + TIE and m <= 1 + TIE else held_back).append(p)
    best = min(score(p, goal) for p in pool)
    chosen = min((p for p in pool if score(p, goal) <= best * (1 + TIE)), key=lambda p: p["threads"])
    if chosen is not one:
        return chosen, "{:.2f}x 1 thread's {} per step, and no more energy ({:.2f}x) or money ({:.2f}x)".format(
            vs_one(chosen)[0], goal, *vs_one(chosen)[1:])
    if held_back:
        return one, "; ".join(
            "{} threads beat 1 on {} ({:.2f}x) but would pay {:.2f}x its energy and {:.2f}x its money".format(
                p["threads"], goal, *vs_one(p)) for p in held_back)
    return one, f"no count beat 1 thread's {goal} by more than {TIE:.0%}"


def _finite(v) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0)


def _cached(entry, most: int, goal: str) -> Optional[dict]:
    """A cached decision read back from threads.json, whole, or None (a file anyone can edit: a damaged
    entry is probed again and written over, never carried into the run's ledger)."""
    if not isinstance(entry, dict):
        return None
    n, probes, cost = entry.get("threads"), entry.get("probes"), entry.get("probe_cost")
    if not (isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= most and entry.get("objective") == goal
            and entry.get("method") == PROBE_METHOD
            and isinstance(entry.get("line"), str) and isinstance(entry.get("when"), str)
            and isinstance(probes, list) and isinstance(cost, dict)
            and all(isinstance(p, dict) and all(_finite(v) for v in p.values()) for p in probes)
            and all(_finite(v) for v in cost.values())):
        return None
    return entry


def _table(path: Path) -> dict:
    """threads.json's decisions, or {} where it is missing or not a JSON object in a regular file of at
    most CACHE_LIMIT (a FIFO there would block the run forever, past SIGTERM)."""
    try:
        table = safefile.read_json(path, "threads cache", CACHE_LIMIT)
    except (OSError, ValueError, EcotrainError):
        return {}
    return table if isinstance(table, dict) else {}


def _said(p: dict) -> str:
    """One candidate's per-step figures for the log line."""
    n = p["threads"]
    return (f"{n} thread{'s' if n > 1 else ''}: {p['wall_per_step'] * 1e3:.2f} ms, {p['cpu_per_step'] * 1e3:.2f} CPU-ms"
            + (f", {p['kwh_per_step'] * 3.6e6:.3g} J" if p.get("kwh_per_step") is not None else "")
            + (f", cost {p['cost_per_step']:.3g}" if p.get("cost_per_step") is not None
               else f", {p['wall_per_step'] * n * 1e3:.2f} core-ms")
            + " per step" + (" (noisy: some figures are the long run's average)" if p.get("fallbacks") else ""))


def pick(cfg: dict, most: int, goal: str, steps: tuple[int, int] = PROBE_STEPS,
         probe: bool = True) -> Optional[dict]:
    """The thread count for `goal` by a probe of each candidate (or the cached decision for this
    recipe on this machine: the same seed trains with the same count every time). One line says it."""
    import json
    import tempfile
    from datetime import datetime, timezone

    key, path = probe_key(cfg, goal, most), cache_file()
    # None: no cache, or one that is not ours to trust (a FIFO, too big, not JSON): probed again, written over
    cached = _cached(_table(path).get(key), most, goal) if path is not None else None
    if cached is not None:
        return {**cached, "cached": True, "line": cached["line"] + f" (decided {cached['when']}, {path})"}
    if not probe:  # the caller's machine is busy now: no decision rather than one measured on the neighbours
        return None
    with tempfile.TemporaryDirectory(prefix="ecotrain-threads-") as tmp:
        probes = [probe_once(cfg, n, steps, Path(tmp)) for n in candidates(most)]
    chosen, why = decide(probes, goal)
    line = (f"threads: {chosen['threads']} of {most} usable cores, chosen for {goal} ({OBJECTIVE_ENV}): {why}. "
            f"Per step, by probes of {steps[0]} and {steps[1]} steps on a copy of this run (the difference: set-up "
            f"and test cancel): {'; '.join(map(_said, probes))}")
    rec = {"threads": chosen["threads"], "objective": goal, "method": PROBE_METHOD, "probes": probes, "key": key,
           "line": line, "when": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "probe_cost": {k: sum(float(p.get(f"probe_{k}") or 0.0) for p in probes)
                          for k in ("wall_seconds", "cpu_seconds", "kwh")}}
    if path is None:  # no home folder and no ECOTRAIN_CACHE: decided for this run only
        return {**rec, "cached": False}
    try:  # recorded, so every later run of this recipe on this machine trains with the same count
        path.parent.mkdir(parents=True, exist_ok=True)
        table = _table(path)
        table[key] = {k: v for k, v in rec.items() if k != "cached"}
        try:
            text = json.dumps(table, indent=1, allow_nan=False)
        except (ValueError, RecursionError):  # other entries not JSON: this decision alone
            text = json.dumps({key: table[key]}, indent=1)
        tmp_path = path.with_suffix(f".{os.getpid()}.tmp")
        try:
            tmp_path.write_text(text)
            os.replace(tmp_path, path)
        finally:
            tmp_path.unlink(missing_ok=True)  # a failed write or replace leaves no half-written file
    except (OSError, ValueError, RecursionError):
        pass  # unwritable cache: the decision holds for this run, the next one probes again
    return {**rec, "cached": False}
