"""What a run ran on: package versions, the git commit of the user's code, the hardware, the dataset.

`capture()` builds the dict that `finish` writes as `RUN/environment.json` (rank 0); the report and
the trackers read it from there. Every probe is best effort and quick: a probe that fails (no git,
not a repository, a git that hangs past `GIT_TIMEOUT`, no /proc/cpuinfo) leaves its entry out
rather than failing the run.

    python      version, implementation, executable
    platform    system, release, machine
    packages    installed versions of the libraries a run's numbers depend on (read from package
                metadata: nothing is imported)
    git         commit, branch, dirty (tracked files changed; untracked files such as run folders
                do not count), root -- only when the working directory is inside a git repository
    hardware    cpu_model, cpu_count (logical), cpus_usable (this process's affinity), memory_gb,
                torch_threads, threads (how fit chose them: threads.ThreadChoice, with `why`),
                gpus [{name, memory_gb}], cuda (torch's CUDA version)
    dataset_hash the content hash of every split (the same as summary.json's)
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Optional

from ecotrain.base.runfiles import RunFiles

GIT_TIMEOUT = 2.0  # seconds per git call
PACKAGES = ("ecotrain", "torch", "numpy", "pydantic", "pyyaml", "safetensors", "xxhash", "rich", "scikit-learn",
            "scipy", "mnist1d", "codecarbon", "matplotlib", "mlflow", "tensorboard")


def capture(dataset_hash: Optional[str] = None, cwd: Optional[Path] = None, threads=None) -> dict:
    """`threads`: the run's threads.ThreadChoice, recorded under hardware.threads."""
    env: dict = {
        "python": {"version": platform.python_version(), "implementation": platform.python_implementation(),
                   "executable": sys.executable},
        "platform": {"system": platform.system(), "release": platform.release(), "machine": platform.machine()},
        "packages": packages(),
        "hardware": hardware(),
    }
    if threads is not None:
        env["hardware"]["threads"] = threads.to_json()
    repo = git_info(cwd)
    if repo is not None:
        env["git"] = repo
    if dataset_hash is not None:
        env["dataset_hash"] = dataset_hash
    return env


def write_environment(run_dir: Path, dataset_hash: Optional[str] = None, threads=None) -> dict:
    """Capture the environment and write it as `run_dir/environment.json` (atomic)."""
    from ecotrain.base.rundir import write_json

    env = capture(dataset_hash, threads=threads)
    write_json(RunFiles(run_dir).environment, env)
    return env


def packages(names=PACKAGES) -> dict:
    """{distribution: version} of those installed (package metadata; nothing imported)."""
    from importlib import metadata

    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def _git(args: list[str], cwd: Optional[Path]) -> Optional[str]:
    try:
        r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=GIT_TIMEOUT,
                           env={**os.environ, "GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0"},
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):  # no git, a timeout
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def git_info(cwd: Optional[Path] = None) -> Optional[dict]:
    """{commit, branch, dirty, root} of the repository holding `cwd` (default: the working
    directory); None outside a repository or when git is missing or slow. GIT_OPTIONAL_LOCKS=0:
    `git status` never takes the index lock, so it cannot disturb the user's own git commands."""
    top = _git(["rev-parse", "--show-toplevel"], cwd)
    if not top:
        return None
    commit = _git(["rev-parse", "HEAD"], cwd)  # None in a repository with no commit yet
    status = _git(["status", "--porcelain", "--untracked-files=no"], cwd)
    branch = _git(["rev-parse", "--abbrev-ref", "HEAD"], cwd)
    out = {"root": top, "commit": commit, "branch": branch if branch and branch != "HEAD" else None,
           "dirty": bool(status) if status is not None else None}
    return out


def cpu_model() -> Optional[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def memory_gb() -> Optional[float]:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


def hardware() -> dict:
    hw: dict = {"cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "memory_gb": memory_gb()}
    try:
        hw["cpus_usable"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pass
    torch = sys.modules.get("torch")  # only when the run already imported it: never imported for this
    if torch is not None:
        hw["torch_threads"] = torch.get_num_threads()
        hw["cuda"] = torch.version.cuda
        hw["tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)  # as the run had it (config `tf32`)
        gpus = []
        try:
            if torch.cuda.is_available():
                for i in range(torch.cuda.device_count()):
                    p = torch.cuda.get_device_properties(i)
                    gpus.append({"name": p.name, "memory_gb": round(p.total_memory / 2**30, 1)})
        except Exception:  # a broken driver: leave the GPUs out
            gpus = []
        hw["gpus"] = gpus
    return hw
