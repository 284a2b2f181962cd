"""jsonfile.read_json: the one reader of the JSON files ecotrain wrote; a damaged file is one line naming
the file and the field (issue 44)."""

import json
import os

import pytest

from ecotrain.base.errors import CheckpointError, ConfigError
from ecotrain.base.jsonfile import check_fields, read_json
from tests.helpers.deadline import deadline

FIELDS = {"steps": int, "energy": dict, "energy.kwh": (float, None), "history": list, "history.*": dict,
          "history.*.current": (str, None), "inputs?": dict, "inputs.columns.*?": str}


def _write(tmp_path, obj) -> str:
    p = tmp_path / "summary.json"
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return p


def test_a_good_file_comes_back_whole(tmp_path):
    good = {"steps": 4, "energy": {"kwh": 1}, "history": [{"current": "v0001"}, {"current": None}], "x": "kept"}
    assert read_json(_write(tmp_path, good), "run summary", FIELDS) == good
    good["inputs"] = {"columns": ["a", "b"]}  # an optional path, checked when there
    assert read_json(_write(tmp_path, good), "run summary", FIELDS)["inputs"] == {"columns": ["a", "b"]}


@pytest.mark.parametrize("obj, said", [
    ("{oops", "not readable JSON (Expecting property name"),
    ("[1, 2]", "not a JSON object, so not an ecotrain run summary"),
    ({"energy": {}, "history": []}, "the run summary has no 'steps' field"),
    ({"steps": "4", "energy": {}, "history": []}, "the run summary's 'steps' is \"4\", not a whole number"),
    ({"steps": True, "energy": {}, "history": []}, "'steps' is true, not a whole number"),  # a bool is no number
    ({"steps": 4, "energy": {"kwh": "1"}, "history": []}, "'energy.kwh' is \"1\", not a number or null"),
    ({"steps": 4, "energy": [], "history": []}, "'energy' is [], not an object"),
    ({"steps": 4, "energy": {"kwh": None}, "history": [{"current": "v1"}, {"current": 3}]},
     "'history.1.current' is 3, not text or null"),
    ({"steps": 4, "energy": {"kwh": None}, "history": [{}]}, "has no 'history.0.current' field"),
    ({"steps": 4, "energy": {"kwh": 2.5}, "history": [], "inputs": {"columns": ["a", 1]}},
     "'inputs.columns.1' is 1, not text"),
])
def test_a_damaged_file_is_one_line_naming_the_file_and_the_field(tmp_path, obj, said):
    path = _write(tmp_path, obj)
    with pytest.raises(ConfigError) as err:
        read_json(path, "run summary", FIELDS)
    line = str(err.value)
    assert line.startswith(f"{path}: ") and said in line and "\n" not in line
    assert line.endswith("; restore it, or run the training again")


def test_the_error_class_and_the_advice_are_the_callers(tmp_path):
    path = _write(tmp_path, {"versions": 3})
    with pytest.raises(CheckpointError, match=r"'versions' is 3, not an object; restore the index"):
        read_json(path, "registry index", {"versions": dict}, "restore the index", CheckpointError)
    with pytest.raises(ConfigError, match=r"x.json: the ledger has no 'cost' field; fix"):
        check_fields({}, {"cost": dict}, "x.json", "ledger", "fix")


def test_the_run_files_reader_refuses_a_fifo_and_a_huge_file(tmp_path, monkeypatch):
    fifo = tmp_path / "summary.json"
    os.mkfifo(fifo)
    with deadline(20), pytest.raises(ConfigError) as err:
        read_json(fifo, "run summary")
    assert str(err.value) == (f"{fifo}: the run summary is a FIFO (named pipe), not a regular file; "
                              "restore it, or run the training again")
    big = tmp_path / "ledger.json"
    big.write_text(json.dumps({"pad": "x" * 200}))
    monkeypatch.setattr("ecotrain.base.jsonfile.LIMIT", 100)
    with pytest.raises(ConfigError, match="the ledger is 2.. bytes, more than the 100 bytes one may be"):
        read_json(big, "ledger")
