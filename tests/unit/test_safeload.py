"""safeload's rules on their own: expressions made of sympy terms only, targets that are operators,
ONNX tensors kept inside the file."""

from __future__ import annotations

import pytest
import torch

from ecotrain.base import safeload
from ecotrain.base.errors import CheckpointError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("expr", ["Symbol('s27', positive=True, integer=True)",
                                  "Mul(Integer(4), Symbol('s27', positive=True, integer=True))",
                                  "FloorDiv(Symbol('s0', integer=True), Integer(2))", "s0 + 2*u1", "Max(s0, 3)",
                                  "Rational(1, 2)", "oo", "Float('1.5', precision=53)"])
def test_what_torch_writes_is_a_safe_expression(expr):
    assert safeload.safe_expression(expr)


@pytest.mark.parametrize("expr", ["__import__('os').system('x')", "open('m', 'w')", "eval('s0')", "s0.__class__",
                                  "Symbol('a b')", "Symbol('s0')[0]", "lambda: 0", "getattr(s0, 'x')",
                                  "Integer(1).func", "exec", "s0; s1", "s0\nimport os"])
def test_anything_else_is_not(expr):
    assert not safeload.safe_expression(expr)


@pytest.mark.parametrize("target,ok", [("torch.ops.aten.add.Tensor", True), ("torch.ops.aten.linear.default", True),
                                       ("_operator.getitem", True), ("math.sqrt", True), ("torch.sym_max", True),
                                       ("torch.os.system", False), ("torch.ops.load_library", False),
                                       ("torch.load", False), ("builtins.eval", False), ("#custom", False),
                                       ("_operator.methodcaller", False), ("torch.ops._x.y", False), ("torch", False)])
def test_targets(target, ok):
    assert safeload.safe_target(target) is ok


def test_not_a_zip_is_one_checkpoint_error():
    with pytest.raises(CheckpointError, match="not a zip"):
        safeload.load_pt2(b"\x00" * 100, "m.pt2")


def test_onnx_with_external_data_is_refused():
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    t = helper.make_tensor("w", TensorProto.FLOAT, [1], [1.0])
    t.data_location = TensorProto.EXTERNAL
    t.ClearField("float_data")
    entry = t.external_data.add()
    entry.key, entry.value = "location", "../../etc/passwd"
    graph = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], [t])
    data = helper.make_model(graph).SerializeToString()
    with pytest.raises(safeload.UnsafeFile, match="external file"):
        safeload.check_onnx(data, "m.onnx")
    with pytest.raises(CheckpointError, match="not a readable ONNX model"):
        safeload.check_onnx(data[: len(data) // 2], "m.onnx")


def test_a_state_dict_file_loads_weights_only(tmp_path):
    good = tmp_path / "w.pt"
    torch.save({"w": torch.ones(2)}, good)
    assert torch.equal(safeload.torch_load(good, "w.pt")["w"], torch.ones(2))
