"""`memory.budget` measured: the char transformer of recipes/charlm_long.yaml, budgets at 30%, 50% and
75% of its no-checkpointing peak, with every lever: whole-block checkpointing, selective recompute
(matmul outputs kept), activation offload (CPU: a file in the run folder), micro-batches.

fp32 (the loss comparison is in fp32), `memory.release_freed` on (as the recipe), the ledger off (its
FLOP-counting first step defeats checkpointing; docs/memory.md), a fixed thread count. Steps:
1. the no-checkpointing plan's peak and step time, in a fresh process (memory.measure.measure);
2. the search at each budget (memory.measure.run_search, as `fit` and `ecotrain plan --budget` run it);
   every measured plan also evaluates 2 batches at its evaluation batch, and that peak counts;
3. selective recompute of every block against whole-block checkpointing at the same peak: every
   whole-block plan (none, 1, 2, 3, ... all blocks) measured in a fresh process, its CPU seconds
   interpolated at the selective plan's measured peak;
4. one training step of the recipe's model with activation offload and one without, in this process:
   the gradients compared with `torch.equal`;
5. the 50% budget's chosen plan trained by `fit` for `--loss-steps` steps beside the unconstrained
   `fit`; the per-step losses compared for exact equality.
`within_budget`: the chosen plan's measured peak (evaluation's included) / budget, at 30/50/75%.
`time_ratio_at_50`: the chosen plan's wall time per step / the no-budget plan's, both measured in
that search (`cpu_time_ratio_at_50` the same in CPU seconds, steadier on a shared machine).
`sac_vs_block_time`: step 3's CPU-seconds ratio, selective over whole-block at equal peak.
`offload_grad_identical`: step 4. `eval_in_budget`: at every budget, the chosen plan's peak after
evaluation <= the budget. `search_seconds`: the wall time of the 50% search's measuring processes (`search_share`: over the
demo run's, the recipe's `loop.max_steps` steps at the chosen plan's measured step time). Each plan
is measured once and shared by the searches (memory.measure.run_search's `memo`): a plan's peak and
time do not depend on the budget.

    python bench/memory_budget.py [--layers 6] [--d-model 256] [--batch 8] [--seq-len 2048]
                                  [--loss-steps 10] [--threads 2] [--budgets 0.3,0.5,0.75] [--no-sac] [--quick]
`--quick` (a check that the bench runs, not a figure): 2 layers, d_model 64, batch 4, one budget (95%:
at 50% this process outweighs the model's activations; its search gives the *_at_50 keys), no selective
comparison, 2 loss steps.
`--losses-of PLAN` only compares one plan's losses with the unconstrained run's (`RESULT loss_identical=`).
Ends with `RESULT within_budget=<30>/<50>/<75> time_ratio_at_50=<f> cpu_time_ratio_at_50=<f>
offload_grad_identical=<bool> sac_vs_block_time=<f> eval_in_budget=<bool> search_seconds=<f>
search_share=<f> loss_identical=<bool>`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
import yaml

from ecotrain import Callback, Config, fit
from ecotrain.data import load_data
from ecotrain.core.levers import configure_memory
from ecotrain.memory.measure import estimates, first_candidate, measure, run_search
from ecotrain.memory.planner import Candidate, applied, checkpoint_levels, fmt_bytes, format_search
from ecotrain.models import build_model
from ecotrain.core.task import build_task

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "charlm_long.yaml"


class Losses(Callback):
    def __init__(self):
        self.losses = []

    def on_step_end(self, state):
        self.losses.append(float(state.loss))


def config(args, steps: int, budget=None) -> Config:
    d = yaml.safe_load(RECIPE.read_text())
    d.update(precision="fp32", threads=args.threads)
    # a small validation split: every measured plan evaluates 2 batches of it
    d["data"].update(batch_size=args.batch, val_split=0.2, test_split=0)
    samples = args.batch * (max(steps, args.loss_steps) + 2)
    d["data"]["kwargs"].update(seq_len=args.seq_len, max_bytes=(args.seq_len + 1) * int(samples / 0.8 + 2 * args.batch))
    d["model"]["kwargs"].update(d_model=args.d_model, n_layers=args.layers)
    d["memory"].update(activation_checkpointing="off", budget=budget)
    d["loop"].update(max_steps=steps, eval_every=None, log_every=1000)
    d["checkpoint"] = {"at_end": False, "every_minutes": None}
    d["logging"] = {"progress": "off"}
    d["ledger"] = {"enabled": False}
    return Config.model_validate(d)


def losses_of(cfg: Config, micro_batches: int = 1) -> list:
    rec = Losses()

    class Micro(Callback):  # the chosen plan's micro-batch count, as fit sets it (assemble.py)
        def on_fit_start(self, state):
            if micro_batches > 1:
                state.plan.raise_micro_batches(micro_batches)

    with tempfile.TemporaryDirectory() as d:
        fit(cfg, callbacks=[Micro(), rec], run_dir=Path(d) / "run", quiet=True)
    return rec.losses


def offload_grads_identical(args) -> bool:
    """One step of the recipe's model on one real batch, offloaded (CPU: to a file) and not: torch.equal."""
    cfg = config(args, 1)
    bundle = load_data(cfg)
    batch = bundle.train.take(torch.arange(min(2, args.batch)))
    grads = []
    with tempfile.TemporaryDirectory() as folder:
        for offload in ("off", "on"):
            mem = cfg.memory.model_copy(update={"activation_offload": offload, "offload_dir": folder})
            torch.manual_seed(cfg.seed)
            model = build_model(cfg.model, bundle.input_shape, bundle.num_classes)
            configure_memory(model, mem)
            task = build_task(cfg, bundle.sample, lm=True, num_classes=None)
            task.loss(task.forward(model, batch), batch).backward()
            grads.append([p.grad for p in model.parameters()])
    return all(torch.equal(a, b) for a, b in zip(*grads))


