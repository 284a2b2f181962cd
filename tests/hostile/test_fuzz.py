"""A property-based fuzzer (hypothesis) against the CLI's error contract: whatever the overrides,
recipe text or run-folder files, a command prints no traceback, exits with a documented code, says a
refusal in one line, never reaches the boundary's "<command> failed" (an error no check foresaw), and
writes nothing where it was refused. Examples it finds are kept as regression cases in cases*.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ecotrain.cli import main
from ecotrain.config import Config

FUZZ = settings(max_examples=int(os.environ.get("ECOTRAIN_FUZZ_EXAMPLES", "60")), deadline=None, derandomize=not os.environ.get("ECOTRAIN_FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _keys(tree, prefix=""):
    for k, v in tree.items():
        yield prefix + k
        if isinstance(v, dict):
            yield from _keys(v, prefix + k + ".")


KEYS = sorted(_keys(Config().model_dump(by_alias=True)))
SCALARS = st.one_of(st.integers(min_value=-2**70, max_value=2**70), st.floats(allow_nan=True, allow_infinity=True),
                    st.booleans(), st.none(), st.text(max_size=12),
                    st.sampled_from(["[]", "{}", "[1, 2]", "{a: 1}", "&a [*a]", "!!python/object:os.system ls",
                                     "2001-02-30", "0x10", "1e999", "~", "'", "[{name: ema}]", "-1", "0"]))


def run(capsys, *args) -> tuple[int, str]:
    try:
        code = main([str(a) for a in args])
    except SystemExit as exc:  # argparse's own refusal (usage line + one error line), exit 2
        code = exc.code
    return code, capsys.readouterr().err


def contract(code: int, err: str, allowed=(0, 2)) -> None:
    assert "Traceback" not in err, err
    assert code in allowed, (code, err)
    assert " failed: " not in err, err  # the boundary caught what no check did: a case to mend at its root
    if code:
        lines = [ln for ln in err.strip().splitlines() if "error:" in ln]
        assert len(lines) == 1, err


@FUZZ
@given(pairs=st.lists(st.tuples(st.one_of(st.sampled_from(KEYS), st.text(min_size=1, max_size=10)), SCALARS),
                      min_size=1, max_size=3))
def test_overrides(pairs, capsys, tmp_path_factory):
    items = []
    for k, v in pairs:
        text = v if isinstance(v, str) else json.dumps(v) if not isinstance(v, float) else repr(v)
        items.append(f"{k}={text}")
    code, err = run(capsys, "fit", "recipes/mnist1d_cnn.yaml", *items, "--print-config")
    contract(code, err)


@FUZZ
@given(text=st.one_of(st.text(max_size=200), st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
                      st.lists(st.tuples(st.sampled_from(KEYS), SCALARS), max_size=4).map(
                          lambda kv: "\n".join(f"{k.split('.')[-1]}: {v}" for k, v in kv))))
def test_recipe_text(text, capsys, tmp_path_factory):
    d = tmp_path_factory.mktemp("recipe")
    (d / "r.yaml").write_text(text, encoding="latin-1", errors="replace")
    code, err = run(capsys, "fit", d / "r.yaml", "--print-config")
    contract(code, err)


RUN_FILES = ["summary.json", "ledger.json", "config.yaml", "metrics.jsonl"]
JSONISH = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=5)),
                       lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=6), c, max_size=3)),
                       max_leaves=8)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    from ecotrain import fit

    d = tmp_path_factory.mktemp("finished") / "run"
    cfg = Config.model_validate({"name": "f", "data": {"name": "digits", "batch_size": 32},
                                 "model": {"name": "mlp", "kwargs": {"hidden": [8]}},
                                 "loop": {"max_steps": 4, "max_epochs": None, "log_every": 2},
                                 "logging": {"progress": "off"}, "ledger": {"energy": "off"}})
    fit(cfg, run_dir=d, quiet=True)
    return d


@FUZZ
@given(name=st.sampled_from(RUN_FILES), how=st.sampled_from(["value", "bytes", "truncate"]), key=st.text(max_size=12),
       value=JSONISH, cut=st.integers(min_value=0, max_value=400),
       command=st.sampled_from(["compare", "report", "ledger"]))
def test_damaged_run_files(finished, name, how, key, value, cut, command, capsys, tmp_path_factory):
    import shutil

    d = tmp_path_factory.mktemp("damaged") / "run"
    shutil.copytree(finished, d)
    p = d / name
    raw = p.read_bytes()
    if how == "value" and name.endswith(".json"):
        tree = json.loads(raw)
        keys = [k for k in tree] or [key]
        tree[keys[cut % len(keys)] if key == "" else key] = value
        p.write_text(json.dumps(tree))
    elif how == "bytes":
        p.write_bytes(raw[:cut] + bytes([cut % 256]) + raw[cut + 1:])
    else:
        p.write_bytes(raw[:cut])
    before = {q.name: q.read_bytes() for q in d.iterdir() if q.is_file()}
    names = sorted(q.name for q in d.iterdir())
    args = {"compare": ["compare", d, d], "report": ["report", d, "--out", d.parent / "r.html"],
            "ledger": ["ledger", d]}[command]
    code, err = run(capsys, *args)
    contract(code, err, allowed=(0, 1, 2) if command == "compare" else (0, 2))
    after = {q.name: q.read_bytes() for q in d.iterdir() if q.is_file() and q.name in before}
    assert after == before  # reading never changes a run's files
    assert sorted(q.name for q in d.iterdir()) == names  # nor adds one (an error.log goes to the cache folder)
    assert not [q for q in Path(d.parent).glob(".*tmp*")]  # no debris
