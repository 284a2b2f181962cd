"""An export is proven by reading it back in a fresh process: a model whose forward returns a
`transformers` ModelOutput is traced through its logits (`tensors_only`), and the .pt2 is loaded and run
by a new `python` that cannot import transformers (`parity.fresh_process`)."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

from ecotrain.base.errors import ConfigError, EcotrainError
from ecotrain.export.parity import fresh_process
from ecotrain.export.program import TensorOutputs, pt2_bytes, tensors_only, trace


def _gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16,
                                     bos_token_id=0, eos_token_id=0)  # built from a config: nothing downloaded
    return transformers.GPT2LMHeadModel(config).eval()


def test_a_gpt2_is_traced_through_its_logits_and_runs_in_a_fresh_process_without_transformers():
    model = _gpt2()
    ids = torch.randint(64, (2, 8), generator=torch.Generator().manual_seed(1))
    assert type(model(ids)).__name__.startswith("CausalLMOutput")  # what the library returns
    wrapped = tensors_only(model, (ids,), {})
    assert isinstance(wrapped, TensorOutputs)
    ep = trace(wrapped, (ids,), {}, True, 16)
    data = pt2_bytes(ep, {"task": "language_model"})
    fresh = fresh_process(wrapped, data, (ids,), {}, "the pt2 export")
    assert fresh["blocked"] == ["transformers"] and fresh["nonfinite"] == 0
    with torch.no_grad():
        biggest = float(model(ids).logits.abs().max())
    assert fresh["max_abs_diff"] <= 1e-5 * max(1.0, biggest)
    shorter = ids[:1, :3]  # the dynamic batch and sequence, in the fresh process too
    assert fresh_process(wrapped, data, (shorter,), {}, "the pt2 export")["max_abs_diff"] <= 1e-4
    by_name = tensors_only(model, (), {"input_ids": ids})  # the model's own signature: inputs by name
    ep = trace(by_name, (), {"input_ids": ids}, True, 16)
    with torch.no_grad():
        assert torch.allclose(ep.module()(input_ids=shorter), model(shorter).logits, atol=1e-5)


def test_a_program_that_returns_the_library_output_object_fails_the_fresh_process():
    """The check can fail: traced without the reduction (use_cache=False, so it traces), the program's
    output spec names transformers' class, which the fresh process cannot import."""
    model = _gpt2()
    ids = torch.randint(64, (2, 8), generator=torch.Generator().manual_seed(1))
    ep = torch.export.export(model, (ids,), {"use_cache": False})
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    with pytest.raises(EcotrainError) as err:
        fresh_process(lambda x: model(x, use_cache=False).logits, buf.getvalue(), (ids,), {}, "the pt2 export")
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith("export: parity check failed: the pt2 export does not load and run in a fresh Python "
                           "process without transformers (")
    assert line.endswith("nothing was written (return tensors from forward, not a library's output object)")


class _Plain(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.lin, self.kind = nn.Linear(3, 2), kind

    def forward(self, x):
        y = self.lin(x)
        return {"tensor": y, "tuple": (y, y * 2), "dict": {"a": y}, "object": object()}[self.kind]


@pytest.mark.parametrize("kind", ["tensor", "tuple", "dict"])
def test_a_model_returning_plain_tensors_is_traced_as_it_is(kind):
    model = _Plain(kind)
    assert tensors_only(model, (torch.ones(2, 3),), {}) is model


def test_a_model_returning_an_object_without_tensors_is_one_line():
    with pytest.raises(ConfigError) as err:
        tensors_only(_Plain("object"), (torch.ones(2, 3),), {})
    assert str(err.value) == ("export: _Plain.forward returns object, which holds no logits and is not tensors; "
                              "return a tensor (or a tuple of tensors) from forward, or export the model from "
                              "Python with torch.export.export; nothing was written")


def test_a_plain_model_passes_the_fresh_process():
    torch.manual_seed(0)
    model = _Plain("tuple").eval()
    x = torch.randn(4, 3)
    from torch.export import Dim
    ep = torch.export.export(model, (x,), dynamic_shapes=({0: Dim("batch")},))
    fresh = fresh_process(model, pt2_bytes(ep, {}), (x[:2],), {}, "the pt2 export")
    assert fresh["max_abs_diff"] == 0.0 and fresh["nonfinite"] == 0
