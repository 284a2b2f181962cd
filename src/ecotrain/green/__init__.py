"""`ecotrain green`: the cheapest recipe within a tolerance of a baseline, found automatically and
confirmed honestly (docs/green.md).

space.py: the levers that apply to a recipe and how a trial's values become overrides; search.py:
the Optuna study (SQLite in the output folder, resumable) chosen on validation only; confirm.py:
the fresh-seed confirmation through `ecotrain compare`'s verdict, and the payback arithmetic;
output.py: green.yaml, the trials table, green.html; commands.py: the CLI command.
"""
