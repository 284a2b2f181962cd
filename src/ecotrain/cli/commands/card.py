"""`ecotrain card RUN`: a Hugging Face model card (README.md) for a finished run or seed group
(export/card.py). Reads finished runs: no torch."""

from __future__ import annotations

NAME = "card"
HELP = ("write a Hugging Face model card (README.md): test metrics, how the model was chosen, the data, "
        "co2_eq_emissions from the ledger")
TRAINS = False


def arguments(cd) -> None:
    cd.add_argument("run", metavar="RUN", help="a run folder, or a seed group's RUN-group.json")
    cd.add_argument("--out", help="the card (default RUN/README.md; a README.md not written by ecotrain is refused)")


def run(args, ctx) -> int:
    from pathlib import Path

    from ecotrain.export.card import emissions, repeated_note, write_card
    from ecotrain.export.shipped import locate

    shipped = locate(args.run)
    path = write_card(shipped, Path(args.out) if args.out else shipped.run.path / "README.md")
    ctx.committed()
    co2, note = emissions(shipped)
    said = f"{co2['emissions']:.4g} gCO2e ({note})" if co2 else f"CO2e {note}"
    print(f"model card: {path} ({said})" + (f"; {repeated_note(shipped)}" if shipped.repeated else ""))
    return 0
