"""`ecotrain data speech-digits --out DIR`: make a built-in dataset on disk (speech/dataset.py; docs/speech.md)."""

from __future__ import annotations

NAME = "data"
HELP = "make a built-in dataset on disk: `data speech-digits --out DIR`"
TRAINS = False


def arguments(d) -> None:
    d.add_argument("dataset", choices=["speech-digits"], help="speech-digits: spoken digit sequences (espeak-ng)")
    d.add_argument("--out", required=True, help="folder for manifest.json and features.safetensors")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--scale", type=float, default=1.0, help="utterances per speaker x this (default 1: 552 in all)")


def run(args, ctx) -> int:
    import time
    from pathlib import Path

    from ecotrain.base.errors import ConfigError

    if not args.scale > 0:
        raise ConfigError(f"--scale: must be above 0 (got {args.scale})")
    from ecotrain.speech.dataset import default_spec, generate, load

    t = time.perf_counter()
    out = generate(Path(args.out), default_spec(args.seed, args.scale))
    n = len(load(out).rows)
    print(f"{out}: {n} utterances ({time.perf_counter() - t:.1f} s)")
    return 0
