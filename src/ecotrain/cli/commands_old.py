"""Every `ecotrain` command, the one place they are registered, in the order `ecotrain --help` shows
them: its name, its one-line help, the function that adds its arguments to its subparser, and its
handler. The arguments' function lives beside the command's feature, in its owner's light module
(`cli/memory_args.py` for plan, argparse only, no torch); the handler's module imports torch at its top.
Both are named as "module:function" and imported only when their command is parsed or run (cli/program.py), so
`ecotrain --help` imports none of them and `ecotrain fit` only fit's parser.

A new command: its arguments' function in its owner's commands module, its handler, and a line here."""

from __future__ import annotations

import importlib


class Command:
    __slots__ = ("name", "help", "arguments", "run", "trains")

    def __init__(self, name: str, help: str, arguments: str, run: str, trains: bool = False) -> None:
        self.name = name
        self.help = help
        self.arguments = arguments  # "module:function", function(argparse.ArgumentParser) -> None
        self.run = run  # "module:function", handler(args, cli.CommandContext) -> exit code
        self.trains = trains  # a stop signal finishes the step and checkpoints; the others stop at once

    def add_arguments(self, parser) -> None:
        _load(self.arguments)(parser)

    def handler(self):
        return _load(self.run)

    def __repr__(self) -> str:
        return f"Command({self.name!r})"


def _load(where: str):
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(module), name)


_CONTINUAL = "ecotrain.cli.continual_args"  # docs/updates.md
_UPDATES = "ecotrain.cli.continual"
COMMANDS: tuple[Command, ...] = (
    Command("fit", "train a recipe", "ecotrain.cli.fit_args:fit", "ecotrain.cli.fit:cmd_fit", trains=True),
    Command("plan", "print the memory a recipe needs (parameters, gradients, optimizer, activations)",
            "ecotrain.cli.memory_args:plan", "ecotrain.cli.models:cmd_plan"),
    Command("resume", "continue a run from its newest valid checkpoint", "ecotrain.cli.fit_args:resume",
            "ecotrain.cli.models:cmd_resume", trains=True),
    Command("ledger", "print a run's cost ledger; --regions restates its CO2e on other grids",
            "ecotrain.cli.accounting_args:ledger", "ecotrain.cli.records:cmd_ledger"),
    Command("compare", "baseline vs candidate runs (seed groups): means with 95%% intervals and a verdict (exit 0 "
            "PASS, 1 FAIL or INCONCLUSIVE; docs/evaluation.md)", "ecotrain.cli.accounting_args:compare",
            "ecotrain.cli.records:cmd_compare"),
    Command("eval", "evaluate a trained model (run or checkpoint folder) in eval mode; prints and writes its metrics "
            "(RUN/eval-<label>.json)", "ecotrain.cli.inference_args:evaluate", "ecotrain.cli.models:cmd_eval"),
    Command("predict", "write a trained model's predictions with class probabilities (CSV); a language model's "
            "continuations of prompts (--prompt, docs/lm.md)", "ecotrain.cli.inference_args:predict",
            "ecotrain.cli.models:cmd_predict"),
    Command("export", "trace a run's weights with torch.export (.pt2) or to ONNX, check it against the eager model "
            "on the test split (export.json) and write the model card (docs/export.md)",
            "ecotrain.cli.export_args:export", "ecotrain.cli.export:cmd_export"),
    Command("card", "write a Hugging Face model card (README.md): test metrics, how the model was chosen, the data, "
            "co2_eq_emissions from the ledger", "ecotrain.cli.export_args:card",
            "ecotrain.export.card:cmd_card"),  # reads finished runs: no torch
    Command("bn-report", "print a run's BatchNorm report (methods: [{name: batchnorm}])",
            "ecotrain.cli.report_args:bn_report", "ecotrain.cli.models:cmd_bn_report"),
    Command("report", "write report.html: learning curves, a fit diagnosis, cost, environment; several runs: "
            "comparison and verdict", "ecotrain.cli.report_args:report", "ecotrain.cli.records:cmd_report"),
    Command("tokenize", "a text corpus into token files (train/val .bin, tokenizer.json, tokens.json) for "
            "data.name=tokens:DIR", "ecotrain.cli.tokenize_args:tokenize", "ecotrain.cli.corpus:cmd_tokenize"),
    Command("lr-find", "LR range test: a plot and a suggested peak LR (writes no run folder)",
            "ecotrain.cli.lrfind_args:lr_find", "ecotrain.assembly.lrfind:cmd_lr_find"),
    Command("update", "train a new version from BASE on NEW_DATA, gate it, promote or reject it",
            f"{_CONTINUAL}:update", f"{_UPDATES}:cmd_update", trains=True),
    Command("versions", "list the registry's versions; `versions add RUN` registers a finished run; `versions show "
            "V` prints a version's metrics", f"{_CONTINUAL}:versions", f"{_UPDATES}:cmd_versions"),
    Command("promote", "make a version current (also one the gate rejected)", f"{_CONTINUAL}:promote",
            f"{_UPDATES}:cmd_promote"),
    Command("rollback", "make the previously current version current again", f"{_CONTINUAL}:rollback",
            f"{_UPDATES}:cmd_rollback"),
    Command("canary", "serve a held candidate beside current on recorded requests; promote, hold or reject it by "
            "its accuracy and latency intervals", f"{_CONTINUAL}:canary", f"{_UPDATES}:cmd_canary"),
    Command("review-queue", "the lowest-confidence and most-contradicted examples, for review",
            f"{_CONTINUAL}:review_queue", f"{_UPDATES}:cmd_review_queue"),
    Command("data", "make a built-in dataset on disk: `data speech-digits --out DIR`",  # docs/speech.md
            "ecotrain.cli.speech_args:data", "ecotrain.cli.speech:cmd_data"),
    Command("speech-feedback", "speech model: a base version and feedback rounds from new voices, gated "
            "(docs/speech.md)", "ecotrain.cli.speech_args:feedback", "ecotrain.cli.speech:cmd_feedback"),
    Command("green", "search the cheapest recipe whose validation accuracy stays within a tolerance of RECIPE's, "
            "then confirm it on fresh seeds (docs/green.md)", "ecotrain.cli.green_args:green",
            "ecotrain.cli.green:cmd_green", trains=True),
)


def by_name(commands=COMMANDS) -> dict[str, Command]:
    """name -> Command; a name registered twice is refused at import, named (argparse would refuse it
    only once the parser is built)."""
    named: dict[str, Command] = {}
    for c in commands:
        if c.name in named:
            raise ValueError(f"command {c.name!r} is registered twice (ecotrain/cli/commands.py)")
        named[c.name] = c
    return named


BY_NAME = by_name()
TRAINS = tuple(c.name for c in COMMANDS if c.trains)  # a stop signal finishes the step and checkpoints
