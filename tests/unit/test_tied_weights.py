"""Tied weights through every file ecotrain writes: stored once, the alias recorded, restored tied, and a
killed run resumed bit for bit (a hand-tied model and a transformers GPT-2, whose lm_head is its wte)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from ecotrain import Config, fit
from ecotrain.checkpoint.format import read_checkpoint, verify_checkpoint
from ecotrain.checkpoint.snapshot import load_model_weights
from ecotrain.base.errors import CheckpointError
from ecotrain.base.tensorfile import ALIASES, read_tensors, write_tensors

pytestmark = pytest.mark.unit


class TiedLM(nn.Module):
    """nanoGPT's tie: the output head is the embedding."""

    def __init__(self, vocab: int = 11, width: int = 8):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.mix = nn.Linear(width, width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, x):
        return self.head(torch.tanh(self.mix(self.wte(x))))


def test_a_tied_tensor_is_stored_once_and_read_back_as_the_same_object(tmp_path):
    m = TiedLM()
    path = tmp_path / "w.safetensors"
    write_tensors(path, m.state_dict())
    with safe_open(str(path), framework="pt") as f:
        stored, meta = set(f.keys()), f.metadata()
    assert "head.weight" not in stored and "wte.weight" in stored
    assert json.loads(meta[ALIASES]) == {"head.weight": "wte.weight"}
    back = read_tensors(path)
    assert back["head.weight"] is back["wte.weight"]
    assert torch.equal(back["wte.weight"], m.wte.weight)


def test_an_overlapping_view_is_stored_as_its_own_copy(tmp_path):
    base = torch.arange(12.0)
    path = tmp_path / "v.safetensors"
    write_tensors(path, {"all": base, "half": base[:6], "same": base})
    back = read_tensors(path)
    assert torch.equal(back["half"], base[:6]) and back["same"] is back["all"]


@pytest.mark.parametrize("aliases", ['{"x": "nope"}', '{"w": "w"}', "[1]", "not json", '{"x": 3}'])
def test_damaged_alias_metadata_is_one_checkpoint_error(tmp_path, aliases):
    path = tmp_path / "bad.safetensors"
    save_file({"w": torch.ones(2)}, str(path), metadata={ALIASES: aliases})
    with pytest.raises(CheckpointError, match="aliases"):
        read_tensors(path)


def test_weights_stored_once_load_into_a_tied_model(tmp_path):
    """A Hugging Face safetensors file leaves the tied lm_head out: the model's tie supplies it."""
    src, dst = TiedLM(), TiedLM()
    sd = {k: v for k, v in src.state_dict().items() if k != "head.weight"}
    load_model_weights(dst, sd, "weights")
    assert torch.equal(dst.head.weight, src.wte.weight) and dst.head.weight is dst.wte.weight


class Items(torch.utils.data.Dataset):
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def _tokens(n: int, seed: int, vocab: int = 11, length: int = 6):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, vocab, (n, length), generator=g)
    return x, torch.roll(x, -1, dims=1)  # next-token targets


def _lm_data():
    x, y = _tokens(96, 0)
    return {"train": (x[:64], y[:64]), "val": (x[64:80], y[64:80]), "test": (x[80:], y[80:])}


def _cfg(steps: int, every: int = 4) -> Config:
    return Config.model_validate({"seed": 3, "task": {"name": "language_model"}, "optim": {"lr": 1e-2},
                                  "data": {"batch_size": 16},
                                  "loop": {"max_steps": steps, "max_epochs": None, "eval_every": 4},
                                  "checkpoint": {"every_n_steps": every, "keep_last": 10}})


def test_a_tied_model_checkpoints_finishes_and_resumes_bit_identical(tmp_path):
    full = fit(_cfg(12), model=TiedLM(), data=_lm_data(), run_dir=tmp_path / "full", quiet=True)
    assert (tmp_path / "full" / "model.safetensors").is_file() and full.summary["steps"] == 12
    ckpts = sorted((tmp_path / "full" / "checkpoints").glob("step-*"))
    assert ckpts, "no checkpoint was written"
    verify_checkpoint(ckpts[0])
    tensors, _ = read_checkpoint(ckpts[0])
    tied = [k for k in tensors if k.endswith("head.weight")]
    assert tied and all(tensors[k] is tensors[k.replace("head.weight", "wte.weight")] for k in tied)

    # the run as a kill after step 8 leaves it, resumed: the same bytes as the run never stopped
    _cut_after(tmp_path / "full", tmp_path / "cut", 8)
    resumed_model = TiedLM()
    fit(_cfg(12), model=resumed_model, data=_lm_data(), run_dir=tmp_path / "cut", quiet=True, resume="auto")
    assert resumed_model.head.weight is resumed_model.wte.weight
    _assert_same_weights(tmp_path / "full", tmp_path / "cut")


def _cut_after(run, cut, step: int) -> None:
    """A copy of a finished run as a kill after `step` leaves it: later checkpoints and the results gone."""
    shutil.copytree(run, cut)
    for name in ("model.safetensors", "summary.json", "ledger.json", "environment.json"):
        (cut / name).unlink(missing_ok=True)
    for ck in (cut / "checkpoints").glob("step-*"):
        if int(ck.name.split("-")[1]) > step:
            shutil.rmtree(ck)


def _assert_same_weights(a_run, b_run) -> None:
    a = read_tensors(a_run / "model.safetensors")
    b = read_tensors(b_run / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_transformers_gpt2_trains_checkpoints_and_resumes(tmp_path):
    transformers = pytest.importorskip("transformers")  # the adapters extra, installed by `make test`

    def gpt2():
        torch.manual_seed(0)
        cfg = transformers.GPT2Config(vocab_size=11, n_positions=8, n_embd=16, n_layer=1, n_head=2,
                                        bos_token_id=0, eos_token_id=0)
        return transformers.GPT2LMHeadModel(cfg)

    def data():
        x, _ = _tokens(96, 1)
        items = [{"input_ids": r, "labels": r} for r in x]  # the model shifts the labels itself
        return {"train": Items(items[:64]), "val": Items(items[64:80]), "test": Items(items[80:])}

    m = gpt2()
    assert m.lm_head.weight is m.transformer.wte.weight
    cfg = lambda steps: Config.model_validate({"seed": 1, "optim": {"lr": 1e-2}, "data": {"batch_size": 16},  # noqa: E731
                                               "loop": {"max_steps": steps, "max_epochs": None, "eval_every": 4},
                                               "checkpoint": {"every_n_steps": 4, "keep_last": 10}})
    fit(cfg(8), model=m, data=data(), run_dir=tmp_path / "full", quiet=True)
    _cut_after(tmp_path / "full", tmp_path / "cut", 4)
    fit(cfg(8), model=gpt2(), data=data(), run_dir=tmp_path / "cut", quiet=True, resume="auto")
    a = read_tensors(tmp_path / "full" / "model.safetensors")
    assert a["lm_head.weight"] is a["transformer.wte.weight"]
    _assert_same_weights(tmp_path / "full", tmp_path / "cut")


def test_ema_of_a_tied_model_checkpoints_and_resumes(tmp_path):
    cfg = Config.model_validate({**_cfg(12).model_dump(), "methods": [{"name": "ema", "decay": 0.9}]})
    fit(cfg, model=TiedLM(), data=_lm_data(), run_dir=tmp_path / "full", quiet=True)
    _cut_after(tmp_path / "full", tmp_path / "cut", 8)
    fit(cfg, model=TiedLM(), data=_lm_data(), run_dir=tmp_path / "cut", quiet=True, resume="auto")
    _assert_same_weights(tmp_path / "full", tmp_path / "cut")
