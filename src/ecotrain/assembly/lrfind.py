"""`ecotrain lr-find RECIPE`: the LR range test (Smith 2015; fastai's lr_find).

The recipe's model, data, augmentation, optimizer and methods' loss terms are assembled as for a
run, but no run folder is ever accepted: the test trains a throw-away copy of the initial weights
for `--steps` steps while the LR grows exponentially from `--start` to `--end`, and stops early when
the smoothed loss exceeds `--diverge` times its minimum. It writes a plot and the curve as JSON
(never a run folder) and suggests a peak LR:

- `steepest`: the LR where the smoothed loss falls fastest per log-LR step (before its minimum);
- `min/10`: a tenth of the LR at the smoothed loss's minimum, the classic one-cycle peak.

The suggestion is `steepest` (with Adam-style optimizers it lands near the LRs that train best;
on MNIST-1D's CNN it gave 0.017 against the recipe's hand-tuned 0.01); `min/10` is printed as the
cautious choice for SGD or when the curve is noisy.
"""

from __future__ import annotations

import io
import math
import tempfile
from pathlib import Path

from ecotrain.core import distributed, loop
from ecotrain.assembly.assemble import RunOptions, UserParts, assemble
from ecotrain.config import build_config, load_config
from ecotrain.core.device import resolve_device
from ecotrain.base.errors import ConfigError
from ecotrain.core.optim import Schedule
from ecotrain.core.preemption import Preemption
from ecotrain.base.rundir import atomic_write, file_in_the_way, refuse_overwriting, write_json
from ecotrain.core.seeding import deterministic_algorithms, seed_everything


def cmd_lr_find(args, ctx) -> int:
    """`ecotrain lr-find RECIPE [overrides]` (cli/commands/lr_find.py: its arguments; `ctx`: cli/program.py's CommandContext)."""
    cfg = load_config(args.recipe, args.overrides)
    if args.steps < 10:
        raise ConfigError(f"--steps {args.steps}: at least 10 steps are needed to find a slope")
    if not 0 < args.start < args.end:
        raise ConfigError(f"--start {args.start:g} --end {args.end:g}: need 0 < start < end")
    if not 0 <= args.smooth < 1 or args.diverge <= 1:
        raise ConfigError("--smooth must be in [0, 1) and --diverge > 1")
    out = Path(args.out) if args.out else Path("runs") / f"{cfg.name}-lrfind.png"
    if out.is_dir():
        raise ConfigError(f"--out {out}: is a folder; give a file name such as {out}/lrfind.png")
    # refused before the sweep, not when its results are written
    if out.suffix.lower() == ".json":
        raise ConfigError(f"--out {out}: the plot's path, and the curve goes beside it as .json; give a .png name")
    if out.with_suffix(".json").is_dir():
        raise ConfigError(f"--out {out}: the curve's path {out.with_suffix('.json')} is a folder; choose another --out")
    blocked = file_in_the_way(out)
    if blocked is not None:
        raise ConfigError(f"--out {out}: {blocked} is a file, not a folder")
    for written in (out, out.with_suffix(".json")):  # the plot and the curve beside it
        refuse_overwriting(written, "--out", [args.recipe])
    result = range_test(cfg, args.steps, args.start, args.end, args.smooth, args.diverge)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out.with_suffix(".json"), result)
    plotted = plot(result, out)
    s = result["suggestion"]
    print(f"lr-find: {len(result['lrs'])} steps, LR {args.start:g} -> {result['lrs'][-1]:.3g}"
          + (" (stopped: loss diverged)" if result["diverged"] else ""))
    print(f"min loss {result['min_loss']:.4f} at lr {s['min_loss_lr']:.3g}; steepest descent at lr {s['steepest']:.3g}")
    print(f"suggested lr: {s['lr']:.3g} (the steepest descent; set optim.lr={s['lr']:.3g} with "
          f"schedule.name=onecycle or a warmup); cautious: {s['cautious']:.3g} (min-loss LR / 10)")
    print(f"curve: {out.with_suffix('.json')}" + (f"; plot: {out}" if plotted else
          "; plot: skipped (matplotlib is missing: pip install 'ecotrain[report]')"))
    return 0


