"""`ecotrain eval RUN_OR_CKPT`: a trained model evaluated in eval mode, its metrics printed and written
(export/inference.py; a registry's deployment: continual/serve.py)."""

from __future__ import annotations

from ecotrain.cli.shared import registry_served, serving

NAME = "eval"
HELP = ("evaluate a trained model (run or checkpoint folder) in eval mode; prints and writes its metrics "
        "(RUN/eval-<label>.json)")
TRAINS = False


def arguments(ev) -> None:
    ev.add_argument("target", metavar="RUN_OR_CKPT", help="a run folder or a checkpoint folder; with --registry, a "
                    "version (`current`)")
    ev.add_argument("--data", nargs="+", default=[], metavar="FILE|KEY=VALUE", help="a .npz/.csv file and/or "
                    "overrides of the run's data section (num_samples=2000); default: the run's own data")
    ev.add_argument("--split", choices=["test", "val", "train", "all"], help="default: test, or all when the data "
                    "has no test split")
    ev.add_argument("--out", help="metrics JSON path (default RUN/eval-<label>.json)")
    serving(ev)


def run(args, ctx) -> int:
    if registry_served(args):
        from ecotrain.continual import serve

        record, path = serve.evaluate(args.registry, args.target, args.data[0], args.out, args.cohort)
        ctx.committed()
        print(f"accuracy: {record['accuracy']:.4f} ({record['samples']} samples, served by "
              + ", ".join(f"{v} {r['samples']} at {r['accuracy']:.4f}" for v, r in record["routes"].items()) + ")")
        print(f"wrote {path}")
        return 0
    from ecotrain.export.inference import evaluate

    record, path = evaluate(args.target, args.data, args.split, args.out, domain=args.domain)
    ctx.committed()
    for k, v in record.items():
        if isinstance(v, float):
            print(f"{record['split']}_{k}: {v:.4f}")
    for key, r in record.get("domains", {}).items():  # an .npz domain column: each domain's own figures
        print(f"domain {key}: accuracy {r.get('accuracy', float('nan')):.4f} ({r['samples']} samples, "
              f"{r['bn_statistics']} statistics)")
    if "domain" in record:
        print(f"domain {record['domain']}: {record['bn_statistics']} BatchNorm statistics")
    print(f"samples: {record['samples']} ({record['split']}, eval mode)")
    print(f"wrote {path}")
    return 0
