"""A model card publishes figures: never NaN, an infinity or a sum that overflows to one (a perplexity,
the grams of CO2e, the parity of an export), and never a tied tensor the weights file does not hold.
Each run folder here is written by hand, as a damaged or hand-edited one would be."""

from __future__ import annotations

import json
import math
import struct

import pytest
import yaml

from ecotrain.cli import main
from ecotrain.export.card import NOT_FINITE_LEDGER, NOT_FINITE_SUMMARY, card_text, weights_summary
from ecotrain.export.shipped import locate


def _weights(path, tensors: dict, aliases: dict | None = None) -> None:
    header, offset = {}, 0
    for name, shape in tensors.items():
        size = 4 * math.prod(shape)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    if aliases is not None:
        header["__metadata__"] = {"ecotrain.aliases": json.dumps(aliases)}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\x00" * offset)


def make_run(folder, *, summary: dict | None = None, kg=0.002, task="classification", aliases=None,
             extra_ledger: dict | None = None):
    folder.mkdir()
    lm = task == "language_model"
    config = {"task": {"name": task}, "seed": 0,
              "data": {"name": "tokens" if lm else "digits", "val_split": 0.1, "test_split": 0.1},
              "model": {"name": "causal_lm" if lm else "mlp"}, "ledger": {"enabled": True}}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    base = {"name": folder.name, "monitor": "val_loss", "best_val_metric": 0.5, "best_step": 10, "steps": 10,
            "dataset_hash": "abc123"}
    base.update({"test_perplexity": 12.5, "test_bits_per_byte": 1.2, "tokens_seen": 1000} if lm
                else {"test_accuracy": 0.9, "test_loss": 0.3})
    base.update(summary or {})
    (folder / "summary.json").write_text(json.dumps(base))  # json writes NaN and Infinity as Python reads them
    ledger = {"energy": {"kwh": 0.01, "method": "estimated"}, "co2e": {"kg": kg, "g_per_kwh": 200.0, "grid": "world"},
              "cost": {"amount": None}, "wall_seconds": 3.0, "flops": {"total": 1e9}}
    ledger.update(extra_ledger or {})
    (folder / "ledger.json").write_text(json.dumps(ledger))
    tensors = {"wte.weight": [8, 4], "wpe.weight": [16, 4]} if lm else {"net.0.weight": [4, 4]}
    _weights(folder / "model.safetensors", tensors, aliases)
    return folder


def _no_bad_figures(text: str) -> None:
    low = text.lower()
    for word in ("nan", "inf", "1e+308", "1e308"):
        assert not any(tok.strip("|`(),;:.") in (word, "." + word, "-" + word) for tok in low.split()), (word, text)


def test_a_well_formed_run_publishes_its_figures(tmp_path):
    """The control: the same hand-made folder, figures finite, publishes every one."""
    text = card_text(locate(make_run(tmp_path / "lm", task="language_model")))
    assert "perplexity: 12.5" in text and "CO2e: 2 g" in text and "not measured" not in text
    text = card_text(locate(make_run(tmp_path / "clf")))
    assert "| accuracy | 0.9000 |" in text


def test_a_nan_or_infinite_perplexity_is_not_measured(tmp_path):
    run = make_run(tmp_path / "lm", task="language_model",
                   summary={"test_perplexity": float("nan"), "test_bits_per_byte": float("inf"),
                            "best_val_metric": float("nan")})
    text = card_text(locate(run))
    _no_bad_figures(text)
    assert f"test perplexity: {NOT_FINITE_SUMMARY}; bits per byte: {NOT_FINITE_SUMMARY}" in text
    assert f"| perplexity | {NOT_FINITE_SUMMARY} |" in text
    assert f"| bits_per_byte | {NOT_FINITE_SUMMARY} |" in text
    meta = yaml.safe_load(text.split("---")[1])
    assert meta["ecotrain"]["language_model"]["perplexity"] is None
    assert "perplexity" not in meta["ecotrain"]["test_metrics"]
    assert all(r["type"] not in ("perplexity", "bits_per_byte")
               for r in meta["model-index"][0]["results"][0]["metrics"])


