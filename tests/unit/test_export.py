"""ecotrain.export's parts on real models: torch.export traces with a dynamic batch (and sequence) dimension,
the .pt2 read back runs without the class, the parity check measures and refuses, ONNX through
onnxruntime, and the one line for a model torch.export cannot trace."""

import importlib.util
import sys

import pytest
import torch
from torch import nn

from ecotrain.data.sources import ArraySource
from ecotrain.data.text import TextSource, packed_rows
from ecotrain.base.errors import ConfigError, EcotrainError
from ecotrain.export import onnxfile
from ecotrain.export.parity import check, enforce
from ecotrain.export.program import example_inputs, input_spec, load_pt2, pt2_bytes, trace
from ecotrain.models.charlm import CharLM
from ecotrain.models.vision1d import ConvBase, ResNet1d
from ecotrain.core.task import ClassificationTask, LanguageModelTask

HAS_ONNX = all(importlib.util.find_spec(m) for m in ("onnx", "onnxscript", "onnxruntime"))


def _cnn_data(n=37):
    g = torch.Generator().manual_seed(0)
    return ArraySource(torch.randn(n, 40, generator=g), torch.randint(0, 10, (n,), generator=g))


def _lm():
    torch.manual_seed(0)
    model = CharLM(vocab=256, max_len=16, d_model=16, n_layers=2, n_heads=2).eval()
    text = bytes(range(32, 127)) * 8
    return model, TextSource(packed_rows([text], 16))


def test_cnn_program_has_a_dynamic_batch_and_runs_without_its_class():
    torch.manual_seed(0)
    model, src = ConvBase(40, 10).eval(), _cnn_data()
    task = ClassificationTask()
    args, kwargs = example_inputs(task, src)
    ep = trace(model, args, kwargs, sequence=False)
    assert input_spec(ep) == [{"name": "x", "dtype": "float32", "shape": [{"min": 0, "max": None}, 40]}]
    program, meta = load_pt2(pt2_bytes(ep, {"task": "classification", "num_classes": 10}))
    assert meta == {"task": "classification", "num_classes": 10}  # travels inside the file
    x = torch.randn(7, 40)  # another batch size than the 4 it was traced with
    assert torch.equal(program.module()(x), model(x))
    with pytest.raises(Exception):
        program.module()(torch.randn(7, 41))  # the feature size is fixed: refused, not mis-computed


def test_a_one_row_split_still_exports_a_dynamic_batch():
    model, src = ConvBase(40, 10).eval(), _cnn_data(1)
    ep = trace(model, *example_inputs(ClassificationTask(), src), sequence=False)
    assert isinstance(input_spec(ep)[0]["shape"][0], dict)  # not specialised to 1
    assert ep.module()(torch.randn(5, 40)).shape == (5, 10)


def test_charlm_program_takes_any_batch_and_sequence_up_to_max_len():
    model, src = _lm()
    task = LanguageModelTask()
    args, kwargs = example_inputs(task, src)
    assert args[0]._base is None  # a copy: traced from a view, the program would guard on the view's base
    ep = trace(model, args, kwargs, sequence=True)
    spec = input_spec(ep)[0]
    assert spec["dtype"] == "int64" and spec["shape"][1]["max"] == 16  # CharLM's own max_len, read by torch.export
    program = load_pt2(pt2_bytes(ep, {}))[0].module()
    for b, t in ((3, 5), (1, 16), (6, 2)):
        x = torch.randint(0, 256, (b, t))
        assert torch.equal(program(x), model(x))
    with pytest.raises(Exception, match="16"):
        program(torch.randint(0, 256, (1, 17)))


def test_parity_check_of_an_exact_export_records_zero_and_equal_metrics():
    model, src = _lm()
    task = LanguageModelTask()
    ep = trace(model, *example_inputs(task, src), sequence=True)
    record = check(model, {"program": load_pt2(pt2_bytes(ep, {}))[0].module()}, task, src, 4)
    assert record["max_abs_diff"] == 0.0 and record["relative_diff"] == 0.0
    assert record["program"]["test_accuracy"] == record["eager"]["test_accuracy"]
    assert record["program"]["test_bits_per_char"] == record["eager"]["test_bits_per_char"]
    enforce(record, 0.0, "the pt2 export")  # passes even at zero tolerance


