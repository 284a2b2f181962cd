"""CLI: `ecotrain data speech-digits --out DIR` (make the dataset) and
`ecotrain speech-feedback RECIPE [overrides] --out DIR` (base + feedback rounds; docs/speech.md).
Heavy imports stay inside the handlers."""

from __future__ import annotations


def add_commands(sub) -> dict:
    d = sub.add_parser("data", help="make a built-in dataset on disk: `data speech-digits --out DIR`")
    d.add_argument("dataset", choices=["speech-digits"], help="speech-digits: spoken digit sequences (espeak-ng)")
    d.add_argument("--out", required=True, help="folder for manifest.json and features.safetensors")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--scale", type=float, default=1.0, help="utterances per speaker x this (default 1: 552 in all)")
    f = sub.add_parser("speech-feedback", help="speech model: a base version and feedback rounds from new voices, "
                       "gated (docs/speech.md)")
    f.add_argument("recipe", help="e.g. recipes/speech_feedback.yaml")
    f.add_argument("overrides", nargs="*", help="dotted overrides, e.g. data.kwargs.feedback.rounds=[accent_de]")
    f.add_argument("--out", required=True, help="work folder: runs, registries, review queues, results.json")
    f.add_argument("--progress", action="store_true", help="show each run's progress")
    return {"data": cmd_data, "speech-feedback": cmd_feedback}


def cmd_data(args) -> int:
    import time
    from pathlib import Path

    from ecotrain.errors import ConfigError
    from ecotrain.speech.dataset import default_spec, generate, load

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
    from pathlib import Path

    from ecotrain.errors import ConfigError
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


def cmd_feedback(args) -> int:
    from pathlib import Path

    from ecotrain.config import load_config
    from ecotrain.errors import ConfigError
    from ecotrain.speech.feedback import FeedbackSettings
    from ecotrain.speech.rounds import run, summary_figures, table

    cfg = load_config(Path(args.recipe), args.overrides)
    settings = FeedbackSettings.parse(cfg.data.kwargs.get("feedback"))
    out = Path(args.out)
    from ecotrain.rundir import file_in_the_way

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
