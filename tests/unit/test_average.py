"""methods.average: the final weights are alpha * trained + (1 - alpha) * previous. The pure
function bit for bit in float64; real runs: the saved model and the test figures are the averaged
one, alpha auto chooses on the val split only, the refusals are one line, a resume is exact."""

import json
import logging

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ecotrain import fit
from ecotrain.base.errors import CheckpointError, ConfigError
from ecotrain.methods.average import average_weights
from tests.unit.test_methods import SigtermAt


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int64) if t.dtype == torch.float64 else t


def _bn_net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4), nn.Linear(4, 3)).double()
    net(torch.randn(8, 5, dtype=torch.double))  # running statistics and num_batches_tracked move
    return net


def test_alpha_one_and_zero_are_bit_exact_and_a_half_is_the_midpoint():
    new, old = _bn_net(0).state_dict(), _bn_net(1).state_dict()
    new["0.bias"][0], old["0.bias"][0] = -0.0, 0.0  # 0 * new + 1 * old would turn this -0.0 into 0.0
    new["1.num_batches_tracked"].fill_(7)
    one, zero, half = (average_weights(new, old, a) for a in (1.0, 0.0, 0.5))
    for k in new:
        assert torch.equal(_bits(one[k]), _bits(new[k])), k
        assert one[k].dtype == new[k].dtype and one[k].data_ptr() != new[k].data_ptr()  # a copy, not the tensor
        if new[k].is_floating_point():
            assert torch.equal(_bits(zero[k]), _bits(old[k])), k
            assert torch.equal(half[k], (new[k] + old[k]) / 2), k  # exact in float64
            assert half[k].dtype == torch.float64
        else:  # BatchNorm's step count is the trained model's, whatever alpha
            assert zero[k].item() == half[k].item() == 7
    q = average_weights(new, old, 0.25)["2.weight"]
    torch.testing.assert_close(q, 0.25 * new["2.weight"] + 0.75 * old["2.weight"], rtol=0, atol=1e-15)


def test_other_float_dtypes_are_mixed_in_float32_and_keep_their_dtype():
    new = {"w": torch.tensor([1.0, 2.0], dtype=torch.bfloat16)}
    old = {"w": torch.tensor([3.0, 6.0])}  # a float32 file beside a bf16 model
    out = average_weights(new, old, 0.5)["w"]
    assert out.dtype == torch.bfloat16 and out.tolist() == [2.0, 4.0]


@pytest.mark.parametrize("old, words", [
    ({"a": torch.zeros(2)}, r"^where: the previous weights has no 'b' \(1 keys differ\); average a model with the same"),
    ({"a": torch.zeros(2), "b": torch.zeros(3), "c": torch.zeros(1)}, r"has 'c', which the model has not"),
    ({"a": torch.zeros(2), "b": torch.zeros(4)}, r"^where: 'b' has shape \(3,\) here but \(4,\) in the previous weights"),
])
def test_keys_and_shapes_must_match_in_one_line(old, words):
    new = {"a": torch.ones(2), "b": torch.ones(3)}
    with pytest.raises(ConfigError, match=words):
        average_weights(new, old, 0.5, where="where")


@pytest.mark.parametrize("alpha", [-0.01, 1.01])
def test_alpha_outside_zero_one_is_refused(alpha, tiny_cfg):
    with pytest.raises(ConfigError, match=r"alpha .* is outside \[0, 1\]"):
        average_weights({"a": torch.ones(1)}, {"a": torch.ones(1)}, alpha)
    with pytest.raises(Exception, match=r"alpha .* is outside \[0, 1\]"):
        tiny_cfg(methods=[{"name": "average", "alpha": alpha}])
    with pytest.raises(Exception, match=r"grid value .* is outside \[0, 1\]"):
        tiny_cfg(methods=[{"name": "average", "alpha": "auto", "grid": [0.5, alpha]}])


# -- real runs ------------------------------------------------------------------------------------
def _cfg(tiny_cfg, methods, steps=8, **over):
    return tiny_cfg(**{"methods": methods, "loop.max_steps": steps, "loop.eval_every": steps, "ledger.enabled": False,
                       **over})


@pytest.fixture
def v0(tiny_cfg, tmp_path):
    """The deployed model: a short first run."""
    fit(_cfg(tiny_cfg, [], steps=10), run_dir=tmp_path / "v0", quiet=True)
    return tmp_path / "v0"


def test_the_saved_model_and_test_figures_are_the_average(tiny_cfg, tmp_path, v0):
    plain = fit(_cfg(tiny_cfg, []), run_dir=tmp_path / "plain", init_from=v0, quiet=True)
    avg = fit(_cfg(tiny_cfg, [{"name": "average", "alpha": 0.5}]), run_dir=tmp_path / "avg", init_from=v0, quiet=True)
    trained, prev = load_file(tmp_path / "plain" / "model.safetensors"), load_file(v0 / "model.safetensors")
    saved = load_file(tmp_path / "avg" / "model.safetensors")
    want = average_weights(trained, prev, 0.5)
    assert saved.keys() == want.keys() and all(torch.equal(saved[k], want[k]) for k in want)
    assert any(not torch.equal(saved[k], trained[k]) for k in saved)
    assert avg.summary["methods"]["average"] == {"with": "previous", "alpha": 0.5}
    assert avg.summary["test_loss"] != plain.summary["test_loss"]  # the test ran on the averaged weights
    assert avg.summary["steps"] == plain.summary["steps"]  # training itself is untouched