class Noisy(nn.Module):
    """Random at inference: the program samples its own noise, so it cannot match eager."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(40, 10)

    def forward(self, x):
        return self.net(x) + 0.1 * torch.randn(x.shape[0], 10)


def test_parity_check_refuses_a_model_that_differs_from_eager():
    model, src = Noisy().eval(), _cnn_data()
    task = ClassificationTask()
    ep = trace(model, *example_inputs(task, src), sequence=False)
    record = check(model, {"program": ep.module()}, task, src, 16)
    assert record["max_abs_diff"] > 1e-3
    with pytest.raises(EcotrainError) as e:
        enforce(record, 1e-4, "the pt2 export")
    assert e.value.exit_code == 1 and "\n" not in str(e.value)
    assert "parity check failed" in str(e.value) and "nothing was written" in str(e.value)


def test_batchnorm_model_exports_its_running_statistics():
    torch.manual_seed(0)
    model = ResNet1d(40, 10, widths=[8, 16])
    model.train()
    model(torch.randn(64, 40) * 3 + 1)  # running statistics away from their initial 0/1
    model.eval()
    src = _cnn_data()
    ep = trace(model, *example_inputs(ClassificationTask(), src), sequence=False)
    x = torch.randn(9, 40)
    assert torch.allclose(ep.module()(x), model(x), atol=1e-6)


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(40, 10)

    def forward(self, x):
        if x.sum() > 0:  # a branch on a tensor's value
            return self.net(x)
        return -self.net(x)


class FixedBatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(40, 10)

    def forward(self, x):
        return self.net(x.reshape(4, 40))


def test_data_dependent_control_flow_is_one_line_naming_the_code_and_the_guidance(capsys):
    with pytest.raises(ConfigError) as e:
        trace(Branchy().eval(), (torch.randn(4, 40),), {}, sequence=False)
    line = str(e.value)
    assert "\n" not in line and e.value.exit_code == 2
    assert "Branchy.forward" in line and "data-dependent" in line
    assert "test_export.py" in line and "if x.sum() > 0:" in line  # the user's own line
    assert "torch.cond" in line and "draft_export" in line
    assert capsys.readouterr().err == ""  # torch's partial graph dump is not the user's news


def test_a_model_that_fixes_the_batch_size_is_named():
    with pytest.raises(ConfigError) as e:
        trace(FixedBatch().eval(), (torch.randn(4, 40),), {}, sequence=False)
    assert "\n" not in str(e.value) and "dimension batch" in str(e.value) and "x.shape[0]" in str(e.value)


@pytest.mark.skipif(not HAS_ONNX, reason="the onnx extra is not installed")
def test_onnx_export_runs_in_onnxruntime_within_1e_5():
    torch.manual_seed(0)
    model, src = ConvBase(40, 10).eval(), _cnn_data()
    task = ClassificationTask()
    args, kwargs = example_inputs(task, src)
    ep = trace(model, args, kwargs, sequence=False)
    session = onnxfile.Session(onnxfile.onnx_bytes(ep, args, kwargs, {"task": "classification"}))
    assert session.meta == {"task": "classification"}  # the metadata travels in the .onnx
    record = check(model, {"onnxruntime": session}, task, src, 16)
    assert 0 <= record["onnxruntime"]["max_abs_diff"] <= 1e-5
    assert record["onnxruntime"]["test_accuracy"] == record["eager"]["test_accuracy"]
    assert session(torch.randn(11, 40)).shape == (11, 10)  # the batch stays dynamic in ONNX too


def test_onnx_without_the_extra_is_one_line_naming_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # find_spec: not installed
    with pytest.raises(ConfigError, match=r"needs the onnx extra: pip install 'ecotrain\[onnx\]'"):
        onnxfile.require()


def test_parity_refuses_nan_outputs_whatever_the_tolerance():
    """A program that returns NaN where eager is finite: a Python max() kept the old figure and passed it."""
    torch.manual_seed(0)
    model, src, task = ConvBase(40, 10).eval(), _cnn_data(), ClassificationTask()

    def nan_program(x):
        out = model(x).clone()
        out[0, 3] = float("nan")
        return out

    record = check(model, {"program": nan_program}, task, src, 16)
    assert record["program"]["nonfinite"] == record["nonfinite"] > 0 and record["max_abs_diff"] == 0
    with pytest.raises(EcotrainError, match=r"returns NaN/Inf for \d+ output values? .* nothing was written"):
        enforce(record, 1e30, "the pt2 export")
    same = check(model, {"program": lambda x: model(x) * float("nan")}, task, src, 16)  # wholly NaN: refused too
    assert same["nonfinite"] > 0


def test_parity_accepts_the_eager_models_own_nan():
    """NaN reproduced where eager makes it is parity (the export is faithful), and the figures stay finite."""
    class Half(nn.Module):
        def forward(self, x):
            return torch.where(x[:, :10] > 0, x[:, :10], float("nan"))

    src, task = _cnn_data(), ClassificationTask()
    record = check(Half(), {"program": Half()}, task, src, 16)
    assert record["nonfinite"] == 0 and record["max_abs_diff"] == 0 and record["relative_diff"] == 0
