"""`fit --seeds`: sibling run folders, one group file, compare over groups; the seed parser and group reader."""

import json

import pytest

from ecotrain.accounting.compare import split_runs
from ecotrain.cli import main
from ecotrain.base.errors import ConfigError
from ecotrain.base.groupfile import read_group
from ecotrain.seeds.sweep import parse_seeds

TINY = """name: tiny
data: {name: digits, batch_size: 32, val_split: 0.15}
model: {name: mlp, kwargs: {hidden: [16]}}
optim: {lr: 0.003}
loop: {max_steps: 12, max_epochs: null, log_every: 6, eval_every: 6}
logging: {progress: "off"}
ledger: {energy: "off"}
"""


def test_parse_seeds():
    assert parse_seeds("0,1,2") == [0, 1, 2]
    assert parse_seeds("3-5,9") == [3, 4, 5, 9]
    assert parse_seeds(str(2**32 - 1)) == [2**32 - 1]
    for bad in ("", "a", "1,,2", "-1", "5-3", "1,1", f"0,{2**64}", f"{2**32}", "²"):
        with pytest.raises(ConfigError, match="--seeds"):
            parse_seeds(bad)


def test_read_group_refuses_what_is_not_a_group(tmp_path):
    bad = tmp_path / "x-group.json"
    for text, msg in (("{", "not a readable group file"), ('{"runs": ["a"]}', "not an ecotrain group file"),
                      ('{"kind": "ecotrain.seed_group", "runs": []}', "lists no run folders")):
        bad.write_text(text)
        with pytest.raises(ConfigError, match=msg):
            read_group(bad)


def test_fit_seeds_writes_siblings_and_a_group_that_compare_reads(tmp_path, capsys):
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(TINY)
    prefix = tmp_path / "runs" / "g"
    assert main(["fit", str(recipe), "--seeds", "0,1", "--run-dir", str(prefix), "--quiet"]) == 0
    group = tmp_path / "runs" / "g-group.json"
    data = json.loads(group.read_text())
    assert data["runs"] == ["g-s0", "g-s1"] and data["finished"] == ["g-s0", "g-s1"] and data["seeds"] == [0, 1]
    sums = [json.loads((tmp_path / "runs" / f"g-s{s}" / "summary.json").read_text()) for s in (0, 1)]
    assert all(s["steps"] == 12 for s in sums)
    assert "seed: 1" in (tmp_path / "runs" / "g-s1" / "config.yaml").read_text()
    assert sums[0]["train_loss"] != sums[1]["train_loss"]  # different seeds, different runs
    # a group file stands for its runs; a comma list may mix files and folders
    assert split_runs([str(group)]) == [str(tmp_path / "runs" / "g-s0"), str(tmp_path / "runs" / "g-s1")]
    assert len(split_runs([f"{group},{tmp_path / 'runs' / 'g-s0'}"])) == 3
    capsys.readouterr()
    assert main(["compare", str(group), str(group), "--by", "flops", "--min-cost-cut", "0"]) == 0
    out = capsys.readouterr().out
    assert "mean of 2 [95% CI]" in out and "paired by seed" in out and "verdict: PASS" in out and "1.000" in out

    # again into the same folders: refused before anything trains; --resume auto keeps the finished runs
    assert main(["fit", str(recipe), "--seeds", "0,1", "--run-dir", str(prefix), "--quiet"]) != 0
    assert "already holds a run" in capsys.readouterr().err
    mtime = (tmp_path / "runs" / "g-s0" / "summary.json").stat().st_mtime_ns
    assert main(["fit", str(recipe), "--seeds", "0,1", "--run-dir", str(prefix), "--quiet", "--resume", "auto"]) == 0
    assert (tmp_path / "runs" / "g-s0" / "summary.json").stat().st_mtime_ns == mtime
    # ... but only while they are the runs asked for: a changed recipe is one line, not a stale result
    assert main(["fit", str(recipe), "optim.lr=0.001", "--seeds", "0,1", "--run-dir", str(prefix), "--quiet",
                 "--resume", "auto"]) != 0
    assert "finished with another config (optim.lr" in capsys.readouterr().err
    assert main(["fit", str(recipe), "--seeds", "0", "seed=3", "--run-dir", str(prefix), "--overwrite"]) != 0
    assert "drop the seed=" in capsys.readouterr().err
