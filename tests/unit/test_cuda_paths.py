"""The CUDA paths' logic, checked on CPU: the GPU the ledger meters, fp16 clipping in lr-find, the
OOM retry freeing the failed graph, speech inputs on the model's device, replay's device check,
TF32's choice, a missing deterministic kernel."""

import math
import weakref

import pytest

import torch
from torch import nn

from ecotrain import fit
from ecotrain.accounting.energy import nvml_gpu_ids
from ecotrain.core.device import same_device
from ecotrain.speech.ctc import transcribe

CUDA, CUDA0, CUDA1 = torch.device("cuda"), torch.device("cuda:0"), torch.device("cuda:1")


# -- the ledger's GPU ---------------------------------------------------------------------------
def test_nvml_gpu_is_the_physical_gpu_of_the_device():
    assert nvml_gpu_ids(torch.device("cpu"), "0,1") is None
    assert nvml_gpu_ids(CUDA, None, current=3) == [3]  # plain cuda: the current device (torchrun's set_device)
    assert nvml_gpu_ids(CUDA1, None, current=0) == [1]
    assert nvml_gpu_ids(CUDA, "2,3", current=1) == [3]  # CUDA_VISIBLE_DEVICES: logical 1 is physical 3
    assert nvml_gpu_ids(CUDA0, " 5 , 7", current=1) == [5]
    assert nvml_gpu_ids(CUDA, "GPU-4e81,GPU-9a2c", current=1) == ["GPU-9a2c"]  # a UUID: CodeCarbon resolves it
    assert nvml_gpu_ids(CUDA, "", current=0) == [0]  # nothing to map through


# -- lr-find under fp16 ---------------------------------------------------------------------------
def test_lr_find_fp16_clips_unscaled_gradients(tiny_cfg, monkeypatch):
    from ecotrain.assembly.lrfind import range_test

    norms, clip = [], torch.nn.utils.clip_grad_norm_

    def recording(params, max_norm, *a, **k):
        norm = clip(params, max_norm, *a, **k)
        norms.append(float(norm))
        return norm

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", recording)
    cfg = tiny_cfg(**{"precision": "fp16-mixed", "loop.grad_clip": 1.0})
    result = range_test(cfg, steps=15, start=1e-4, end=1e-2)
    assert norms and all(math.isfinite(n) for n in norms)
    assert max(norms) < 100  # true gradients; scaled ones are ~65536 times larger
    assert all(math.isfinite(v) for v in result["losses"])


# -- OOM recovery on the plain fp32 step ----------------------------------------------------------
class _OOMInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)  # the graph holds x, as a real graph holds its activations
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")


class OOMOnceInBackward(nn.Module):
    """The first training step's backward raises an OOM; each later forward records whether an
    activation that the failed attempt's graph saved is still alive."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
        self.failed_output, self.alive_at_retry, self.calls = None, [], 0

    def forward(self, x):
        if not (self.training and torch.is_grad_enabled()):
            return self.net(x)
        self.calls += 1
        if self.failed_output is not None:
            self.alive_at_retry.append(self.failed_output() is not None)
        if self.calls == 1:
            h = self.net(x)
            self.failed_output = weakref.ref(h)  # torch keeps the Python object while the graph holds it
            return _OOMInBackward.apply(h)
        return self.net(x)


def test_oom_on_the_plain_step_frees_the_failed_graph_before_the_retry(tiny_cfg, tmp_path):
    model = OOMOnceInBackward()
    r = fit(tiny_cfg(**{"loop.max_steps": 3}), model=model, run_dir=tmp_path)
    assert r.summary["oom_recoveries"] == 1 and r.summary["micro_batches"] == 2  # once, not twice
    assert model.alive_at_retry and not any(model.alive_at_retry)  # the retry ran without the failed graph


# -- speech: inputs on the model's device --------------------------------------------------------
class _Source:
    def __len__(self):
        return 3

    def take(self, idx):
        return torch.zeros(len(idx), 8, 4), torch.full((len(idx), 3), 8, dtype=torch.long)


class _MetaModel(nn.Module):
    """Weights on the meta device; records the device its inputs arrive on."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1, device="meta"))
        self.seen = []

    def forward(self, x):
        self.seen.append(x.device)
        return torch.zeros(len(x), 8, 5)


def test_transcribe_sends_inputs_to_the_models_device():
    model = _MetaModel()
    transcribe(model, _Source(), batch_size=2)
    assert model.seen == [torch.device("meta")] * 2
    transcribe(model, _Source(), batch_size=4, device="cpu")  # an explicit device still wins
    assert model.seen[-1] == torch.device("cpu")


# -- replay's device check -------------------------------------------------------------------------
def test_same_device_treats_plain_cuda_as_the_current_device():
    assert CUDA0 != CUDA  # torch's own comparison: why a plain != copied the buffer every step
    assert same_device(CUDA0, CUDA, current=0) and same_device(CUDA, CUDA0, current=0)
    assert not same_device(CUDA0, CUDA, current=1) and same_device(CUDA1, CUDA, current=1)
    assert same_device(torch.device("cpu"), torch.device("cpu"))
    assert not same_device(torch.device("cpu"), CUDA) and not same_device(CUDA0, CUDA1)


