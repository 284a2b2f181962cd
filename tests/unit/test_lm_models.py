"""Language models from configs: transformers GPT-2, Llama and Qwen2 (random init, no download) and the
built-in nanoGPT module; each builds, gives logits [b, T, vocab], ties what it should, and says a
wrong keyword in one line."""

import pytest
import torch

from ecotrain.config import ModelConfig
from ecotrain.base.errors import ConfigError
from ecotrain.models import build_model

pytest.importorskip("transformers")

SMALL = {"d_model": 32, "n_layers": 2, "n_heads": 4}
ARCHS = {"gpt2": {}, "llama": {"n_kv_heads": 2}, "qwen2": {"n_kv_heads": 2}}


def build(name, **kwargs):
    return build_model(ModelConfig(name=name, kwargs=kwargs), (16,), 256)  # token ids [16], vocabulary 256


def tied(model) -> bool:
    head, emb = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    return head.data_ptr() == emb.data_ptr()


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_each_arch_builds_and_gives_logits(arch):
    torch.manual_seed(0)
    m = build("causal_lm", arch=arch, **SMALL, **ARCHS[arch])
    out = m(torch.randint(0, 256, (3, 16)))
    assert type(out) is torch.Tensor and out.shape == (3, 16, 256)  # a tensor: the task, export and methods see logits
    c = m.config
    assert c.vocab_size == 256 and c.use_cache is False  # the vocabulary from the data
    assert tied(m.hf) == (arch == "gpt2")  # each architecture's own default
    assert tied(build("causal_lm", arch=arch, tie=True, **SMALL).hf)


def test_sizes_have_one_spelling():
    g = build("causal_lm", arch="gpt2", **SMALL).config
    assert (g.n_embd, g.n_layer, g.n_head, g.n_inner, g.n_positions) == (32, 2, 4, 128, 16)  # max_len: seq_len
    q = build("causal_lm", arch="qwen2", n_kv_heads=2, d_ff=48, **SMALL).config
    assert (q.hidden_size, q.num_hidden_layers, q.num_attention_heads, q.num_key_value_heads,
            q.intermediate_size, q.max_position_embeddings) == (32, 2, 4, 2, 48, 16)
    assert build("causal_lm", arch="llama", rope_theta=500.0, **SMALL).config.rope_parameters["rope_theta"] == 500.0


def test_causal_and_seeded():
    torch.manual_seed(1)
    a = build("causal_lm", arch="llama", **SMALL).eval()
    torch.manual_seed(1)
    b = build("causal_lm", arch="llama", **SMALL).eval()
    x = torch.randint(0, 256, (2, 16))
    assert torch.equal(a(x), b(x))  # random init from the caller's seed: the same seed, the same model
    x2 = x.clone()
    x2[:, 9:] = (x2[:, 9:] + 1) % 256
    assert torch.allclose(a(x)[:, :9], a(x2)[:, :9], atol=1e-5)  # no position sees a later token


def test_nanogpt_ties_its_head_to_the_embedding():
    torch.manual_seed(0)
    m = build("nanogpt", **SMALL)
    assert m.lm_head.weight is m.transformer.wte.weight
    assert sum(p is m.lm_head.weight for p in m.parameters()) == 1  # one parameter, counted once
    assert m(torch.randint(0, 256, (2, 16))).shape == (2, 16, 256)
    assert build("nanogpt", vocab_size=300, **SMALL).lm_head.weight.shape == (300, 32)


@pytest.mark.parametrize("kwargs, message", [
    ({"arch": "gpt3"}, r"^model.kwargs.arch: 'gpt3' is not one of \['gpt2', 'llama', 'qwen2'\]$"),
    ({"arch": "gpt2", "n_kv_heads": 2}, r"^model.kwargs.n_kv_heads: gpt2 has no grouped-query attention"),
    ({"arch": "llama", "rope_thetaa": 1.0}, r"^model.kwargs.rope_thetaa: not a size .* nor a field of LlamaConfig$"),
    ({"arch": "gpt2", "vocab_size": 100}, r"^model.kwargs.vocab_size: 100 is smaller than the data's vocabulary of 256"),
    ({"arch": "gpt2", "d_model": 30}, r"^model.kwargs: d_model=30 is not a multiple of n_heads=4$"),
    ({"arch": "gpt2", "n_layers": 0}, r"^model.kwargs.n_layers: sizes of model causal_lm are whole numbers"),
])
def test_wrong_keywords_are_one_line(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        build("causal_lm", **{"n_heads": 4, **kwargs})


def test_nanogpt_keeps_packed_documents_apart_with_a_mask():
    from ecotrain.data.packing import document_mask

    torch.manual_seed(0)
    m = build("nanogpt", **SMALL).eval()
    x = torch.randint(1, 256, (2, 16))
    x[:, 5] = 0  # an end of document at 5: positions 6.. are another document
    other = x.clone()
    other[:, :5] = (other[:, :5] + 7) % 255 + 1  # the first document changed
    masked = lambda t: m(t, document_mask(t, 0))  # noqa: E731
    assert torch.allclose(masked(x)[:, 6:], masked(other)[:, 6:], atol=1e-6)  # the second never sees the first
    assert not torch.allclose(m(x)[:, 6:], m(other)[:, 6:], atol=1e-4)  # without the mask it does
    with pytest.raises(ValueError, match=r"^nanogpt takes attention_mask as \[batch, 1, T, T\] bool"):
        m(x, torch.ones(2, 16))
