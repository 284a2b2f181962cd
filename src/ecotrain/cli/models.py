"""The bodies of the commands that load torch: `resume`, `plan`, `eval`, `predict`, `bn-report`
(cli/program.py parses the arguments and dispatches here, so `ecotrain --help` does not import this module).

Each handler takes `(args, ctx)`: `ctx` is the CLI's CommandContext (cli/program.py), with the stop-signal
handler, `committed()` (a command's file is in place) and `trained(code)` (a finished torchrun worker).
"""

from __future__ import annotations

import os

from ecotrain.core import threads
from ecotrain.config import load_config
from ecotrain.continual import serve
from ecotrain.core.device import resolve_device
from ecotrain.core.distributed import under_torchrun
from ecotrain.assembly.entry import resume_run
from ecotrain.base.errors import EXIT_USAGE, ConfigError, EcotrainError
from ecotrain.export.generate import cmd_continue
from ecotrain.export.predict import cmd_predict_exported, is_exported
from ecotrain.export.inference import evaluate, predict
from ecotrain.memory.estimate import format_plan, make_plan, measured_report
from ecotrain.memory.measure import measure_config, run_search
from ecotrain.memory.planner import format_search
from ecotrain.memory.shard import one_machine, strategies_for
from ecotrain.methods.batchnorm import format_report, read_report
from ecotrain.report.memory_page import write_page


def cmd_resume(args, ctx) -> int:
    return ctx.trained(resume_run(args.run_dir, args.overrides, quiet=args.quiet,
                                  allow_config_change=args.allow_config_change, preemption=ctx.preemption))


def cmd_plan(args, ctx) -> int:
    """Under torchrun, rank 0 plans for the job's world size (its own measuring groups); the others end."""
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun() else 1
    if world > 1 and os.environ["RANK"] != "0":
        return 0
    budget = [f"memory.budget={args.budget}"] if args.budget else []
    cfg = load_config(args.recipe, [*args.overrides, *budget])
    if args.out and cfg.memory.budget is None:
        raise ConfigError("plan --out: needs --budget (the page shows the plans measured for it)")
    plan, blocks = make_plan(cfg)
    print(format_plan(cfg, plan, blocks))
    if args.measure or (args.measure is None and resolve_device(cfg.device).type == "cuda"):
        _plan_measured(cfg, plan, world)
    if cfg.memory.budget is None:
        return 0
    if world > 1:
        one_machine(world)
    with threads.for_fit(cfg.threads, cfg.data.workers):  # the thread count fit would train with
        search = run_search(cfg, ranks=world, strategies=strategies_for(cfg, world))
    batch = cfg.data.batch_size * cfg.loop.accumulate
    print(format_search(search, batch))
    if args.out:
        print(f"page: {write_page(search.record(batch), args.out, cfg.name)}")
    return 0 if search.chosen else 1


def _plan_measured(cfg, plan, ranks: int) -> None:
    """`plan`'s measured lines: the config as written, trained a few steps in a fresh process (one per rank)."""
    with threads.for_fit(cfg.threads, cfg.data.workers):  # the thread count fit would train with
        r = measure_config(cfg, ranks)
    lines, failed = measured_report(plan, r.out, r.device, cfg.memory.search_steps, r.error)
    if lines:
        print("\n".join(lines))
    if failed:
        raise (ConfigError if r.returncode == EXIT_USAGE else EcotrainError)(failed)


def cmd_eval(args, ctx) -> int:
    if _registry_served(args):
        record, path = serve.evaluate(args.registry, args.target, args.data[0], args.out, args.cohort)
        ctx.committed()
        print(f"accuracy: {record['accuracy']:.4f} ({record['samples']} samples, served by "
              + ", ".join(f"{v} {r['samples']} at {r['accuracy']:.4f}" for v, r in record["routes"].items()) + ")")
        print(f"wrote {path}")
        return 0
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


def _registry_served(args) -> bool:
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


def cmd_predict(args, ctx) -> int:
    lm_flags = (args.prompt, args.prompts, args.max_new_tokens, args.temperature, args.top_k, args.seed,
                args.format, args.tokenizer)
    if args.sample or any(v is not None for v in lm_flags):  # a language model continues prompts
        return cmd_continue(args, ctx)
    if is_exported(args.target):  # a .pt2/.onnx from `ecotrain export`: no run folder, no model class
        return cmd_predict_exported(args, ctx)
    if not args.data or args.out is None:
        raise ConfigError(f"predict {args.target}: give --data FILE|KEY=VALUE and --out CSV (a language model: "
                          "--prompt TEXT or --prompts FILE)")
    if _registry_served(args):
        rows, path, counts = serve.predict(args.registry, args.target, args.data[0], args.out, args.cohort)
        ctx.committed()
        print(f"wrote {rows} predictions to {path} (served by " + ", ".join(f"{v}: {n}" for v, n in counts.items())
              + ")")
        return 0
    rows, path = predict(args.target, args.data, args.out, args.split, domain=args.domain)
    ctx.committed()
    print(f"wrote {rows} predictions to {path}")
    return 0


def cmd_bn_report(args, ctx) -> int:
    print(format_report(read_report(args.run_dir)))
    return 0