def test_alpha_auto_chooses_on_val_and_records_every_candidate(tiny_cfg, tmp_path, v0, caplog):
    cfg = _cfg(tiny_cfg, [{"name": "average", "alpha": "auto", "grid": [0.0, 0.5, 1.0]}])
    with caplog.at_level(logging.INFO, logger="ecotrain.methods.average"):
        r = fit(cfg, run_dir=tmp_path / "auto", init_from=v0, quiet=True)
    rep = r.summary["methods"]["average"]
    assert rep["chosen_by"] == "val_loss" and set(rep["candidates"]) == {"0.0", "0.5", "1.0"}
    assert rep["alpha"] == min([0.0, 0.5, 1.0], key=lambda a: rep["candidates"][str(a)])
    assert r.summary["val_loss"] == pytest.approx(rep["candidates"][str(rep["alpha"])], rel=1e-9)  # final = chosen
    line = [m for m in caplog.messages if m.startswith("average: alpha")]
    assert len(line) == 1 and "chosen by val_loss on the val split (0.0: " in line[0]
    assert json.loads((tmp_path / "auto" / "summary.json").read_text())["methods"]["average"] == rep


def test_with_a_weights_file_and_a_run_folder(tiny_cfg, tmp_path, v0):
    r = fit(_cfg(tiny_cfg, [{"name": "average", "with": str(v0), "alpha": 0.0}]), run_dir=tmp_path / "a", quiet=True)
    prev, saved = load_file(v0 / "model.safetensors"), load_file(tmp_path / "a" / "model.safetensors")
    assert all(torch.equal(saved[k], prev[k]) for k in prev)  # alpha 0: exactly the named weights
    assert r.summary["methods"]["average"]["with"] == str(v0 / "model.safetensors")


def test_refusals_are_one_line_before_training(tiny_cfg, tmp_path, v0):
    with pytest.raises(ConfigError, match=r"^methods: 'average' needs the weights the run starts from \(fit's "
                                          r"init_from, --init-from: the deployed model\) and this run starts from none$"):
        fit(_cfg(tiny_cfg, [{"name": "average"}]), run_dir=tmp_path / "none")
    assert not (tmp_path / "none").exists()
    with pytest.raises(ConfigError, match=r"^methods.average.with: .*nope not found; give the previous run folder or its model.safetensors$"):
        fit(_cfg(tiny_cfg, [{"name": "average", "with": str(tmp_path / "nope")}]), run_dir=tmp_path / "n2")
    other = tmp_path / "other.safetensors"
    save_file({k: torch.zeros(3) for k in load_file(v0 / "model.safetensors")}, str(other))
    with pytest.raises(ConfigError, match=r"^methods.average.with: .*other.safetensors: '.*' has shape .* here but "
                                          r"\(3,\) in the previous weights"):
        fit(_cfg(tiny_cfg, [{"name": "average", "with": str(other)}]), run_dir=tmp_path / "shape", quiet=True)
    with pytest.raises(ConfigError, match=r"^methods: 'average' chooses on the validation split and this run has none"):
        fit(_cfg(tiny_cfg, [{"name": "average", "alpha": "auto"}], **{"data.val_split": 0.0}),
            run_dir=tmp_path / "noval", init_from=v0)
    assert not (tmp_path / "noval").exists()


def test_resume_is_exact_and_keeps_the_starting_weights(tiny_cfg, tmp_path, v0):
    cfg = _cfg(tiny_cfg, [{"name": "average", "alpha": 0.25}], steps=12, **{"checkpoint.every_n_steps": 4})
    fit(cfg, run_dir=tmp_path / "full", init_from=v0, quiet=True)
    cut = fit(cfg, run_dir=tmp_path / "cut", init_from=v0, quiet=True, callbacks=[SigtermAt(6)])
    assert cut.summary["stopped_because"] == "preempted"
    fit(cfg, run_dir=tmp_path / "cut", resume=cut.state.last_checkpoint, quiet=True)  # no init_from: the checkpoint has it
    a, b = load_file(tmp_path / "full" / "model.safetensors"), load_file(tmp_path / "cut" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resume_refuses_a_with_file_that_changed(tiny_cfg, tmp_path, v0):
    from ecotrain.methods.average import Average

    f = tmp_path / "w.safetensors"
    save_file(load_file(v0 / "model.safetensors"), str(f))
    cfg = _cfg(tiny_cfg, [{"name": "average", "with": str(f)}])
    sd = Average(cfg.methods[0], cfg).state_dict()
    Average(cfg.methods[0], cfg).load_state_dict(sd)
    save_file({k: v + 1 for k, v in load_file(f).items()}, str(f))
    with pytest.raises(CheckpointError, match=r"^methods.average.with: .*w.safetensors changed since the run started"):
        Average(cfg.methods[0], cfg).load_state_dict(sd)
    prev = _cfg(tiny_cfg, [{"name": "average"}])
    with pytest.raises(CheckpointError, match=r"^methods.average: the checkpoint holds no starting weights"):
        Average(prev.methods[0], prev).load_state_dict(sd)
