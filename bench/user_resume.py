"""Exact resume with the user's own loader (issue 43): a user's program (tests/helpers/user_program.py)
is run whole, and again killed by SIGKILL twice (in epoch 0 and in epoch 2) and restarted with
resume="auto"; the final checkpoints must be byte-identical (tensors.safetensors; meta.json but for
its history fields). Then the per-step cost of ecotrain's loop against a hand-written one on the
same kernel (bench/overhead.py's measure), so the fix costs the step nothing.

    python bench/user_resume.py [--quick]   # quick: one loader and one path, a 20-step overhead round

Prints `RESULT dataloader_resume_identical=... checkpoint_bytes_identical=... overhead_ratio_same_kernel=...`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "helpers"))
from user_program import final_checkpoint_differences  # noqa: E402

PROGRAM = ROOT / "tests" / "helpers" / "user_program.py"
LOADERS = ("shuffle0", "shuffle2", "random_sampler", "weighted", "batch_sampler")
PATHS = ("builtin", "dataset", "stateful", "iterable")
KILLS = (3, 14)  # 6 steps an epoch: one kill in epoch 0, one in epoch 2


def run(kind: str, run_dir: Path, *extra: str) -> int:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(PROGRAM), kind, str(run_dir), *extra], env=env,
                          capture_output=True, text=True, timeout=600).returncode


def source_digest() -> str:
    """The code the runs execute: ecotrain's sources and the user's program."""
    import hashlib

    h = hashlib.sha256()
    for f in sorted((ROOT / "src" / "ecotrain").rglob("*.py")) + [PROGRAM]:
        h.update(f.read_bytes())
    return h.hexdigest()


def killed_twice_matches(kind: str, root: Path, tries: int = 3) -> list:
    """[] when the run killed at each of KILLS and restarted ends as the whole run does; else what differs.
    Its runs must execute one code: a working tree edited meanwhile (a checkout, a save) made the whole
    run and the resumed one different programs (a config field added between them reads `None vs off`),
    so a kind whose source changed under it is run again."""
    for _ in range(tries):
        before = source_digest()
        diffs = _killed_twice(kind, root)
        if source_digest() == before:
            return diffs
    return [f"{kind}: the source changed during each of {tries} tries"]


def _killed_twice(kind: str, root: Path) -> list:
    import shutil

    whole, cut = root / f"{kind}-whole", root / f"{kind}-cut"
    for d in (whole, cut):
        shutil.rmtree(d, ignore_errors=True)
    if run(kind, whole):
        return [f"{kind}: the whole run failed"]
    for k in KILLS:
        rc = run(kind, cut, "--kill-after", str(k))
        if rc != -9:
            return [f"{kind}: the run to kill after step {k} ended with {rc}, not SIGKILL"]
    if run(kind, cut):
        return [f"{kind}: the resumed run failed"]
    return [f"{kind}: {d}" for d in final_checkpoint_differences(whole, cut)]


def main() -> None:
    quick = "--quick" in sys.argv
    with tempfile.TemporaryDirectory() as tmp:
        loaders = {k: killed_twice_matches(k, Path(tmp)) for k in (LOADERS[:1] if quick else LOADERS)}
        paths = {k: killed_twice_matches(k, Path(tmp)) for k in (PATHS[:1] if quick else PATHS)}
    for k, diffs in {**loaders, **paths}.items():
        print(f"{k:16s} {'identical' if not diffs else '; '.join(diffs[:4])}")
    sys.path.insert(0, str(ROOT / "bench"))
    from overhead import same_kernel_ratio

    ratio = same_kernel_ratio(20, 1) if quick else same_kernel_ratio()
    print(f"RESULT dataloader_resume_identical={str(not any(loaders.values())).lower()} "
          f"checkpoint_bytes_identical={str(not any(paths.values())).lower()} overhead_ratio_same_kernel={ratio:.3f}")


if __name__ == "__main__":
    main()
