"""batch.py: any batch structure walked, moved, counted and cut into micro-batches."""

import dataclasses
from collections import namedtuple

import pytest
import torch

from ecotrain.core.batch import batch_size, describe, leaves, select, split, to_device, tree_map

pytestmark = pytest.mark.unit

META = torch.device("meta")  # a real second device on a CPU-only machine: `.to(meta)` is observable


class Enc(dict):
    """A Hugging Face BatchEncoding in miniature: a dict whose keys are also attributes."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class NeedsArg(dict):
    """A dict subclass that cannot be rebuilt from one mapping."""

    def __init__(self, items, tag):
        super().__init__(items)
        self.tag = tag


Triple = namedtuple("Triple", "x mask y")
Pair = namedtuple("Pair", "x y")


@dataclasses.dataclass
class Sample:
    x: torch.Tensor
    y: torch.Tensor
    names: list
    source: str = "train"


def _nested():
    return {"enc": Enc(input_ids=torch.arange(6).reshape(3, 2), attention_mask=torch.ones(3, 2)),
            "nt": Triple(torch.zeros(3, 4), torch.ones(3, 4, dtype=torch.bool), torch.arange(3)),
            "dc": Sample(torch.ones(3, 2), torch.arange(3), ["a", "b", "c"]),
            "lst": [torch.full((3,), 2.0), [torch.ones(3), "tag"]],
            "id": "batch-7"}


def _types(batch):
    """The container classes of `batch`, depth first: what a rebuild must keep."""
    if isinstance(batch, torch.Tensor):
        return "T"
    if isinstance(batch, dict):
        return (type(batch), {k: _types(v) for k, v in batch.items()})
    if isinstance(batch, (tuple, list)):
        return (type(batch), [_types(v) for v in batch])
    if dataclasses.is_dataclass(batch):
        return (type(batch), {f.name: _types(getattr(batch, f.name)) for f in dataclasses.fields(batch)})
    return batch  # a non-tensor leaf rides along unchanged


def test_tree_map_keeps_every_container_and_maps_every_tensor():
    batch = _nested()
    out = tree_map(lambda t: t.float() * 10, batch)
    assert _types(out) == _types(batch)
    assert out["enc"].input_ids.tolist() == [[0, 10], [20, 30], [40, 50]]  # the attribute still works
    assert isinstance(out["nt"], Triple) and out["nt"].y.tolist() == [0, 10, 20]
    assert isinstance(out["dc"], Sample) and out["dc"].y.tolist() == [0, 10, 20]
    assert out["dc"].names == ["a", "b", "c"] and out["dc"].source == "train"
    assert out["lst"][0].tolist() == [20.0] * 3 and out["lst"][1][1] == "tag" and out["id"] == "batch-7"
    assert [t.shape for t in leaves(out)] == [t.shape for t in leaves(batch)] and len(leaves(batch)) == 9
    assert batch["enc"]["input_ids"].dtype == torch.int64  # the input is not modified in place


def test_tree_map_dict_subclass_that_cannot_be_rebuilt_falls_back_to_dict():
    out = tree_map(lambda t: t + 1, NeedsArg({"x": torch.zeros(2)}, tag="t"))
    assert type(out) is dict and out["x"].tolist() == [1.0, 1.0]


def test_to_device_moves_every_tensor_and_keeps_the_containers():
    batch = _nested()
    out = to_device(batch, META)
    assert _types(out) == _types(batch)
    assert {t.device.type for t in leaves(out)} == {"meta"} and len(leaves(out)) == 9
    assert {t.device.type for t in leaves(batch)} == {"cpu"}
    assert out["enc"].input_ids.shape == (3, 2) and out["dc"].names == ["a", "b", "c"]


def test_to_device_pair_fast_path():
    x, y = torch.zeros(4, 3), torch.arange(4)
    out = to_device((x, y), META)
    assert type(out) is tuple and len(out) == 2
    assert out[0].device.type == out[1].device.type == "meta" and out[1].dtype == torch.int64


def test_to_device_keeps_a_two_field_namedtuple():
    """A namedtuple of two tensors is not the plain (x, y) pair: `.x` must survive the move."""
    out = to_device(Pair(torch.zeros(4, 3), torch.arange(4)), META)
    assert isinstance(out, Pair) and out.x.device.type == "meta"


def test_batch_size_reads_the_first_batched_tensor():
    x = torch.zeros(5, 3)
    assert batch_size((x, torch.arange(5))) == 5
    assert batch_size([x, torch.arange(5)]) == 5
    assert batch_size({"ids": ["a"] * 5, "scale": torch.tensor(2.0), "x": x}) == 5  # 0-d and strings skipped
    assert batch_size(Enc(input_ids=torch.zeros(7, 16, dtype=torch.long))) == 7
    assert batch_size(Sample(torch.zeros(6, 2), torch.arange(6), ["a"] * 6)) == 6
    assert batch_size(Triple(torch.zeros(2, 1), torch.ones(2, 1), torch.arange(2))) == 2
    with pytest.raises(TypeError, match="no tensor"):
        batch_size({"ids": ["a", "b"], "n": 3})


def _sizes(pieces):
    return [batch_size(p) for p in pieces]


def test_split_dict_cuts_per_sample_strings_with_the_tensors():
    n = 10
    batch = Enc(x=torch.arange(n * 2).reshape(n, 2), y=torch.arange(n), names=[f"s{i}" for i in range(n)],
                scale=torch.tensor(0.5), split="train")
    pieces = split(batch, 3)
    assert _sizes(pieces) == [4, 4, 2]
    for p in pieces:
        assert type(p) is Enc
        assert p.names == [f"s{i}" for i in p.y.tolist()]  # each name stays with its own row
        assert p.x[:, 0].tolist() == [2 * i for i in p.y.tolist()]
        assert p.scale.item() == 0.5 and p.split == "train"  # not batched: every piece gets it whole
    assert torch.equal(torch.cat([p.x for p in pieces]), batch.x)
    assert sum((p.names for p in pieces), []) == batch.names


def test_split_namedtuple_and_dataclass_keep_their_class():
    n = 7
    nt = Triple(torch.randn(n, 3), torch.rand(n, 3) > 0.5, torch.arange(n))
    pieces = split(nt, 2)
    assert [type(p) for p in pieces] == [Triple, Triple] and _sizes(pieces) == [4, 3]
    assert torch.equal(torch.cat([p.x for p in pieces]), nt.x) and torch.equal(pieces[1].y, torch.arange(4, 7))

    dc = Sample(torch.randn(n, 2), torch.arange(n), [f"n{i}" for i in range(n)], source="val")
    pieces = split(dc, 3)
    assert all(type(p) is Sample for p in pieces) and _sizes(pieces) == [3, 3, 1]
    assert [p.names for p in pieces] == [["n0", "n1", "n2"], ["n3", "n4", "n5"], ["n6"]]
    assert all(p.source == "val" for p in pieces)
    assert torch.equal(torch.cat([p.x for p in pieces]), dc.x)


def test_split_keeps_a_two_field_namedtuple():
    pieces = split(Pair(torch.zeros(6, 3), torch.arange(6)), 2)
    assert [type(p) for p in pieces] == [Pair, Pair] and pieces[1].y.tolist() == [3, 4, 5]


def test_split_pair_fast_path_gives_views():
    x, y = torch.randn(9, 4), torch.arange(9)
    pieces = split((x, y), 4)
    assert all(type(p) is tuple and len(p) == 2 for p in pieces)
    sizes = _sizes(pieces)
    assert max(sizes) == 3 and sum(sizes) == 9 and len(pieces) <= 4  # no piece above ceil(9 / 4)
    assert torch.equal(torch.cat([p[0] for p in pieces]), x) and torch.equal(torch.cat([p[1] for p in pieces]), y)
    assert pieces[1][0].data_ptr() == x[3].data_ptr()  # a view of the batch, not a copy


def test_split_nested_lists_and_tuples():
    n = 6
    batch = [torch.arange(n), (torch.arange(n) * 2, [f"w{i}" for i in range(n)]), "const"]
    pieces = split(batch, 2)
    assert _sizes(pieces) == [3, 3]
    for p in pieces:
        assert type(p) is list and type(p[1]) is tuple and p[2] == "const"
        assert p[1][0].tolist() == [2 * i for i in p[0].tolist()]
        assert p[1][1] == [f"w{i}" for i in p[0].tolist()]


@pytest.mark.parametrize("n_micro", [5, 16])
def test_split_batch_smaller_than_n_micro_gives_one_sample_each(n_micro):
    batch = {"x": torch.arange(3).float().unsqueeze(1), "names": ["a", "b", "c"]}
    pieces = split(batch, n_micro)
    assert _sizes(pieces) == [1, 1, 1]
    assert [p["names"] for p in pieces] == [["a"], ["b"], ["c"]]
    assert [p["x"].item() for p in pieces] == [0.0, 1.0, 2.0]
    pair = split((torch.arange(3), torch.arange(3)), n_micro)
    assert _sizes(pair) == [1, 1, 1]


def test_split_into_one_is_the_whole_batch():
    batch = {"x": torch.arange(4), "names": list("abcd")}
    (only,) = split(batch, 1)
    assert torch.equal(only["x"], batch["x"]) and only["names"] == batch["names"]


def test_select_picks_rows_and_per_sample_lists():
    n = 5
    batch = {"x": torch.arange(n * 2).reshape(n, 2), "names": [f"s{i}" for i in range(n)],
             "pair": (torch.arange(n) * 10, [i * 0.5 for i in range(n)]),
             "classes": ["cat", "dog"],  # not per sample (length != batch size): untouched
             "weights": torch.ones(3),  # a tensor without the batch dimension: untouched
             "scale": torch.tensor(2.0), "tag": "t"}
    idx = torch.tensor([4, 0, 2])
    out = select(batch, idx)
    assert out["x"].tolist() == [[8, 9], [0, 1], [4, 5]]
    assert out["names"] == ["s4", "s0", "s2"]
    assert out["pair"][0].tolist() == [40, 0, 20] and out["pair"][1] == [2.0, 0.0, 1.0]
    assert out["classes"] == ["cat", "dog"] and out["weights"].shape == (3,) and out["tag"] == "t"
    assert out["scale"].item() == 2.0
    assert batch_size(out) == 3


def test_select_keeps_namedtuple_dataclass_and_dict_subclass():
    nt = select(Triple(torch.arange(4), torch.ones(4), torch.arange(4) + 1), torch.tensor([3, 1]))
    assert isinstance(nt, Triple) and nt.y.tolist() == [4, 2]
    dc = select(Sample(torch.arange(4), torch.arange(4), list("abcd")), torch.tensor([2]))
    assert isinstance(dc, Sample) and dc.names == ["c"] and dc.x.tolist() == [2]
    enc = select(Enc(input_ids=torch.arange(8).reshape(4, 2)), torch.tensor([1]))
    assert type(enc) is Enc and enc.input_ids.tolist() == [[2, 3]]


def test_describe_is_short_and_names_shapes():
    batch = Enc({f"k{i}": torch.zeros(8, 16, dtype=torch.long) for i in range(20)})
    text = describe(batch)
    assert text.startswith("Enc(k0: int64[8, 16], ")
    assert "k5" in text and "k6" not in text  # six entries at most
    assert "\n" not in text and len(text) < 200 and "tensor(" not in text
    big = describe((torch.randn(1000, 1000), {"a": {"b": {"c": {"d": torch.zeros(1)}}}}, ["x"] * 1000))
    assert big == "tuple(float32[1000, 1000], dict(a: dict(b: dict)), list(str, str, str, str, str, str))"
    assert describe(Pair(torch.zeros(2, dtype=torch.bfloat16), 3)) == "Pair(bfloat16[2], int)"
