"""`ecotrain canary VERSION REQUESTS`: a held candidate served beside current on recorded requests, promoted,
held or rejected by its accuracy and latency intervals (continual/canary.py; docs/updates.md)."""

from __future__ import annotations

from ecotrain.cli.shared import REGISTRY_HELP

NAME = "canary"
HELP = ("serve a held candidate beside current on recorded requests; promote, hold or reject it by "
        "its accuracy and latency intervals")
TRAINS = False


def arguments(c) -> None:
    c.add_argument("version", help="the candidate (`update --hold` made it on current)")
    c.add_argument("requests", metavar="REQUESTS", help="recorded requests with the labels they got: .npz of x, y "
                   "[, integer cohort]")
    c.add_argument("--registry", default="registry", help=REGISTRY_HELP)
    c.add_argument("--mode", choices=["shadow", "split"], default="shadow", help="shadow (default): both versions "
                   "answer every request, paired; split: a share of the requests goes to the candidate (A/B)")
    c.add_argument("--share", type=float, default=0.2, help="split: the candidate's share of the requests (0.2)")
    c.add_argument("--max-drop", type=float, default=0.01, help="the rule: largest drop of accuracy allowed "
                   "(absolute, default 0.01), read on its 95%% interval")
    c.add_argument("--max-latency-ratio", type=float, default=1.25, help="the rule: largest ratio of median "
                   "latency per request, candidate over current (default 1.25)")
    c.add_argument("--seed", type=int, default=0, help="the split's draw and the bootstrap's (default 0)")
    c.add_argument("--cohort", help="every request is of this cohort (as predict's --cohort)")
    c.add_argument("--out", help="write the figures and the decision here (.json)")


def run(args, ctx) -> int:
    from ecotrain.continual.canary import CanaryRule, exit_code, run_canary

    rule = CanaryRule(args.max_drop, args.max_latency_ratio, args.mode, args.share, args.seed)
    decision, line, fig = run_canary(args.registry, args.version, args.requests, rule, args.cohort, args.out)
    print(f"canary_drop={fig['drop']:+.4f} [{fig['drop_interval'][0]:+.4f}, {fig['drop_interval'][1]:+.4f}] "
          f"latency_ratio={fig['latency_ratio']:.3f} [{fig['latency_ratio_interval'][0]:.3f}, "
          f"{fig['latency_ratio_interval'][1]:.3f}] decision={decision}")
    print(line)
    return exit_code(decision)
