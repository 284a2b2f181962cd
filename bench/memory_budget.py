"""`memory.budget` measured: the char transformer of recipes/charlm_long.yaml at T=2048, budgets at 30%,
50% and 75% of its no-checkpointing peak.

fp32 (the loss comparison is in fp32), `memory.release_freed` on (as the recipe), the ledger off (its
FLOP-counting first step defeats checkpointing; docs/memory.md), a fixed thread count. Steps:
1. the no-checkpointing plan's peak and step time, in a fresh process (memory.measure.measure);
2. the search at each budget (memory.measure.run_search, as `fit` and `ecotrain plan --budget` run it);
3. the 50% budget's chosen plan trained by `fit` for `--loss-steps` steps (its checkpointing and
   precision in the config, its micro-batch count in the counters, as memory.budget sets them),
   beside the unconstrained `fit` (no checkpointing, one micro-batch); the per-step losses are
   compared for exact equality.
`within_budget`: the chosen plan's measured peak / budget, per budget (30/50/75). `time_ratio_at_50`:
the chosen plan's step time / the no-checkpointing step time, both measured in that search (side by
side; `cpu_time_ratio_at_50` the same in CPU seconds, steadier on a shared machine). `search_seconds`:
the 50% search's wall time (`search_share`: over the demo run's); the demo run is
the recipe's `loop.max_steps` steps at the chosen plan's measured step time.

    python bench/memory_budget.py [--layers 6] [--d-model 256] [--batch 8] [--loss-steps 50] [--threads 2]
`--losses-of PLAN` only compares one plan's losses with the unconstrained run's (`RESULT loss_identical=`).
Ends with `RESULT within_budget=<30>/<50>/<75> time_ratio_at_50=<f> cpu_time_ratio_at_50=<f>
search_seconds=<f> search_share=<f> loss_identical=<true|false>`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import yaml

from ecotrain import Callback, Config, fit
from ecotrain.memory.planner import Candidate, applied, fmt_bytes, format_search
from ecotrain.memory.measure import measure, run_search

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "charlm_long.yaml"


class Losses(Callback):
    def __init__(self):
        self.losses = []

    def on_step_end(self, state):
        self.losses.append(float(state.loss))


def config(args, steps: int, budget=None) -> Config:
    d = yaml.safe_load(RECIPE.read_text())
    d.update(precision="fp32", threads=args.threads)
    d["data"].update(batch_size=args.batch, val_split=0, test_split=0)
    d["data"]["kwargs"].update(seq_len=2048, max_bytes=2049 * args.batch * (max(steps, args.loss_steps) + 2))
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--loss-steps", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--losses-of", metavar="PLAN", help="only compare the losses of this plan (e.g. all/1/fp32: "
                    "checkpointing/micro-batches/precision) with the unconstrained run's; no search")
    args = ap.parse_args()
    import torch

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
    full = measure(config(args, 3, budget="1000GiB"), Candidate("off", 1, "fp32"), False)
    print(f"no checkpointing: peak {fmt_bytes(full.peak_bytes)}, {full.step_seconds:.2f} s/step "
          f"({full.cpu_seconds:.2f} CPU-s), measured in {full.seconds:.1f} s", file=sys.stderr, flush=True)
    searches = {}
    for frac in (0.5, 0.3, 0.75):
        s = run_search(config(args, 3, budget=int(frac * full.peak_bytes)))
        print(f"--- budget {frac:.0%} of the no-checkpointing peak\n{format_search(s, args.batch)}", file=sys.stderr,
              flush=True)
        searches[frac] = s
    within = {f: s.chosen.peak_bytes / s.budget if s.chosen else float("nan") for f, s in searches.items()}
    s50 = searches[0.5]
    if s50.chosen is None:
        sys.exit("no plan fits the 50% budget on this model (the process itself outweighs its activations); "
                 "use a larger model")
    base = s50.measured[0]  # the no-checkpointing plan, measured first in the same search
    time_ratio = s50.chosen.step_seconds / base.step_seconds
    cpu_ratio = s50.chosen.cpu_seconds / base.cpu_seconds
    demo = recipe_steps * s50.chosen.step_seconds
    share = s50.seconds / demo
    print(f"chosen at 50%: {s50.chosen.candidate.describe(args.batch)}; step time {time_ratio:.2f}x the "
          f"no-checkpointing plan's ({cpu_ratio:.2f}x in CPU-s); search {s50.seconds:.1f} s = {share:.2%} of the demo "
          f"run ({recipe_steps} steps x {s50.chosen.step_seconds:.2f} s = {demo / 60:.0f} min)", file=sys.stderr,
          flush=True)
    chosen = s50.chosen.candidate
    chosen_losses = losses_of(applied(config(args, args.loss_steps), chosen), chosen.micro_batches)
    plain_losses = losses_of(config(args, args.loss_steps))
    identical = chosen_losses == plain_losses
    worst = max(abs(a - b) for a, b in zip(chosen_losses, plain_losses))
    print(f"losses over {len(plain_losses)} steps: identical={identical} (max |diff| {worst:.3g})", file=sys.stderr)
    print(f"RESULT within_budget={within[0.3]:.3f}/{within[0.5]:.3f}/{within[0.75]:.3f} time_ratio_at_50={time_ratio:.3f} "
          f"cpu_time_ratio_at_50={cpu_ratio:.3f} search_seconds={s50.seconds:.1f} search_share={share:.4f} "
          f"loss_identical={str(identical).lower()}")


if __name__ == "__main__":
    main()