@pytest.mark.parametrize("kg", [1e308, 1.7e308], ids=["1e308", "near-max"])
def test_co2e_that_overflows_to_infinity_is_not_measured(tmp_path, kg, capsys):
    run = make_run(tmp_path / "r", kg=kg)
    text = card_text(locate(run))
    _no_bad_figures(text)
    assert f"CO2e: {NOT_FINITE_LEDGER}." in text
    assert "co2_eq_emissions" not in yaml.safe_load(text.split("---")[1])
    assert main(["card", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"CO2e {NOT_FINITE_LEDGER}" in out and "inf" not in out.replace("info", "")


def test_a_seed_group_whose_grams_sum_past_float_is_not_measured(tmp_path):
    """Each seed's kg is finite; their sum in grams is not."""
    from ecotrain.export.card import emissions
    from ecotrain.export.shipped import Shipped, read_run

    runs = [read_run(make_run(tmp_path / f"s{i}", kg=1e307)) for i in range(2)]
    assert emissions(Shipped(runs[0], runs, tmp_path / "g.json")) == (None, NOT_FINITE_LEDGER)


@pytest.mark.parametrize("value", ["Infinity", "NaN"])
def test_an_infinite_ledger_figure_is_refused_in_one_line(tmp_path, value, capsys):
    run = make_run(tmp_path / "r")
    path = run / "ledger.json"
    path.write_text(path.read_text().replace('"kg": 0.002', f'"kg": {value}'))
    assert main(["card", str(run)]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "ledger.json" in err and "co2e.kg" in err and "Traceback" not in err
    assert not (run / "README.md").exists()


def test_a_non_finite_export_parity_and_run_figure_are_not_published(tmp_path):
    run = make_run(tmp_path / "r")
    (run / "export.json").write_text(json.dumps({"files": {"model.pt2": {"format": "pt2", "max_abs_diff": float("nan")},
                                                           "model.onnx": {"format": "onnx"}}}))
    from ecotrain.export.card import read_exports
    shipped = locate(run)
    shipped.run.ledger["flops"]["total"] = float("inf")  # as a ledger read without the check would hold it
    shipped.run.ledger["co2e"]["g_per_kwh"] = float("nan")
    text = card_text(shipped, read_exports(run))
    _no_bad_figures(text)
    assert "| `model.pt2` | pt2 | not measured |" in text and "| `model.onnx` | onnx | not measured |" in text
    assert f"FLOPs {NOT_FINITE_LEDGER}" in text and f"grid intensity: {NOT_FINITE_LEDGER}" in text


def test_a_tie_to_a_tensor_the_file_does_not_hold_is_never_named(tmp_path):
    aliases = {"lm_head.weight": "wte.weight",  # a real tie
               "ghost.weight": "not_in_the_file.weight",  # names a tensor the file does not hold
               "wpe.weight": "wte.weight",  # stored itself: no tie
               "odd": 3}
    run = make_run(tmp_path / "lm", task="language_model", aliases=aliases)
    params, tied, rows = weights_summary(run / "model.safetensors")
    assert tied == {"lm_head.weight": "wte.weight"} and params == 8 * 4 + 16 * 4 and rows == 16
    text = card_text(locate(run))
    assert "`lm_head.weight` is `wte.weight`" in text
    assert "ghost" not in text and "not_in_the_file" not in text and "`wpe.weight` is" not in text
    meta = yaml.safe_load(text.split("---")[1])
    assert meta["ecotrain"]["language_model"]["tied"] == {"lm_head.weight": "wte.weight"}


def test_aliases_that_are_not_a_mapping_name_no_tie(tmp_path):
    run = make_run(tmp_path / "lm", task="language_model", aliases=["wte.weight"])
    assert weights_summary(run / "model.safetensors")[1] == {}
    assert "(tied:" not in card_text(locate(run))
