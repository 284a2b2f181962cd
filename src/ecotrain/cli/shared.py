"""What several commands share (cli/commands/ holds one module per command): the cost figures of fit,
compare and report, the registry flag of the continual commands, the serving flags of eval and predict.
Argparse and base/ only, no torch: imported with the command registry, before torch."""

from __future__ import annotations

from ecotrain.base.errors import ConfigError

COST_FIGURES = ["flops", "cpu_seconds", "wall_seconds", "energy", "co2e", "cost"]  # --by of compare, fit, report

REGISTRY_HELP = "the registry: a folder (default ./registry), or mlflow:TRACKING_URI[#MODEL] (MLflow's Model Registry)"


def serving(p) -> None:
    """The flags eval and predict share: which model of a deployment, or which domain's statistics, serves."""
    p.add_argument("--registry", help="serve the registry's deployment: the base version given, each cohort's "
                   "version, the learned router (docs/updates.md); --data is one .npz")
    p.add_argument("--cohort", help="with --registry: the cohort of every request (default: the .npz's "
                   "integer `cohort` column, else the router decides)")
    p.add_argument("--domain", help="a model trained with batchnorm policy domain: that domain's BatchNorm "
                   "statistics for every sample (unknown: the pre-trained ones; default: the .npz's `domain` "
                   "column, else the run's own domain)")


def registry_served(args) -> bool:
    """eval/predict of a registry's deployment: --registry, one .npz, no --split."""
    if args.registry is None:
        if args.cohort is not None:
            raise ConfigError("--cohort: only with --registry (a run folder is one model: nothing to route)")
        return False
    if args.domain is not None:
        raise ConfigError("--domain: not with --registry (a registry routes by --cohort); give a run folder")
    if len(args.data) != 1 or args.split:
        raise ConfigError("--registry: give --data ONE.npz (x, optional y and cohort), without --split")
    return True
