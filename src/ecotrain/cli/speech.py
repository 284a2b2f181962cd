"""The bodies of `ecotrain data speech-digits --out DIR` (make the dataset) and
`ecotrain speech-feedback RECIPE [overrides] --out DIR` (base + feedback rounds; docs/speech.md).
cli/speech_args.py parses their arguments; cli/program.py imports this module when one of them runs."""

from __future__ import annotations

import time
from pathlib import Path

from ecotrain.config import load_config
from ecotrain.base.errors import ConfigError
from ecotrain.base.rundir import file_in_the_way
from ecotrain.speech.dataset import default_spec, generate, load
from ecotrain.assembly.speech_feedback import FeedbackSettings
from ecotrain.assembly.speech_rounds import run, summary_figures, table


def cmd_data(args, ctx) -> int:
    if not args.scale > 0:
        raise ConfigError(f"--scale: must be above 0 (got {args.scale})")
    t = time.perf_counter()
    out = generate(Path(args.out), default_spec(args.seed, args.scale))
    n = len(load(out).rows)
    print(f"{out}: {n} utterances ({time.perf_counter() - t:.1f} s)")
    return 0


def data_folder(cfg, settings=None):
    """The recipe's dataset, made (or found in its cache folder) from data.kwargs; `settings`' cohorts
    are checked against the spec first, so a misspelt round costs no generation."""
    kw = cfg.data.kwargs
    folder = kw.get("folder")
    if not folder:
        raise ConfigError("data.kwargs.folder: required (where the speech dataset is made or cached)")
    scale = kw.get("scale", 1.0)
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or scale <= 0:
        raise ConfigError(f"data.kwargs.scale: must be a number above 0 (got {scale!r})")
    spec = default_spec(cfg.seed, float(scale))
    for c in [settings.base_cohort, *settings.rounds] if settings is not None else []:
        if c not in spec.cohorts:
            raise ConfigError(f"data.kwargs.feedback: cohort '{c}' is not in the data (cohorts: "
                              f"{', '.join(sorted(spec.cohorts))})")
    return load(generate(Path(folder), spec))


def cmd_feedback(args, ctx) -> int:
    cfg = load_config(Path(args.recipe), args.overrides)
    settings = FeedbackSettings.parse(cfg.data.kwargs.get("feedback"))
    out = Path(args.out)
    if (out.exists() and not out.is_dir()) or file_in_the_way(out):  # refused before any data or training
        raise ConfigError(f"--out {out}: is a file or inside one; give a work folder (runs, registries, results.json)")
    results = run(cfg, data_folder(cfg, settings), settings, out, quiet=not args.progress)
    print(table(results))
    for strategy in ("protected", "adapters"):
        fig = summary_figures(results, strategy)
        if fig:
            print(f"{strategy}: original voices' WER {fig['old_wer_rise'] * 100:+.1f} points, new voices' WER cut by "
                  f"{fig['new_wer_cut']:.0%}, wrong transcripts caught {fig['bad_caught']}/{fig['bad_total']} "
                  f"({fig['bad_by_checks']} by the label checks)")
    print(f"results: {out / 'results.json'}")
    return 0
