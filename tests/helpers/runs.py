"""Reading run folders in tests."""

import json

# Keys of metrics.jsonl that a resumed run must reproduce exactly; the rest (energy, CO2e, money,
# times) are measurements of the machine, which no resume can make identical. The methods' loss terms
# (`loss_<name>`) and the validation figures (`val_*`) must match too.
DETERMINISTIC = ("step", "epoch", "loss", "lr", "flops")


def deterministic_lines(run) -> list[dict]:
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        out.append({k: v for k, v in rec.items() if k in DETERMINISTIC or k.startswith(("val_", "loss_"))})
    return out


def write_recipe(folder, tree):
    """`tree` as the next numbered recipe-N.yaml in `folder` (tests write several per folder)."""
    import yaml

    p = folder / f"recipe-{len(list(folder.glob('recipe-*')))}.yaml"
    p.write_text(yaml.safe_dump(tree))
    return p


def fit_quietly(recipe, run_dir, *extra):
    """A real `ecotrain fit RECIPE --run-dir RUN --quiet` that must succeed; returns the run folder."""
    from conftest import run_cli

    r = run_cli("fit", recipe, "--run-dir", run_dir, "--quiet", *extra)
    assert r.returncode == 0, r.stderr
    return run_dir