def range_test(cfg, steps: int, start: float, end: float, smooth: float = 0.9, diverge: float = 4.0) -> dict:
    """Train a copy of the recipe's initial model with an exponentially growing LR; the curve and
    the suggestion. Nothing is written."""
    tree = cfg.to_dict()  # no ledger, trackers or checkpoints: the test is not a run
    tree["ledger"]["enabled"], tree["tracking"] = False, {}
    tree["budget"] = {}
    cfg = build_config(tree, "lr-find")
    device = resolve_device(cfg.device)
    with deterministic_algorithms(cfg.deterministic), tempfile.TemporaryDirectory() as tmp:
        seed_everything(cfg.seed)
        dist = distributed.setup(cfg, device)
        try:
            if dist.world_size > 1:
                raise ConfigError("lr-find: run it in one process (not under torchrun)")
            # planned in a folder that is never accepted: nothing is written there, and it is deleted
            run = assemble(cfg, dist, device, UserParts(), RunOptions(run_dir=Path(tmp) / "lrfind", quiet=True),
                           Preemption())
            state, opt = run.state, run.state.optimizer

            def sweep(t: int) -> float:  # the test's LR over the config's: per-group multipliers (finetune) kept
                return start * (end / start) ** (t / (steps - 1)) / cfg.optim.lr

            sched = Schedule(opt, sweep)  # the one LR writer (optim.Schedule), with the sweep as its f(t)
            augment = run.augment if run.augment.active else None
            lrs, losses = [], []
            loop.set_train_mode(state)
            batches = _batches(run.sampler)
            for i in range(steps):
                lr = start * (end / start) ** (i / (steps - 1))
                x, y = run.source.take(next(batches))
                if augment:
                    x = augment(x)
                x, y = x.to(device), y.to(device)
                loss = loop.backward_micro_batches(state, (x, y), cfg.loop.accumulate)
                value = float(loss)
                if not math.isfinite(value):
                    break
                loop.optimizer_step(state.model, opt, state.precision, cfg.loop.grad_clip)
                sched.step()
                lrs.append(lr)
                losses.append(value)
                sm = smoothed(losses, smooth)
                if i > 10 and sm[-1] > diverge * min(sm):
                    break
        finally:
            dist.shutdown()
    if len(lrs) < 10:
        raise ConfigError(f"lr-find: the loss was not finite after {len(lrs)} steps; lower --start")
    sm = smoothed(losses, smooth)
    return {"lrs": lrs, "losses": losses, "smoothed": sm, "diverged": len(lrs) < steps,
            "min_loss": min(sm), "suggestion": suggest(lrs, sm)}


def _batches(sampler):
    epoch = 0
    while True:  # as many epochs as the sweep needs
        yield from sampler.batches(epoch)
        epoch += 1


def smoothed(losses: list[float], beta: float) -> list[float]:
    """Bias-corrected exponential moving average (as Adam's moments): the first values are not pulled to 0."""
    out, avg = [], 0.0
    for i, v in enumerate(losses):
        avg = beta * avg + (1 - beta) * v
        out.append(avg / (1 - beta ** (i + 1)))
    return out


def suggest(lrs: list[float], sm: list[float]) -> dict:
    """`steepest`: most negative d(loss)/d(log lr) before the minimum, skipping the first tenth
    (the smoother's start-up); `min_loss_lr`: the LR at the minimum; `lr`: the suggestion (steepest)."""
    i_min = min(range(len(sm)), key=sm.__getitem__)
    lo = max(1, len(sm) // 10)
    slopes = [(sm[i] - sm[i - 1]) / (math.log(lrs[i]) - math.log(lrs[i - 1])) for i in range(lo, max(lo + 1, i_min + 1))]
    steepest = lrs[lo + min(range(len(slopes)), key=slopes.__getitem__)] if slopes else lrs[i_min]
    return {"steepest": steepest, "min_loss_lr": lrs[i_min], "cautious": lrs[i_min] / 10, "lr": steepest}


def plot(result: dict, out: Path) -> bool:
    """The curve as a PNG (matplotlib, Agg); False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    ax.plot(result["lrs"], result["losses"], color="0.75", lw=0.8, label="loss")
    ax.plot(result["lrs"], result["smoothed"], color="C0", lw=1.8, label="smoothed")
    s = result["suggestion"]
    ax.axvline(s["lr"], color="C2", ls="--", label=f"suggested {s['lr']:.2g}")
    ax.axvline(s["min_loss_lr"], color="C3", ls=":", label=f"min loss {s['min_loss_lr']:.2g}")
    ax.set_xscale("log")
    top = min(max(result["smoothed"]), 2 * result["smoothed"][0])  # the divergence tail would flatten the rest
    ax.set_ylim(min(result["smoothed"]) * 0.9, top * 1.05)
    ax.set(xlabel="learning rate", ylabel="training loss", title="LR range test")
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    atomic_write(out, buf.getvalue())
    return True
