"""The CUDA paths on one real GPU, in one prepared run of at most ~10 minutes (issue 32).

    python bench/gpu_check.py            # on a machine with CUDA; without one: RESULT cuda=absent
    python bench/gpu_check.py --quick    # the checks on the CPU, tiny: tries the script, proves nothing about CUDA

Each check runs on its own, guarded: one that fails prints its error and `<key>=error`, and the
rest still run. The checks:
- `bf16_*`, `fp16_*`: smoke runs of the demo CNN (recipes/mnist1d_cnn.yaml) with gradient clipping:
  the loss finite, fp16's skipped steps counted, the GPU energy CodeCarbon read through NVML (> 0).
- `oom_*`: an OOM injected in the plain fp32 step's backward while the failed graph holds ~1 GiB:
  one recovery, two micro-batches, and the GiB freed before the retry (`oom_freed`).
- `resume_exact`, `resume_exact_charlm`: the demo recipe and the char-transformer in bf16, killed with
  SIGKILL after a checkpoint and resumed: the final weights bit-identical to an unkilled run.
- `ddp_resume_exact`, `fsdp_resume_exact`: one rank under torchrun (NCCL; DCP shards for FSDP), the
  run's later checkpoints removed and resumed from an earlier one: the final weights bit-identical.
- `lrfind_*`: lr-find's suggestion under fp16 and bf16 (the two should agree within a few x).
- `tf32_speedup`: steps/s of an fp32 MLP with TF32 matmuls on over off (side by side, same model).
- `check_every_speedup`: steps/s with divergence.check_every 50 over 1 (one host sync per step).
- `stall_watch_quiet`, `stall_watch_fired`: the stall watch (stallwatch.py) on real CUDA events: quiet
  after completed work, one line for ~3 s of queued GPU work past a 1 s timeout.
- `bf16_gpu_peak_mib`, `fp16_gpu_peak_mib`: ledger.json's `memory.gpu_peak_allocated_bytes`.
- `plan_measured_peak_mib`, `plan_estimate_gap`: `ecotrain plan`'s measured peak of the char-transformer
  (max_memory_allocated of a few real steps in a fresh process; on --quick its peak RSS) and that
  peak over plan's estimate (plan.make_plan, memory.measure.measure_config: what `plan` prints).
Ends with one `RESULT key=value ...` line. `--quick` starts with `device=cpu`; its char-transformer,
DDP and FSDP checks read `skipped` (minutes on a CPU; tests/distributed resumes both exactly).
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "mnist1d_cnn.yaml"


def cfg(device: str, steps: int, **over):
    from ecotrain.config import load_config

    base = {"device": device, "loop.max_steps": steps, "loop.eval_every": max(steps // 2, 1),
            "loop.log_every": max(steps // 4, 1), "logging.progress": "off", "checkpoint.every_minutes": None}
    base.update(over)
    return load_config(RECIPE, [f"{k}={'null' if v is None else v}" for k, v in base.items()])


def read_json(path: Path) -> dict:
    import json

    return json.loads(path.read_text())


# -- checks: each returns its RESULT figures ---------------------------------------------------------
def smoke(device: str, precision: str, steps: int, tmp: Path) -> dict:
    from ecotrain import fit

    energy = "codecarbon" if device == "cuda" else "off"
    r = fit(cfg(device, steps, precision=precision, **{"loop.grad_clip": 1.0, "ledger.energy": energy}),
            run_dir=tmp / f"smoke-{precision}", quiet=True)
    s, key = r.summary, precision.split("-")[0]
    loss = s.get("train_loss", s.get("val_loss"))
    out = {f"{key}_loss_finite": loss is not None and math.isfinite(loss), f"{key}_steps": s["steps"],
           f"{key}_val_accuracy": round(s.get("val_accuracy", float("nan")), 3)}
    if precision == "fp16-mixed":
        out["fp16_skipped_steps"] = s.get("fp16_skipped_steps")
    ledger = read_json(r.run_dir / "ledger.json")
    parts = (ledger.get("energy") or {}).get("components_kwh") or {}
    out[f"{key}_gpu_kwh"] = f"{parts['gpu']:.3g}" if parts.get("gpu") is not None else "none"
    peak = ledger["memory"]["gpu_peak_allocated_bytes"]  # the ledger's (and summary.json's) allocator peak
    out[f"{key}_gpu_peak_mib"] = round(peak / 2**20, 1) if peak is not None else "none"
    return out


class _OOMInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, held):
        ctx.save_for_backward(held)  # the failed graph holds `held`, as a real one holds activations
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected by gpu_check)")


class OOMOnce(nn.Module):
    """The demo CNN's shape of problem in an MLP: the first training step's backward raises an OOM
    while its graph holds `held_bytes`; the retry's first forward records the memory allocated."""

    def __init__(self, held_bytes: int):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(40, 256), nn.ReLU(), nn.Linear(256, 10))
        self.held_bytes, self.calls, self.at_fail, self.at_retry = held_bytes, 0, None, None

    def forward(self, x):
        if not (self.training and torch.is_grad_enabled()):
            return self.net(x)
        self.calls += 1
        if self.calls == 1:
            held = torch.ones(self.held_bytes // 4, device=x.device, requires_grad=True) * 1.0
            self.at_fail = allocated(x.device)
            return _OOMInBackward.apply(self.net(x), held)
        if self.calls == 2:
            self.at_retry = allocated(x.device)
        return self.net(x)


def allocated(device) -> int:
    return torch.cuda.memory_allocated(device) if torch.device(device).type == "cuda" else 0


def oom(device: str, tmp: Path) -> dict:
    from ecotrain import fit

    held = 1 << 30 if device == "cuda" else 1 << 20
    model = OOMOnce(held)
    r = fit(cfg(device, 20), model=model, run_dir=tmp / "oom", quiet=True)
    s = r.summary
    freed = None if device != "cuda" else model.at_fail - model.at_retry > held // 2
    return {"oom_recoveries": s["oom_recoveries"], "oom_micro_batches": s["micro_batches"], "oom_freed": freed}


def final_weights(run_dir: Path) -> dict:
    from safetensors import safe_open

    newest = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    with safe_open(str(newest / "tensors.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys() if k.startswith("model/")}


CHARLM = [str(ROOT / "recipes" / "charlm_long.yaml"), "data.kwargs.seq_len=256"]


def resume(device: str, steps: int, tmp: Path, recipe: list[str] = (str(RECIPE),), key: str = "resume_exact") -> dict:
    every = steps // 6
    args = [*recipe, f"device={device}", "precision=bf16-mixed", f"loop.max_steps={steps}", "loop.max_epochs=null",
            f"loop.eval_every={steps // 2}", f"checkpoint.every_n_steps={every}", "checkpoint.every_minutes=null"]
    if device == "cpu":  # threads auto follows the machine's load, and two counts sum CPU reductions in another
        args.append("threads=1")  # order: the whole and the killed run must train with the same count
    tmp = tmp / key
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "ecotrain", "fit", "--quiet"]
    subprocess.run([*cmd, "--run-dir", str(tmp / "whole"), *args], check=True, env=env, capture_output=True,
                   timeout=240)
    killed = tmp / "killed"
    proc = subprocess.Popen([*cmd, "--run-dir", str(killed), *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = killed / "checkpoints" / f"step-{2 * every:08d}" / "MANIFEST.json"
    deadline = time.monotonic() + 180
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    if proc.poll() is not None:
        return {key: "not_killed"}
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    subprocess.run([*cmd, "--run-dir", str(killed), "--resume", "auto", *args], check=True, env=env,
                   capture_output=True, timeout=240)
    a, b = final_weights(tmp / "whole"), final_weights(killed)
    return {key: a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)}


def torchrun_resume(device: str, strategy: str, steps: int, tmp: Path) -> dict:
    """One rank under torchrun: a whole run, then the same run resumed from its checkpoint at step
    `steps // 2` (later ones removed): DDP's full checkpoint, or FSDP's DCP shards."""
    import shutil

    every = steps // 2
    args = [str(RECIPE), f"device={device}", f"distributed.strategy={strategy}", f"loop.max_steps={steps}",
            "loop.max_epochs=null", f"checkpoint.every_n_steps={every}", "checkpoint.every_minutes=null"]
    run = tmp / f"torchrun-{strategy}"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "--standalone",
           "-m", "ecotrain", "fit", "--quiet", "--run-dir", str(run), *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=300)
    whole = (run / "model.safetensors").read_bytes()
    for p in (run / "checkpoints").glob("step-*"):
        if int(p.name.split("-")[1]) > every:
            shutil.rmtree(p)
    (run / "model.safetensors").unlink()
    (run / "summary.json").unlink()
    subprocess.run([*cmd, "--resume", "auto"], check=True, env=env, capture_output=True, timeout=300)
    return {f"{strategy}_resume_exact": (run / "model.safetensors").read_bytes() == whole}


def lrfind(device: str, steps: int) -> dict:
    from ecotrain.assembly.lrfind import range_test

    out = {}
    for precision in ("fp16-mixed", "bf16-mixed"):
        r = range_test(cfg(device, 100, precision=precision, **{"loop.grad_clip": 1.0}), steps, 1e-5, 1.0)
        out[f"lrfind_{precision.split('-')[0]}"] = f"{r['suggestion']['lr']:.3g}"
    return out


def steps_per_second(device: str, steps: int, tmp: Path, name: str, **over) -> float:
    """An MLP wide enough, in batches large enough, for matmuls to dominate the step on a GPU."""
    from ecotrain import fit

    width, batch = (4096, 1024) if device == "cuda" else (256, 100)
    over = {"model.name": "mlp", "model.kwargs": f"{{hidden: [{width}, {width}]}}", "data.augment": "{}",
            "data.batch_size": batch,
            "ledger.energy": "off", "checkpoint.at_end": "false", "loop.eval_every": steps, **over}
    r = fit(cfg(device, steps, **over), run_dir=tmp / name, quiet=True)
    return r.summary["steps_per_second"]


def tf32(device: str, steps: int, tmp: Path) -> dict:
    was = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        off = steps_per_second(device, steps, tmp, "tf32-off")
        torch.backends.cuda.matmul.allow_tf32 = True
        on = steps_per_second(device, steps, tmp, "tf32-on")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = was
    return {"tf32_speedup": f"{on / off:.2f}"}


def check_every(device: str, steps: int, tmp: Path) -> dict:
    one = steps_per_second(device, steps, tmp, "check-1", **{"divergence.check_every": 1})
    fifty = steps_per_second(device, steps, tmp, "check-50", **{"divergence.check_every": 50})
    return {"check_every_speedup": f"{fifty / one:.2f}"}


def plan_measured(device: str, short: bool) -> dict:
    from ecotrain.config import load_config
    from ecotrain.memory.measure import measure_config
    from ecotrain.memory.estimate import make_plan

    tiny = ["model.kwargs.d_model=32", "model.kwargs.n_layers=2", "data.kwargs.max_bytes=60000"] if short else []
    c = load_config(CHARLM[0], [*CHARLM[1:], *tiny, f"device={device}", "ledger.energy=off", "logging.progress=off"])
    plan, _ = make_plan(c)
    r = measure_config(c)
    if r.out is None:
        raise RuntimeError(r.error)
    peak = r.out["peak_bytes"]
    return {"plan_measured_peak_mib": round(peak / 2**20), "plan_estimate_gap": f"{peak / plan.total:.2f}",
            "plan_oom_recoveries": r.out["oom_recoveries"]}


def stall_watch(device: str) -> dict:
    """distributed's stall watch on real CUDA events: GPU work that runs past the timeout (a kernel
    that sleeps ~3 s, as a collective whose peer died would hang) is named in one line; work that
    completes in time is not. The exit is recorded here instead of ending the process."""
    if device != "cuda":
        return {"stall_watch": "n/a"}
    from ecotrain.core.distributed import _recorded_event
    from ecotrain.core.stallwatch import StallWatch

    exits, lines = [], []

    class Out:
        def write(self, text):
            lines.append(text)

        def flush(self):
            pass

    w = StallWatch(1.0, 0, _recorded_event, poll_s=0.1, exit=exits.append, out=Out(),
                   prepare=lambda: torch.cuda.set_device(torch.cuda.current_device()))
    try:
        w.mark(1)
        torch.cuda.synchronize()
        time.sleep(1.5)  # step 1's work long done: quiet
        quiet = not exits
        try:
            mhz = torch.cuda.clock_rate()  # the SM clock, through pynvml
        except Exception:  # no pynvml: a modern GPU's ~2 GHz
            mhz = 2000
        torch.cuda._sleep(int(3 * mhz * 1e6))  # ~3 s of GPU work queued
        w.mark(2)
        deadline = time.monotonic() + 10
        while not exits and time.monotonic() < deadline:
            time.sleep(0.05)
        torch.cuda.synchronize()
    finally:
        w.stop()
    fired = exits == [1] and "step 2 has waited" in "".join(lines)
    return {"stall_watch_quiet": quiet, "stall_watch_fired": fired}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the checks on the CPU, shortened: tries the script "
                    "(device=cpu: no figure of a GPU)")
    args = ap.parse_args()
    if not args.quick and not torch.cuda.is_available():
        print("RESULT cuda=absent")
        return 0
    device = "cpu" if args.quick else "cuda"
    short = args.quick
    results: dict = {"device": "cpu" if short else torch.cuda.get_device_name().replace(" ", "_")}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        checks = [
            ("bf16", lambda: smoke(device, "bf16-mixed", 20 if short else 1500, tmp)),
            ("fp16", lambda: smoke(device, "fp16-mixed", 20 if short else 1500, tmp)),
            ("oom", lambda: oom(device, tmp)),
            ("resume_exact", lambda: resume(device, 12 if short else 1200, tmp)),
            ("resume_exact_charlm", lambda: resume(device, 300, tmp, CHARLM, "resume_exact_charlm")),
            ("ddp_resume_exact", lambda: torchrun_resume(device, "ddp", 400, tmp)),
            ("fsdp_resume_exact", lambda: torchrun_resume(device, "fsdp", 400, tmp)),
            ("lrfind", lambda: lrfind(device, 20 if short else 150)),
            ("tf32", lambda: tf32(device, 10 if short else 400, tmp)),
            ("check_every", lambda: check_every(device, 10 if short else 400, tmp)),
            ("plan_measured", lambda: plan_measured(device, short)),
            ("stall_watch", lambda: stall_watch(device)),
        ]
        if short:  # minutes each on a CPU, and nothing there that the CPU test suite does not run
            skipped = ("resume_exact_charlm", "ddp_resume_exact", "fsdp_resume_exact")
            results.update({k: "skipped" for k in skipped})
            checks = [c for c in checks if c[0] not in skipped]
        for name, check in checks:
            t0, got = time.perf_counter(), {}
            try:
                got = check()
                results.update(got)
            except Exception as exc:  # one failed check must not stop the rest
                traceback.print_exc()
                print(f"{name}: {type(exc).__name__}: {exc}"[:300], file=sys.stderr)
                results[name] = "error"
            print(f"{name}: {time.perf_counter() - t0:.0f} s {got}", file=sys.stderr, flush=True)  # kept if cut short
    print("RESULT " + " ".join(f"{k}={v}" for k, v in results.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
