"""QAT with torchao: prepare swaps only the Linear layers (names kept), convert makes a smaller model
whose outputs stay close, a forced Conv1d is refused, and a QAT run resumes exactly."""

import json

import pytest
import torch
from safetensors.torch import load_file

from ecotrain import fit
from ecotrain.base.errors import ConfigError
from ecotrain.methods.qat import QAT, plain_tensors, stored_bytes
from ecotrain.models import MLP, ConvBase
from tests.unit.test_methods import SigtermAt

pytest.importorskip("torchao")


def _qat(tiny_cfg, **kw):
    cfg = tiny_cfg(methods=[{"name": "qat", **kw}])
    return QAT(cfg.methods[0], cfg)


def test_prepare_then_convert_a_tiny_mlp(tiny_cfg):
    torch.manual_seed(0)
    model = MLP(32, 4, hidden=(64,))
    x = torch.randn(16, 32)
    ref = model(x).detach()
    keys = list(model.state_dict())
    q = _qat(tiny_cfg, weight_dtype="int8")
    q.transform(model)
    assert list(model.state_dict()) == keys  # a checkpoint of the float model loads into the prepared one
    assert all("FakeQuantized" in type(model.net[i]).__name__ for i in (0, 3))
    assert torch.allclose(model(x), ref, atol=0.05)  # fake-quantized: close to the float model
    q.on_fit_start(None)
    q.finalize(model, type("D", (), {"test": None, "val": None})())
    s = q.summary()
    assert s["quantized_layers"] == ["net.0", "net.3"] and s["quantized_parameter_fraction"] > 0.95
    assert s["converted_bytes"] < 0.4 * s["float_bytes"]  # int8 weights: about a quarter
    out = q.converted(x)
    assert torch.allclose(out, ref, atol=0.05)
    flat = plain_tensors(q.converted.state_dict())
    assert flat["net.0.weight.qdata"].dtype == torch.int8 and stored_bytes(flat) == s["converted_bytes"]


def test_conv_layers_are_skipped_and_refused_when_forced(tiny_cfg):
    q = _qat(tiny_cfg)
    q.transform(ConvBase(40, 10, channels=8))
    assert q.facts["quantized_layers"] == ["linear"]
    assert q.facts["skipped_layers"] == {"conv1": "Conv1d", "conv2": "Conv1d", "conv3": "Conv1d"}
    with pytest.raises(ConfigError, match="nn.Linear only"):
        _qat(tiny_cfg, modules=["conv*"]).transform(ConvBase(40, 10, channels=8))
    with pytest.raises(ConfigError, match="group_size"):
        _qat(tiny_cfg, group_size=7).transform(MLP(32, 4, hidden=(64,)))


def test_qat_run_reports_the_converted_model_and_resumes_exactly(tiny_cfg, tmp_path):
    cfg = tiny_cfg(**{"checkpoint.every_n_steps": 10, "loop.max_steps": 30, "ledger.energy": "off"},
                   methods=[{"name": "qat", "weight_dtype": "int4", "group_size": 16}])
    fit(cfg, run_dir=tmp_path / "full")
    cut = fit(cfg, run_dir=tmp_path / "cut", callbacks=[SigtermAt(17)])
    fit(cfg, run_dir=tmp_path / "cut", resume=cut.state.last_checkpoint)
    a, b = load_file(tmp_path / "full" / "model.safetensors"), load_file(tmp_path / "cut" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    s = json.loads((tmp_path / "full" / "summary.json").read_text())
    q = s["methods"]["qat"]
    assert abs(q["converted_test_accuracy"] - s["test_accuracy"]) < 0.05  # QAT: conversion costs little
    exported = load_file(tmp_path / "full" / "export.safetensors")
    assert exported["qat/net.0.weight.qdata"].dtype == torch.int8 and "qat/net.0.weight.scale" in exported


def test_without_torchao_one_line_says_how_to_install(tiny_cfg, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torchao.quantization", None)  # as if torchao were not installed
    with pytest.raises(ConfigError, match=r"pip install 'ecotrain\[qat\]'"):
        _qat(tiny_cfg)
