"""Token files (`data.name: tokens:PATH`, data/tokens.py) and packed documents (data/packing.py)."""

import json
import pickle

import numpy as np
import pytest
import torch

from ecotrain import Config
from ecotrain.data import load_data
from ecotrain.data.packing import document_ids, document_mask, mask_boundaries
from ecotrain.data.sampler import EpochSampler
from ecotrain.base.errors import DataError

EOD = 9


def _cfg(name: str, val_split=0.1, test_split=0.1, **kwargs):
    return Config.model_validate({"data": {"name": name, "kwargs": kwargs, "batch_size": 4, "val_split": val_split,
                                           "test_split": test_split}})


def _file(tmp_path, ids, dtype="uint16", name="train.bin"):
    p = tmp_path / name
    np.asarray(ids, dtype=dtype).tofile(p)
    return p


def test_windows_are_shifted_by_one_and_splits_take_the_tail(tmp_path):
    p = _file(tmp_path, np.arange(1000) % 50)
    b = load_data(_cfg(f"tokens:{p}", seq_len=16, dtype="uint16", vocab_size=50))
    assert b.extra["task"] == "lm" and b.num_classes == 50 and b.input_shape == (16,)
    assert b.extra["tokens"] == {"train": 800, "val": 100, "test": 100}
    x, y = b.train.take(torch.tensor([0, 3]))
    assert x.dtype == torch.int64 and x.shape == (2, 16)
    assert torch.equal(x[1], torch.arange(48, 64) % 50) and torch.equal(y[:, :-1], x[:, 1:])
    assert len(b.train) == (800 - 17) // 16 + 1
    xv, _ = b.val.take(torch.tensor([0]))
    assert int(xv[0, 0]) == 800 % 50  # validation starts where training's tokens end


def test_stride_uint32_and_a_sidecar(tmp_path):
    _file(tmp_path, np.arange(300) + 70_000, "uint32")
    (tmp_path / "tokens.json").write_text(json.dumps({"dtype": "uint32", "vocab_size": 70_400, "files": {"train": "train.bin"}}))
    b = load_data(_cfg(f"tokens:{tmp_path}", val_split=0, test_split=0, seq_len=8, stride=4))
    x, _ = b.train.take(torch.tensor([2]))
    assert int(x[0, 0]) == 70_008 and len(b.train) == (300 - 9) // 4 + 1 and b.val is None


def test_val_and_test_files(tmp_path):
    p = _file(tmp_path, np.arange(200) % 7)
    v, t = _file(tmp_path, np.full(40, 3), name="val.bin"), _file(tmp_path, np.full(30, 4), name="test.bin")
    b = load_data(_cfg(f"tokens:{p}", seq_len=8, dtype="uint16", vocab_size=7, val=str(v), test=str(t)))
    assert b.extra["tokens"] == {"train": 200, "val": 40, "test": 30}
    assert int(b.test.take(torch.tensor([0]))[0][0, 0]) == 4


def test_an_id_over_the_vocabulary_is_named_by_position(tmp_path):
    ids = np.zeros(500)
    ids[321] = 60
    p = _file(tmp_path, ids)
    with pytest.raises(DataError, match=r"token id 60 at position 321 is not below the vocabulary size 50"):
        load_data(_cfg(f"tokens:{p}", seq_len=8, dtype="uint16", vocab_size=50))


def test_boundaries_are_masked_and_attention_stays_in_its_document(tmp_path):
    x = torch.tensor([[1, 2, EOD, 3, 4, EOD, 5, 6]])
    y = torch.tensor([[2, EOD, 3, 4, EOD, 5, 6, 7]])
    assert mask_boundaries(x, y, EOD).tolist() == [[2, EOD, -100, 4, EOD, -100, 6, 7]]
    assert document_ids(x, EOD).tolist() == [[0, 0, 0, 1, 1, 1, 2, 2]]
    m = document_mask(x, EOD)[0, 0]
    assert m[2, 0] and m[2, 2] and not m[3, 2] and not m[0, 1] and m[4, 3] and not m[6, 5]

    p = _file(tmp_path, [1, 2, EOD, 3, 4, EOD, 5, 6, 7] * 20)
    b = load_data(_cfg(f"tokens:{p}", val_split=0, test_split=0, seq_len=8, dtype="uint16", vocab_size=10, eod=EOD,
                       attention="document"))
    batch = b.train.take(torch.tensor([0, 1]))
    assert set(batch) == {"input_ids", "labels", "attention_mask"} and batch["attention_mask"].shape == (2, 1, 8, 8)
    assert (batch["labels"][batch["input_ids"] == EOD] == -100).all()
    assert b.sample["input_ids"].shape == (1, 8)


def test_the_order_and_a_resumed_epoch_are_functions_of_seed_and_epoch(tmp_path):
    """Exact resume at any batch: epoch e's windows from batch k are the uninterrupted run's."""
    p = _file(tmp_path, np.arange(5000) % 97)
    b = load_data(_cfg(f"tokens:{p}", seq_len=16, dtype="uint16", vocab_size=97))
    s = EpochSampler(len(b.train), 4, seed=3)
    whole = [b.train.take(i)[0] for i in s.batches(2)]
    resumed = [b.train.take(i)[0] for i in EpochSampler(len(b.train), 4, seed=3).batches(2, start=17)]
    assert all(torch.equal(a, c) for a, c in zip(whole[17:], resumed, strict=True))


def test_a_file_cut_short_during_training_is_one_line_not_sigbus(tmp_path):
    p = _file(tmp_path, np.arange(400) % 5)
    b = load_data(_cfg(f"tokens:{p}", val_split=0, test_split=0, seq_len=8, dtype="uint16", vocab_size=5))
    b.train.take(torch.tensor([40]))
    with open(p, "r+b") as f:
        f.truncate(100)
    with pytest.raises(DataError, match="shrank from 800 to 100 bytes"):
        b.train.take(torch.tensor([40]))


def test_a_source_sent_to_a_worker_maps_the_file_again(tmp_path):
    p = _file(tmp_path, np.arange(200_000) % 5)
    b = load_data(_cfg(f"tokens:{p}", seq_len=8, dtype="uint16", vocab_size=5))
    b.train.take(torch.tensor([0]))
    blob = pickle.dumps(b.train)
    assert len(blob) < 10_000  # not the file's 400 KB
    assert torch.equal(pickle.loads(blob).take(torch.tensor([7]))[0], b.train.take(torch.tensor([7]))[0])


def test_the_resume_hash_follows_the_content_and_the_windows(tmp_path):
    p = _file(tmp_path, np.arange(2000) % 5)
    h = load_data(_cfg(f"tokens:{p}", seq_len=8, dtype="uint16", vocab_size=5)).content_hash
    assert h == load_data(_cfg(f"tokens:{p}", seq_len=8, dtype="uint16", vocab_size=5)).content_hash
    assert h != load_data(_cfg(f"tokens:{p}", seq_len=16, dtype="uint16", vocab_size=5)).content_hash
    _file(tmp_path, (np.arange(2000) + 1) % 5)
    assert h != load_data(_cfg(f"tokens:{p}", seq_len=8, dtype="uint16", vocab_size=5)).content_hash
