"""CLI: `ecotrain data speech-digits --out DIR` (make the dataset) and
`ecotrain speech-feedback RECIPE [overrides] --out DIR` (base + feedback rounds; docs/speech.md):
their arguments, argparse only, no torch: imported to parse its command, before torch
(ecotrain/cli/commands.py lists the commands). The bodies are in cli/speech.py, imported when one of
the commands runs."""

from __future__ import annotations


def data(d) -> None:
    d.add_argument("dataset", choices=["speech-digits"], help="speech-digits: spoken digit sequences (espeak-ng)")
    d.add_argument("--out", required=True, help="folder for manifest.json and features.safetensors")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--scale", type=float, default=1.0, help="utterances per speaker x this (default 1: 552 in all)")


def feedback(f) -> None:
    f.add_argument("recipe", help="e.g. recipes/speech_feedback.yaml")
    f.add_argument("overrides", nargs="*", help="dotted overrides, e.g. data.kwargs.feedback.rounds=[accent_de]")
    f.add_argument("--out", required=True, help="work folder: runs, registries, review queues, results.json")
    f.add_argument("--progress", action="store_true", help="show each run's progress")
