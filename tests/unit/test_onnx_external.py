"""An .onnx model may keep a tensor's data in a file beside it (or anywhere: the location is a path).
The runtime would read that file, so ecotrain refuses such a model wherever the reference hides:
initializers, sparse initializers, node attributes (tensor, tensors, sparse tensor), the subgraphs of
If / Loop / Scan at any depth, model-local functions. Each form here points at a file that exists, and
must be refused all the same, before the runtime sees the model."""

from __future__ import annotations

import builtins
import os

import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

from ecotrain.base.errors import CheckpointError  # noqa: E402
from ecotrain.base import safeload  # noqa: E402
from ecotrain.export import onnxfile  # noqa: E402

OPSET = [helper.make_opsetid("", 17)]
FLOAT1 = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])]


def _tensor(name: str, secret, external: bool, *, mark: bool = True) -> TensorProto:
    """A one-float tensor; `external`: its data in `secret` instead (`mark=False`: the location entry
    alone, data_location left DEFAULT)."""
    t = helper.make_tensor(name, TensorProto.FLOAT, [1], [1.0])
    if external:
        t.ClearField("float_data")
        if mark:
            t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", str(secret)), ("offset", "0"), ("length", "4")):
            entry = t.external_data.add()
            entry.key, entry.value = key, value
    return t


def _model(graph, **kw):
    return helper.make_model(graph, opset_imports=kw.pop("opset_imports", OPSET), **kw)


def _constant_graph(name: str, secret, external: bool) -> onnx.GraphProto:
    node = helper.make_node("Constant", [], ["y"], value=_tensor(name, secret, external))
    return helper.make_graph([node], name + "_g", [], FLOAT1)


def initializer(secret, ext):
    graph = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [], FLOAT1,
                              [_tensor("w", secret, ext)])
    return _model(graph)


def initializer_location_only(secret, ext):
    graph = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [], FLOAT1,
                              [_tensor("w", secret, ext, mark=False)])
    return _model(graph)


def _sparse(secret, ext, where: str):
    values = _tensor("sv", secret, ext and where == "values")
    indices = helper.make_tensor("si", TensorProto.INT64, [1], [0])
    if ext and where == "indices":
        indices = _tensor("si", secret, True)
    return helper.make_sparse_tensor(values, indices, [4])


def sparse_initializer_values(secret, ext):
    graph = helper.make_graph([helper.make_node("Identity", ["sv"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                              sparse_initializer=[_sparse(secret, ext, "values")])
    return _model(graph)


def sparse_initializer_indices(secret, ext):
    graph = helper.make_graph([helper.make_node("Identity", ["sv"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                              sparse_initializer=[_sparse(secret, ext, "indices")])
    return _model(graph)


def constant_attribute(secret, ext):
    return _model(_constant_graph("c", secret, ext))


def constant_sparse_attribute(secret, ext):
    node = helper.make_node("Constant", [], ["y"], sparse_value=_sparse(secret, ext, "values"))
    return _model(helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])]))


def attribute_tensors(secret, ext):
    node = helper.make_node("Holder", [], ["y"], domain="custom",
                            tensors=[_tensor("a", secret, False), _tensor("b", secret, ext)])
    return _model(helper.make_graph([node], "g", [], FLOAT1),
                  opset_imports=OPSET + [helper.make_opsetid("custom", 1)])


def attribute_sparse_tensors(secret, ext):
    attr = helper.make_attribute("sparse", [_sparse(secret, False, ""), _sparse(secret, ext, "values")])
    node = helper.make_node("Holder", [], ["y"], domain="custom")
    node.attribute.append(attr)
    return _model(helper.make_graph([node], "g", [], FLOAT1),
                  opset_imports=OPSET + [helper.make_opsetid("custom", 1)])


def function_body(secret, ext):
    body = helper.make_node("Constant", [], ["out"], value=_tensor("f_c", secret, ext))
    fn = helper.make_function("local", "F", [], ["out"], [body], OPSET)
    graph = helper.make_graph([helper.make_node("F", [], ["y"], domain="local")], "g", [], FLOAT1)
    return _model(graph, opset_imports=OPSET + [helper.make_opsetid("local", 1)], functions=[fn])


def if_then_branch(secret, ext):
    cond = helper.make_tensor("cond", TensorProto.BOOL, [], [True])
    node = helper.make_node("If", ["cond"], ["y"], then_branch=_constant_graph("then", secret, ext),
                            else_branch=_constant_graph("else", secret, False))
    return _model(helper.make_graph([node], "g", [], FLOAT1, [cond]))


def if_branch_initializer(secret, ext):
    cond = helper.make_tensor("cond", TensorProto.BOOL, [], [True])
    then = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "then", [], FLOAT1,
                             [_tensor("w", secret, ext)])
    node = helper.make_node("If", ["cond"], ["y"], then_branch=then,
                            else_branch=_constant_graph("else", secret, False))
    return _model(helper.make_graph([node], "g", [], FLOAT1, [cond]))


def _loop(body_nodes, secret):
    body = helper.make_graph(
        body_nodes, "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c_in", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, [1])])
    trip = helper.make_tensor("trip", TensorProto.INT64, [], [1])
    cond = helper.make_tensor("cond", TensorProto.BOOL, [], [True])
    node = helper.make_node("Loop", ["trip", "cond"], ["y"], body=body)
    return helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])],
                             [trip, cond])


