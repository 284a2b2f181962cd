"""`ecotrain speech-feedback RECIPE [overrides] --out DIR`: a speech model's base version and feedback rounds
from new voices, gated (assembly/speech_rounds.py; docs/speech.md)."""

from __future__ import annotations

NAME = "speech-feedback"
HELP = "speech model: a base version and feedback rounds from new voices, gated (docs/speech.md)"
TRAINS = False


def arguments(f) -> None:
    f.add_argument("recipe", help="e.g. recipes/speech_feedback.yaml")
    f.add_argument("overrides", nargs="*", help="dotted overrides, e.g. data.kwargs.feedback.rounds=[accent_de]")
    f.add_argument("--out", required=True, help="work folder: runs, registries, review queues, results.json")
    f.add_argument("--progress", action="store_true", help="show each run's progress")


def data_folder(cfg, settings=None):
    """The recipe's dataset, made (or found in its cache folder) from data.kwargs; `settings`' cohorts
    are checked against the spec first, so a misspelt round costs no generation."""
    from pathlib import Path

    from ecotrain.base.errors import ConfigError
    from ecotrain.speech.dataset import default_spec, generate, load

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


def run(args, ctx) -> int:
    from pathlib import Path

    from ecotrain.assembly.speech_feedback import FeedbackSettings
    from ecotrain.assembly.speech_rounds import run as run_rounds, summary_figures, table
    from ecotrain.base.errors import ConfigError
    from ecotrain.base.rundir import file_in_the_way
    from ecotrain.config import load_config

    cfg = load_config(Path(args.recipe), args.overrides)
    settings = FeedbackSettings.parse(cfg.data.kwargs.get("feedback"))
    out = Path(args.out)
    if (out.exists() and not out.is_dir()) or file_in_the_way(out):  # refused before any data or training
        raise ConfigError(f"--out {out}: is a file or inside one; give a work folder (runs, registries, results.json)")
    results = run_rounds(cfg, data_folder(cfg, settings), settings, out, quiet=not args.progress)
    print(table(results))
    for strategy in ("protected", "adapters"):
        fig = summary_figures(results, strategy)
        if fig:
            print(f"{strategy}: original voices' WER {fig['old_wer_rise'] * 100:+.1f} points, new voices' WER cut by "
                  f"{fig['new_wer_cut']:.0%}, wrong transcripts caught {fig['bad_caught']}/{fig['bad_total']} "
                  f"({fig['bad_by_checks']} by the label checks)")
    print(f"results: {out / 'results.json'}")
    return 0
