"""`memory.budget` measured: the char transformer of recipes/charlm_long.yaml at T=2048, budgets at 30%,
50% and 75% of its no-checkpointing peak.

fp32 (the loss comparison is in fp32), `memory.release_freed` on (as the recipe), the ledger off (its
FLOP-counting first step defeats checkpointing; docs/memory.md), a fixed thread count. Steps:
1. the no-checkpointing plan's peak and step time, in a fresh process (memplan_measure.measure);
2. the 30% and 75% budgets: the search alone (memplan_measure.run_search), as `ecotrain plan --budget`;
3. the 50% budget: `fit` with memory.budget (search, then `--loss-steps` training steps), beside the
   unconstrained `fit` (no checkpointing, one micro-batch) of the same steps; the per-step losses
   are compared for exact equality.
`within_budget`: the chosen plan's measured peak / budget, per budget (30/50/75). `time_ratio_at_50`:
the chosen plan's step time / the no-checkpointing step time, both measured in that search (side by
side; CPU-seconds ratio printed too). `search_seconds`: the 50% search's wall time; the demo run is
the recipe's `loop.max_steps` steps at the chosen plan's measured step time.

    python bench/memory_budget.py [--layers 6] [--d-model 256] [--batch 8] [--loss-steps 50] [--threads 2]
Ends with `RESULT within_budget=<30>/<50>/<75> time_ratio_at_50=<f> search_seconds=<f> search_share=<f>
loss_identical=<true|false>`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import yaml

from ecotrain import Callback, Config, fit
from ecotrain.memplan import Candidate, fmt_bytes, format_search
from ecotrain.memplan_measure import measure, run_search

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


def losses_of(cfg: Config) -> tuple[list, dict]:
    rec = Losses()
    with tempfile.TemporaryDirectory() as d:
        result = fit(cfg, callbacks=[rec], run_dir=Path(d) / "run", quiet=True)
    return rec.losses, result.summary


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--loss-steps", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    recipe_steps = yaml.safe_load(RECIPE.read_text())["loop"]["max_steps"]
    probe = config(args, 3, budget="1000GiB")
    full = measure(probe, Candidate("off", 1, "fp32"), False)
    print(f"no checkpointing: peak {fmt_bytes(full.peak_bytes)}, {full.step_seconds:.2f} s/step "
          f"({full.cpu_seconds:.2f} CPU-s), measured in {full.seconds:.1f} s", file=sys.stderr)
    within, searches = {}, {}
    for frac in (0.3, 0.75):
        cfg = config(args, 3, budget=int(frac * full.peak_bytes))
        s = run_search(cfg)
        print(f"--- budget {frac:.0%} of the no-checkpointing peak\n{format_search(s, args.batch)}", file=sys.stderr)
        searches[frac] = s.record(args.batch)
    cfg50 = config(args, args.loss_steps, budget=int(0.5 * full.peak_bytes))
    chosen_losses, summary = losses_of(cfg50)
    searches[0.5] = summary["memory_plan"]
    from ecotrain.memplan import from_record

    print(f"--- budget 50% of the no-checkpointing peak (fit)\n{format_search(from_record(searches[0.5]), args.batch)}",
          file=sys.stderr)
    plain_losses, _ = losses_of(config(args, args.loss_steps))
    for frac in (0.3, 0.5, 0.75):
        rec = searches[frac]
        within[frac] = rec["chosen"]["peak_bytes"] / rec["budget_bytes"] if rec["chosen"] else float("nan")
    rec = searches[0.5]
    base = next(r for r in rec["measured"] if r["checkpointing"] == "off" and r["micro_batches"] == 1)
    time_ratio = rec["chosen"]["step_seconds"] / base["step_seconds"]
    cpu_ratio = rec["chosen"]["cpu_seconds"] / base["cpu_seconds"]
    demo = recipe_steps * rec["chosen"]["step_seconds"]
    share = rec["search_seconds"] / demo
    identical = chosen_losses == plain_losses
    worst = max(abs(a - b) for a, b in zip(chosen_losses, plain_losses))
    print(f"losses over {len(plain_losses)} steps: identical={identical} (max |diff| {worst:.3g}); chosen at 50%: "
          f"{rec['chosen']['plan']}; step time {time_ratio:.2f}x the no-checkpointing plan's ({cpu_ratio:.2f}x in "
          f"CPU-s); search {rec['search_seconds']:.1f} s = {share:.2%} of the demo run ({recipe_steps} steps x "
          f"{rec['chosen']['step_seconds']:.2f} s = {demo / 60:.0f} min)", file=sys.stderr)
    print(f"RESULT within_budget={within[0.3]:.3f}/{within[0.5]:.3f}/{within[0.75]:.3f} time_ratio_at_50={time_ratio:.3f} "
          f"search_seconds={rec['search_seconds']:.1f} search_share={share:.4f} loss_identical={str(identical).lower()}")


if __name__ == "__main__":
    main()
