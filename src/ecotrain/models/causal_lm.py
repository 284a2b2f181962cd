"""Hugging Face causal language models built from a config, with random weights (nothing downloaded).

`model: {name: causal_lm, kwargs: {arch: gpt2 | llama | qwen2, d_model, n_layers, n_heads, ...}}`.
The sizes have one spelling for every architecture (the built-in `charlm`'s); `vocab_size` defaults
to the data's vocabulary and `max_len` to its sequence length. Any other keyword is a field of the
architecture's own `transformers` config (`rope_theta`, `layer_norm_epsilon`, ...), checked by name.

The model is wrapped once, here (`CausalLM`): token ids in, logits `[batch, T, vocab]` out, no KV
cache. So the `language_model` task, export and every method see a plain tensor, as with `charlm`;
a `transformers` model passed to `fit(model=...)` as it is also trains (the task reads `.logits`).
`transformers` is the `lm` extra, imported only when such a model is built.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Optional

from torch import nn

from ecotrain.base.errors import ConfigError

# arch -> (config class, model class, ecotrain's size name -> the config's field)
ARCHS: dict[str, tuple[str, str, dict[str, str]]] = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel",
             {"d_model": "n_embd", "n_layers": "n_layer", "n_heads": "n_head", "d_ff": "n_inner",
              "max_len": "n_positions", "vocab_size": "vocab_size", "tie": "tie_word_embeddings"}),
    "llama": ("LlamaConfig", "LlamaForCausalLM",
              {"d_model": "hidden_size", "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
               "n_kv_heads": "num_key_value_heads", "d_ff": "intermediate_size",
               "max_len": "max_position_embeddings", "vocab_size": "vocab_size", "tie": "tie_word_embeddings"}),
}
ARCHS["qwen2"] = ("Qwen2Config", "Qwen2ForCausalLM", ARCHS["llama"][2])
SIZES = ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "max_len", "vocab_size")
_DROPOUT = {"gpt2": ("resid_pdrop", "embd_pdrop", "attn_pdrop"), "llama": ("attention_dropout",),
            "qwen2": ("attention_dropout",)}


class CausalLM(nn.Module):
    """A `transformers` causal LM as ecotrain trains it: `forward(input_ids, ...) -> logits`.
    Extra keyword inputs of a dict batch (attention_mask, position_ids) go to the model as they are."""

    def __init__(self, hf: nn.Module):
        super().__init__()
        self.hf = hf

    @property
    def config(self):
        return self.hf.config

    def forward(self, input_ids, attention_mask=None, **inputs):
        return self.hf(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **inputs).logits


def transformers_module():
    try:
        return importlib.import_module("transformers")  # the `lm` extra: imported only for these models
    except ImportError:
        raise ConfigError("model causal_lm needs transformers: pip install 'ecotrain[lm]'") from None


def causal_lm(arch: str = "gpt2", vocab_size: Optional[int] = None, max_len: Optional[int] = None,
              d_model: int = 256, n_layers: int = 4, n_heads: int = 4, n_kv_heads: Optional[int] = None,
              d_ff: Optional[int] = None, tie: Optional[bool] = None, dropout: float = 0.0,
              **config: Any) -> CausalLM:
    """A randomly initialised GPT-2, Llama or Qwen2 (seeded by the caller's torch seed).
    `d_ff` defaults to 4 x d_model (GPT-2) or 8/3 x d_model rounded up to 32 (Llama, Qwen2: a SwiGLU
    MLP of about GPT-2's parameters); `tie` to the architecture's own default (GPT-2 tied)."""
    if arch not in ARCHS:
        raise ConfigError(f"model.kwargs.arch: '{arch}' is not one of {sorted(ARCHS)}")
    if vocab_size is None:
        raise ConfigError("model.kwargs.vocab_size: the data does not say its vocabulary; give vocab_size")
    conf_name, model_name, names = ARCHS[arch]
    if n_kv_heads is not None and "n_kv_heads" not in names:
        raise ConfigError(f"model.kwargs.n_kv_heads: {arch} has no grouped-query attention (llama, qwen2 have)")
    if d_model % n_heads:
        raise ConfigError(f"model.kwargs: d_model={d_model} is not a multiple of n_heads={n_heads}")
    if n_kv_heads is not None and n_heads % n_kv_heads:
        raise ConfigError(f"model.kwargs: n_heads={n_heads} is not a multiple of n_kv_heads={n_kv_heads}")
    if d_ff is None:
        d_ff = 4 * d_model if arch == "gpt2" else -(-(8 * d_model // 3) // 32) * 32
    sizes = {"d_model": d_model, "n_layers": n_layers, "n_heads": n_heads, "d_ff": d_ff,
             "max_len": max_len or 1024, "vocab_size": vocab_size,
             "n_kv_heads": n_kv_heads if n_kv_heads is not None else n_heads}
    tf = transformers_module()
    conf_cls = getattr(tf, conf_name)
    fields = {names[k]: v for k, v in sizes.items() if k in names}
    if tie is not None:
        fields["tie_word_embeddings"] = bool(tie)
    fields.update({k: dropout for k in _DROPOUT[arch]})
    # no special-token ids by default: the library's (GPT-2's 50256) lie outside a small vocabulary
    fields.update(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    fields.update(config)
    hf_conf = conf_cls(**fields)
    # the library keeps a keyword it does not know as a stray attribute: a misspelt one, named here
    known = conf_cls()
    wrong = [k for k in config if hasattr(hf_conf, k) and not hasattr(known, k)
             and k not in inspect.signature(conf_cls.__init__).parameters]
    if wrong:
        raise ConfigError(f"model.kwargs.{wrong[0]}: not a size ({', '.join(SIZES)}) nor a field of {conf_name}")
    hf_conf.use_cache = False
    return CausalLM(getattr(tf, model_name)(hf_conf))  # attention through SDPA, the library's default