def loop_body(secret, ext):
    nodes = [helper.make_node("Identity", ["c_in"], ["c_out"]),
             helper.make_node("Constant", [], ["v"], value=_tensor("loop_c", secret, ext))]
    return _model(_loop(nodes, secret))


def if_inside_loop(secret, ext):
    cond = helper.make_node("Constant", [], ["flag"], value=helper.make_tensor("f", TensorProto.BOOL, [], [True]))
    inner = helper.make_node("If", ["flag"], ["v"], then_branch=_constant_graph("deep", secret, ext),
                             else_branch=_constant_graph("else", secret, False))
    nodes = [helper.make_node("Identity", ["c_in"], ["c_out"]), cond, inner]
    return _model(_loop(nodes, secret))


FORMS = {
    initializer: "initializer of graph 'g'",
    initializer_location_only: "initializer of graph 'g'",
    sparse_initializer_values: "values of sparse initializer",
    sparse_initializer_indices: "indices of sparse initializer",
    constant_attribute: "attribute 'value' of node",
    constant_sparse_attribute: "values of attribute 'sparse_value'",
    attribute_tensors: "attribute 'tensors' of node",
    attribute_sparse_tensors: "attribute 'sparse' of node",
    function_body: "function 'F'",
    if_then_branch: "subgraph attribute 'then_branch'",
    if_branch_initializer: "initializer of subgraph attribute 'then_branch'",
    loop_body: "subgraph attribute 'body'",
    if_inside_loop: "in subgraph attribute 'body'",
}


@pytest.fixture
def secret(tmp_path):
    path = tmp_path / "outside" / "secret.bin"
    path.parent.mkdir()
    path.write_bytes(b"\x00\x00\x80\x3f")  # 1.0f: a tensor the runtime would gladly read
    return path


@pytest.mark.parametrize("build", FORMS, ids=lambda f: f.__name__)
def test_every_form_without_the_reference_passes(build, secret):
    """The same model with its data inside: no refusal (so the refusal below is the reference's)."""
    safeload.check_onnx(build(secret, False).SerializeToString(), "m.onnx")


@pytest.mark.parametrize("build", FORMS, ids=lambda f: f.__name__)
def test_an_external_reference_is_refused_wherever_it_sits(build, secret):
    data = build(secret, True).SerializeToString()
    with pytest.raises(safeload.UnsafeFile) as err:
        safeload.check_onnx(data, "m.onnx")
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith("m.onnx: refused, ") and "keeps its data in an external file" in line
    assert FORMS[build] in line, line
    assert "ecotrain export" in line  # what to do


@pytest.mark.parametrize("build", [initializer, function_body, if_inside_loop, sparse_initializer_indices],
                         ids=lambda f: f.__name__)
def test_load_refuses_before_anything_outside_is_read(build, secret, tmp_path, monkeypatch):
    """`onnxfile.load` (predict): the model is refused and neither the runtime nor Python opens the
    file the reference names."""
    if not onnxfile.has_runtime():
        pytest.skip("onnxruntime not installed")
    path = tmp_path / "m.onnx"
    path.write_bytes(build(secret, True).SerializeToString())
    opened: list[str] = []
    real_open, real_os_open = builtins.open, os.open

    def spy_open(file, *a, **k):
        opened.append(str(file))
        return real_open(file, *a, **k)

    def spy_os_open(file, *a, **k):
        opened.append(str(file))
        return real_os_open(file, *a, **k)

    def no_session(*a, **k):
        raise AssertionError("the runtime was handed a model with external data")

    monkeypatch.setattr(builtins, "open", spy_open)
    monkeypatch.setattr(os, "open", spy_os_open)
    monkeypatch.setattr(onnxfile, "Session", no_session)
    with pytest.raises(CheckpointError, match=r"m\.onnx: refused, .* keeps its data in an external file"):
        onnxfile.load(path)
    assert str(secret) not in opened
    assert str(path) in opened  # read through safefile (os.open), not Path.read_bytes


def test_a_clean_model_still_loads_and_runs(tmp_path, secret):
    if not onnxfile.has_runtime():
        pytest.skip("onnxruntime not installed")
    path = tmp_path / "m.onnx"
    model = initializer(secret, False)
    model.ir_version = 8  # what every installed runtime reads
    path.write_bytes(model.SerializeToString())
    out = onnxfile.load(path)()
    assert out.tolist() == [1.0]


def test_a_fifo_or_an_oversized_file_is_one_line(tmp_path, monkeypatch):
    if not onnxfile.has_runtime():
        pytest.skip("onnxruntime not installed")
    fifo = tmp_path / "m.onnx"
    os.mkfifo(fifo)
    with pytest.raises(CheckpointError, match=r"m\.onnx: the ONNX model is a FIFO"):
        onnxfile.load(fifo)  # does not hang
    big = tmp_path / "big.onnx"
    big.write_bytes(b"\x00" * 64)
    monkeypatch.setattr(onnxfile, "MAX_BYTES", 16)
    with pytest.raises(CheckpointError, match=r"big\.onnx: the ONNX model is 64 bytes, more than"):
        onnxfile.load(big)
