"""Adapters (PEFT LoRA): only the adapters train, the backbone is unchanged, the adapter is written
in PEFT's format that PEFT itself loads, merging gives a plain model with the same outputs."""

import sys

import pytest
import torch
from safetensors.torch import load_file

from ecotrain import fit
from ecotrain.base.errors import ConfigError

pytest.importorskip("peft")


def _cfg(tiny_cfg, **m):
    return tiny_cfg(**{"methods": [{"name": "adapters", "target_modules": ["net.0", "net.3"], "r": 4, **m}],
                       "loop.max_steps": 10, "loop.eval_every": 10, "ledger.enabled": False})


def test_only_adapters_train_and_peft_loads_the_saved_adapter(tiny_cfg, tmp_path):
    from peft import PeftModel

    from ecotrain.methods.adapters import load_adapter
    from ecotrain.models import build_model

    base = fit(tiny_cfg(**{"loop.max_steps": 4, "loop.eval_every": 4, "ledger.enabled": False}),
               run_dir=tmp_path / "v0", quiet=True)
    before = load_file(tmp_path / "v0" / "model.safetensors")
    r = fit(_cfg(tiny_cfg), run_dir=tmp_path / "v1", init_from=tmp_path / "v0", quiet=True)
    after = load_file(tmp_path / "v1" / "model.safetensors")
    trainable = [n for n, p in r.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    for k, v in before.items():  # the backbone did not move
        assert torch.equal(after.get(k, after.get(k.replace("weight", "base_layer.weight").replace(
            "bias", "base_layer.bias"))), v), k
    assert any(float(v.abs().sum()) > 0 for k, v in after.items() if "lora_B" in k)  # the adapter did
    adapter = tmp_path / "v1" / "adapter"
    assert {p.name for p in adapter.iterdir()} == {"adapter_model.safetensors", "adapter_config.json"}
    x = torch.randn(5, 64)
    r.model.eval()
    expected = r.model(x)

    def plain():
        m = build_model(base.state.config.model, (64,), 10)
        m.load_state_dict(before)
        return m.eval()
    by_peft = PeftModel.from_pretrained(plain(), str(adapter)).eval()  # PEFT's own loader
    torch.testing.assert_close(by_peft(x), expected)
    torch.testing.assert_close(load_adapter(plain(), adapter).eval()(x), expected)


def test_merge_writes_a_plain_model_with_the_same_outputs(tiny_cfg, tmp_path):
    from ecotrain.models import build_model

    r = fit(_cfg(tiny_cfg, merge=True), run_dir=tmp_path / "m", quiet=True)
    merged = load_file(tmp_path / "m" / "model.safetensors")
    assert not any("lora_" in k or "base_layer" in k for k in merged)
    plain = build_model(r.state.config.model, (64,), 10)
    plain.load_state_dict(merged)
    x = torch.randn(5, 64)
    torch.testing.assert_close(plain.eval()(x), r.model.eval()(x))
    assert (tmp_path / "m" / "adapter" / "adapter_model.safetensors").is_file()


def test_bad_target_and_missing_peft_are_one_line(tiny_cfg, tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="methods.adapters.target_modules: .*net.0"):
        fit(_cfg(tiny_cfg, target_modules=["nope"]), run_dir=tmp_path / "a")
    monkeypatch.setitem(sys.modules, "peft", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"^methods.adapters needs PEFT: pip install 'ecotrain\[adapters\]'$"):
        fit(_cfg(tiny_cfg), run_dir=tmp_path / "b")
