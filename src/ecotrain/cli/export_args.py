"""The arguments of the commands that ship a run: `export` (cli_export.py; docs/export.md) and `card`
(card.py). Argparse only, no torch: imported to parse its command, before torch (ecotrain/cli/commands.py
lists the commands)."""

from __future__ import annotations


def export(ex) -> None:
    ex.add_argument("run", metavar="RUN", help="a run folder, or a seed group's RUN-group.json (the seed with the best "
                    "validation figure ships)")
    ex.add_argument("--format", choices=["pt2", "onnx"], default="pt2", help="pt2: torch.export.save (default); "
                    "onnx: torch.onnx.export(dynamo=True), needs the onnx extra")
    ex.add_argument("--out", help="the exported file (default RUN/model.pt2 or RUN/model.onnx); export.json and "
                    "README.md go beside it")
    ex.add_argument("--tolerance", type=float, default=1e-4, help="largest output difference vs eager, relative to "
                    "the largest eager output (at least 1); above it: exit 1, nothing written (default 1e-4)")
    ex.add_argument("--domain", help="a model trained with batchnorm policy domain: that domain's statistics in the "
                    "program (one export per domain; default the run's own)")
    ex.add_argument("--no-card", action="store_true", help="do not write README.md beside the export")


def card(cd) -> None:
    cd.add_argument("run", metavar="RUN", help="a run folder, or a seed group's RUN-group.json")
    cd.add_argument("--out", help="the card (default RUN/README.md; a README.md not written by ecotrain is refused)")
