"""A CSV of very many columns is read and matched in linear time (a set, not `c in header[:i]`), and a
refusal names a few columns and how many more, in one short line."""

import sys
from pathlib import Path

import pytest

from ecotrain.base.errors import DataError
from ecotrain.data.builtin import read_csv
from ecotrain.export.contract import match_columns

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.deadline import deadline  # noqa: E402

N = 300_000  # quadratic checks take minutes here; linear ones a fraction of a second


def _wide(path: Path, names) -> Path:
    path.write_text(",".join(names) + "\n" + ",".join("0" for _ in names) + "\n")
    return path


def test_many_columns_are_read_and_matched_quickly(tmp_path):
    path = _wide(tmp_path / "wide.csv", [f"c{i}" for i in range(N)])
    with deadline(20, "reading and matching a wide CSV"):
        header, body = read_csv(path)
        assert len(header) == N and len(body) == 1
        assert match_columns(header, [f"c{i}" for i in range(N)], None, False, "predict", "RUN", say=False)[-1] == f"c{N - 1}"
        with pytest.raises(DataError) as e:
            match_columns(header, ["a", "b"], None, False, "predict --data", "RUN")
    line = str(e.value)
    assert "\n" not in line and len(line) < 400 and f"{N - 8:,} more" in line


def test_a_repeated_column_is_named_once_found(tmp_path):
    names = [f"c{i}" for i in range(N)] + ["c7"]
    with deadline(20, "reading a wide CSV"), pytest.raises(DataError, match="column 'c7' is named 2 times"):
        read_csv(_wide(tmp_path / "twice.csv", names))