def test_an_op_without_a_deterministic_kernel_is_one_line():
    """Under deterministic: true, torch raises (no longer only warns) for such an op; the run stops at the
    first step with one line naming the op and the two ways on."""
    from ecotrain.base.errors import ConfigError
    from ecotrain.core.seeding import deterministic_algorithms, nondeterministic_error

    msg = ("ctc_loss_backward_gpu does not have a deterministic implementation, but you set "
           "'torch.use_deterministic_algorithms(True)'. You can turn off determinism just for this operation, or "
           "you can use the 'warn_only=True' option, if that's acceptable for your application.")
    err = nondeterministic_error(RuntimeError(msg))
    assert isinstance(err, ConfigError) and "ctc_loss_backward_gpu has no deterministic kernel" in str(err)
    assert "deterministic: false" in str(err) and "\n" not in str(err)
    assert nondeterministic_error(RuntimeError("shape mismatch")) is None
    assert nondeterministic_error(ValueError(msg)) is None
    with deterministic_algorithms(True):  # raising, not warning (test_seeding.py checks every flag's restore)
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.is_deterministic_algorithms_warn_only_enabled()


def test_memory_peaks_off_cuda_and_combined_over_ranks():
    from ecotrain.core.device import combine_memory, memory_peaks

    mine = memory_peaks(torch.device("cpu"))
    assert mine["gpu_peak_allocated_bytes"] is None and mine["gpu_name"] is None
    big = torch.ones(64 * 2**20 // 4)  # 64 MiB touched: the peak RSS is at least that
    assert memory_peaks(torch.device("cpu"))["host_peak_rss_bytes"] >= mine["host_peak_rss_bytes"] >= big.nbytes
    gpu = {"host_peak_rss_bytes": 3 * 2**30, "gpu_peak_reserved_bytes": 9 * 2**30, "gpu_total_bytes": 80 * 2**30,
           "gpu_name": "NVIDIA H100"}
    ranks = [{**gpu, "gpu_peak_allocated_bytes": 5 * 2**30}, {**gpu, "gpu_peak_allocated_bytes": 7 * 2**30,
                                                              "host_peak_rss_bytes": 2 * 2**30}]
    both = combine_memory(ranks)
    assert both["gpu_peak_allocated_bytes"] == 7 * 2**30 and both["host_peak_rss_bytes"] == 3 * 2**30  # the largest
    assert [r["gpu_peak_allocated_bytes"] for r in both["per_rank"]] == [5 * 2**30, 7 * 2**30]
    assert both["gpu_name"] == "NVIDIA H100" and "per_rank" not in combine_memory(ranks[:1])


@pytest.mark.parametrize("setting,device,cap,precision,want", [
    ("auto", "cuda", (8, 0), "fp32", True),   # Ampere: TF32 units
    ("auto", "cuda", (9, 0), "fp32", True),   # Hopper
    ("auto", "cuda", (7, 5), "fp32", False),  # Turing: none
    ("auto", "cuda", (8, 0), "bf16-mixed", False),  # autocast already reduces the matmuls
    ("auto", "cpu", None, "fp32", False),
    ("on", "cuda", (7, 0), "fp32", True), ("off", "cuda", (9, 0), "fp32", False), ("on", "cpu", None, "fp32", False)])
def test_tf32_decision(setting, device, cap, precision, want):
    from ecotrain.core.precision import use_tf32

    assert use_tf32(setting, device, cap, precision) is want


def test_tf32_flags_untouched_off_cuda():
    from ecotrain.core.precision import tf32

    before = torch.backends.cuda.matmul.allow_tf32
    with tf32("on", torch.device("cpu"), "fp32") as on:
        assert on is False and torch.backends.cuda.matmul.allow_tf32 == before


class CublasAllocFailsOnce(nn.Module):
    """The first training forward fails the way cuBLAS reports a failed workspace allocation: a plain
    RuntimeError, not torch.OutOfMemoryError."""

    def __init__(self, message: str):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
        self.message, self.calls = message, 0

    def forward(self, x):
        if self.training and torch.is_grad_enabled():
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError(self.message)
        return self.net(x)


def test_cublas_and_cudnn_allocation_failures_are_recovered_as_oom(tiny_cfg, tmp_path):
    from ecotrain.core.levers import is_oom

    msg = "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
    r = fit(tiny_cfg(**{"loop.max_steps": 3}), model=CublasAllocFailsOnce(msg), run_dir=tmp_path / "a")
    assert r.summary["oom_recoveries"] == 1 and r.summary["micro_batches"] == 2
    assert is_oom(RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED")) and not is_oom(RuntimeError("shape"))
    with pytest.raises(RuntimeError, match="mat1 and mat2"):  # any other RuntimeError is not retried
        fit(tiny_cfg(**{"loop.max_steps": 3}), model=CublasAllocFailsOnce("mat1 and mat2 shapes cannot be"),
            run_dir=tmp_path / "b")
