"""Generation with transformers' KV cache on an eager model (export/generate.py's Stepper): the same tokens
as one pass over the window per token, greedy and sampled, across the point where the window slides;
and with the cache each new token is a pass over one token."""

import types

import pytest
import torch

from ecotrain.export.generate import Decoding, LanguageModel, continue_prompt

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def lm():
    from ecotrain.models.causal_lm import causal_lm

    torch.manual_seed(0)
    model = causal_lm("gpt2", vocab_size=50, max_len=24, d_model=32, n_layers=2, n_heads=4).eval()
    return LanguageModel(model, 24, 50, types.SimpleNamespace(eod=None), "tiny", cached=model.hf)


@pytest.mark.parametrize("how", [Decoding(max_new_tokens=30), Decoding(max_new_tokens=30, sample=True, seed=3)])
def test_the_cache_gives_the_same_tokens_as_the_window(lm, how):
    prompt = [5, 9, 13, 2, 7, 7, 1]  # 7 + 30 > 24: the window slides for the last 13 tokens
    with_cache = continue_prompt(lm, prompt, how)
    without = continue_prompt(lm, prompt, how, use_cache=False)
    assert with_cache == without
    assert with_cache["dropped"] == 7 + 30 - 1 - 24


def test_with_the_cache_each_new_token_is_one_position(lm):
    seen = []
    hook = lm.cached.register_forward_pre_hook(lambda m, args, kwargs: seen.append(kwargs["input_ids"].shape[1]),
                                               with_kwargs=True)
    try:
        continue_prompt(lm, [1, 2, 3, 4], Decoding(max_new_tokens=10))
    finally:
        hook.remove()
    assert seen == [4] + [1] * 9  # the prompt once, then the newest token alone


def test_a_model_without_a_cache_runs_as_before(lm):
    plain = LanguageModel(lm.fn, lm.context, lm.vocab, lm.tokenizer, "plain")
    assert continue_prompt(plain, [3, 4, 5], Decoding(max_new_tokens=8)) == \
        continue_prompt(lm, [3, 4, 5], Decoding(max_new_tokens=8))


@pytest.mark.parametrize("t", [5e-324, 1e-300, 1e300])
def test_extreme_temperatures_sample_without_nan(t):
    from ecotrain.export.generate import choose

    logits = torch.tensor([0.5, 3.0, -1.0, 2.9], dtype=torch.float64)
    how = Decoding(sample=True, temperature=t)
    picks = {choose(logits, how, torch.Generator().manual_seed(s)) for s in range(20)}
    assert picks <= {0, 1, 2, 3}
    if t < 1:
        assert picks == {1}  # the limit of a tiny temperature: greedy
