"""The arguments of the commands that train a recipe or continue a run: `fit` (cli/fit.py, cli/seeds.py)
and `resume` (entry.resume_run). Argparse only, no torch: imported to parse its command, before torch
(ecotrain/cli/commands.py lists the commands)."""

from __future__ import annotations

from ecotrain.cli.accounting_args import COST_FIGURES


def fit(f) -> None:
    f.add_argument("recipe", help="recipe YAML, e.g. recipes/mnist1d_cnn.yaml")
    f.add_argument("overrides", nargs="*", help="dotted overrides, e.g. optim.lr=3e-3 loop.max_epochs=5")
    f.add_argument("--run-dir", help="run folder (default runs/<recipe>-<timestamp>)")
    f.add_argument("--quiet", action="store_true", help="no progress bar, only the final lines")
    f.add_argument("--resume", metavar="auto|CKPT", help="auto: continue from the run folder's newest valid "
                   "checkpoint if there is one, else start fresh; or a checkpoint folder")
    f.add_argument("--init-from", metavar="CKPT", help="start from these weights (checkpoint folder, .safetensors, "
                   "or a state_dict file read with weights_only=True)")
    f.add_argument("--keep-optimizer", action="store_true", help="with --init-from a checkpoint: keep its optimizer state")
    f.add_argument("--allow-config-change", action="store_true", help="resume even though the config changed (listed)")
    f.add_argument("--overwrite", action="store_true", help="replace the run already in --run-dir (its files are deleted)")
    f.add_argument("--seeds", metavar="0,1,2", help="one run per seed in sibling folders (--run-dir D: D-s0, D-s1, ...) "
                   "and a group file D-group.json for compare/report")
    f.add_argument("--baseline", metavar="RECIPE", help="with --seeds: also train this recipe on the same seeds "
                   "(D-baseline-s0, ...: paired) and print compare's verdict (exit 0 PASS, 1 FAIL or INCONCLUSIVE)")
    f.add_argument("--until-decided", action="store_true", help="with --baseline: add one seed to both sides at a "
                   "time until the verdict is PASS or FAIL, judged by an interval valid at every look "
                   "(docs/evaluation.md)")
    f.add_argument("--max-seeds", type=int, default=20, help="--until-decided stops here (default 20 per side)")
    f.add_argument("--max-accuracy-drop", type=float, default=0.01, help="with --baseline: as compare's (default 0.01)")
    f.add_argument("--min-cost-cut", type=float, default=0.5, help="with --baseline: as compare's (default 0.5)")
    f.add_argument("--by", default="flops", choices=COST_FIGURES,
                   help="with --baseline: the cost figure (default flops: counted, the same on any machine)")
    f.add_argument("--metric", default="test_accuracy", help="with --baseline: summary.json key (default test_accuracy)")
    f.add_argument("--print-config", action="store_true", help="print the merged, validated config as YAML "
                   "and exit without training")
    f.add_argument("--carbon-forecast", metavar="FILE", help="grid-intensity forecast (Carbon Aware SDK or "
                   "ElectricityMaps JSON, or CSV time,gCO2e/kWh): pause at a checkpoint while the grid is dirty "
                   "(carbon.forecast; docs/green.md)")
    f.add_argument("--deadline", help="with --carbon-forecast: finish by this ISO time or duration (12h); the run "
                   "trains in the cleanest hours before it (carbon.deadline)")


def resume(r) -> None:
    r.add_argument("run_dir")
    r.add_argument("overrides", nargs="*", help="dotted overrides (need --allow-config-change)")
    r.add_argument("--quiet", action="store_true")
    r.add_argument("--allow-config-change", action="store_true")