def sac_vs_block(args, memo: dict) -> tuple[float, str]:
    """CPU seconds per step of selective recompute of every block over whole-block checkpointing's at
    the same measured peak: the whole-block plans (no checkpointing, 1, 2, 3 ... every block) are each
    measured in a fresh process and their (peak, CPU-s) points interpolated at the selective plan's
    peak (plans come in steps of a block: no whole-block plan lands on that peak itself)."""
    cfg = config(args, 3, budget="1000GiB")
    _, n_blocks = estimates(cfg)
    sel = Candidate("all", 1, "fp32", n_blocks, "matmuls")
    blocks = [Candidate(level, 1, "fp32", count) for level, count in checkpoint_levels(n_blocks, False)]
    for c in (sel, *blocks):
        if c.key not in memo:
            memo[c.key] = measure(cfg, c, False)
    pick = lambda c: memo[c.key][0] if isinstance(memo[c.key], tuple) else memo[c.key]  # noqa: E731
    a = pick(sel)
    pts = sorted((pick(c).peak_bytes, pick(c).cpu_seconds, c) for c in blocks)
    below = [p for p in pts if p[0] <= a.peak_bytes]
    above = [p for p in pts if p[0] > a.peak_bytes]
    if below and above:
        (p0, t0, c0), (p1, t1, c1) = below[-1], above[0]
        at = t0 + (t1 - t0) * (a.peak_bytes - p0) / (p1 - p0)
        how = (f"interpolated between {c0.describe(args.batch)} ({fmt_bytes(p0)}, {t0:.2f} CPU-s) and "
               f"{c1.describe(args.batch)} ({fmt_bytes(p1)}, {t1:.2f} CPU-s)")
    else:  # outside the whole-block plans' range: the nearest one
        p0, at, c0 = min(pts, key=lambda p: abs(p[0] - a.peak_bytes))
        how = f"nearest: {c0.describe(args.batch)} ({fmt_bytes(p0)}), outside the whole-block range"
    line = (f"{sel.describe(args.batch)}: peak {fmt_bytes(a.peak_bytes)}, {a.cpu_seconds:.2f} CPU-s "
            f"({a.step_seconds:.2f} s)/step; whole-block checkpointing at that peak: {at:.2f} CPU-s/step ({how})")
    return a.cpu_seconds / at, line


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--loss-steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budgets", default="0.3,0.5,0.75", help="fractions of the no-checkpointing peak")
    ap.add_argument("--no-sac", action="store_true", help="skip the selective vs whole-block comparison")
    ap.add_argument("--quick", action="store_true", help="2 layers, d_model 64, one budget (90%%), no selective "
                    "comparison: checks the bench runs")
    ap.add_argument("--losses-of", metavar="PLAN", help="only compare the losses of this plan (e.g. all/1/fp32: "
                    "checkpointing/micro-batches/precision) with the unconstrained run's; no search")
    args = ap.parse_args()
    if args.quick:  # the process outweighs this model's activations at 50%: one budget that a plan meets (at
        # 90% the smallest plan sat at the usable bytes within a MiB: 365/365 here, 406/406 in a clean clone)
        args.layers, args.d_model, args.batch, args.budgets, args.no_sac, args.loss_steps = 2, 64, 4, "0.95", True, 2
    torch.set_num_threads(args.threads)
    if args.losses_of:
        level, n, precision = args.losses_of.split("/")
        plan = Candidate(level, int(n), precision)
        mine = losses_of(applied(config(args, args.loss_steps), plan), plan.micro_batches)
        plain = losses_of(config(args, args.loss_steps))
        worst = max(abs(a - b) for a, b in zip(mine, plain))
        print(f"{plan.describe(args.batch)} vs no checkpointing, 1 micro-batch: {len(plain)} losses, max |diff| "
              f"{worst:.3g}", file=sys.stderr)
        print(f"RESULT loss_identical={str(mine == plain).lower()}")
        return
    recipe_steps = yaml.safe_load(RECIPE.read_text())["loop"]["max_steps"]
    grads_equal = offload_grads_identical(args)
    print(f"offloaded step's gradients torch.equal to the plain step's: {grads_equal}", file=sys.stderr, flush=True)
    # the no-budget plan, with the estimates every search calibrates on (a budget it passes asks for them)
    cfg = config(args, 3, budget="1MiB")
    first = first_candidate(cfg)
    memo = {first.key: measure(cfg, first, True)}  # each plan measured once, whatever the budget
    full = memo[first.key][0]
    print(f"no checkpointing: peak {fmt_bytes(full.peak_bytes)}, {full.step_seconds:.2f} s/step "
          f"({full.cpu_seconds:.2f} CPU-s), measured in {full.seconds:.1f} s", file=sys.stderr, flush=True)
    fracs = [float(f) for f in args.budgets.split(",")]
    searches = {}
    head = 0.5 if 0.5 in fracs else fracs[0]  # the budget of the *_at_50 figures (--quick: its one budget)
    for frac in sorted(fracs, key=lambda f: f != head):  # 50% first: the figures that need it come early
        s = run_search(config(args, 3, budget=int(frac * full.peak_bytes)), memo)
        print(f"--- budget {frac:.0%} of the no-checkpointing peak\n{format_search(s, args.batch)}", file=sys.stderr,
              flush=True)
        searches[frac] = s
    within = {f: s.chosen.top / s.budget if s.chosen else float("nan") for f, s in searches.items()}
    eval_ok = all(s.chosen is not None and s.chosen.eval_peak_bytes is not None
                  and s.chosen.eval_peak_bytes <= s.budget for s in searches.values())
    s50 = searches[head]
    if s50.chosen is None:
        sys.exit(f"no plan fits the {head:.0%} budget on this model (the process itself outweighs its activations); "
                 "use a larger model")
    base = s50.measured[0]  # the no-budget plan (no checkpointing, one micro-batch), measured first in the same search
    time_ratio = s50.chosen.step_seconds / base.step_seconds
    cpu_ratio = s50.chosen.cpu_seconds / base.cpu_seconds
    demo = recipe_steps * s50.chosen.step_seconds
    search_seconds = sum(m.seconds for m in s50.measured)  # its processes' wall time, the shared baseline's too
    share = search_seconds / demo
    print(f"chosen at 50%: {s50.chosen.candidate.describe(args.batch)}; step time {time_ratio:.2f}x the "
          f"no-budget plan's ({cpu_ratio:.2f}x in CPU-s); search {search_seconds:.1f} s = {share:.2%} of the demo "
          f"run ({recipe_steps} steps x {s50.chosen.step_seconds:.2f} s = {demo / 60:.0f} min)", file=sys.stderr,
          flush=True)
    sac = float("nan")
    if not args.no_sac:
        sac, line = sac_vs_block(args, memo)
        print(f"selective vs whole-block: {line}: {sac:.3f}x", file=sys.stderr, flush=True)
    chosen = s50.chosen.candidate
    chosen_losses = losses_of(applied(config(args, args.loss_steps), chosen), chosen.micro_batches)
    plain_losses = losses_of(config(args, args.loss_steps))
    identical = chosen_losses == plain_losses
    worst = max(abs(a - b) for a, b in zip(chosen_losses, plain_losses))
    print(f"losses over {len(plain_losses)} steps: identical={identical} (max |diff| {worst:.3g})", file=sys.stderr)
    fig = "/".join(f"{within[f]:.3f}" for f in sorted(within))
    print(f"RESULT within_budget={fig} time_ratio_at_50={time_ratio:.3f} cpu_time_ratio_at_50={cpu_ratio:.3f} "
          f"offload_grad_identical={str(grads_equal).lower()} sac_vs_block_time={sac:.3f} "
          f"eval_in_budget={str(eval_ok).lower()} search_seconds={search_seconds:.1f} search_share={share:.4f} "
          f"loss_identical={str(identical).lower()}")


if __name__ == "__main__":
    main()
