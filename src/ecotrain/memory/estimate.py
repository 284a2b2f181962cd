"""`ecotrain plan RECIPE`: the memory a run will need, before anything trains.

Parameters, gradients and optimizer state are counted exactly from the built model and the
optimizer's known state per parameter (Adam/AdamW: two moments; SGD with momentum: one).
Activations are *measured*, not modelled: saved-tensor hooks record every tensor autograd keeps
for backward during real forward passes (loss included, under the configured precision) of 1
and 2 of the longest training samples, attributed to the model's blocks; the bytes are then
extrapolated linearly to the configured micro-batch. With checkpointing, a checkpointed block
keeps its input and what its policy keeps (core/selective.py: attention outputs, or every matmul
output), plus, during backward, one block's recomputed activations at a time; an offloaded block
(core/offload.py) keeps what offload leaves (storages under MIN_BYTES), plus, during backward, one
block's restored activations at a time.
Not counted: transient buffers of single ops, gradients of activations, the allocator's slack
and the process's own footprint (the Python interpreter, torch's libraries).
On CUDA (or with `--measure`) the plan is also *measured*: a few real training steps of the config
as written in a fresh process (memory.measure.measure_config); `measured_report` says its peak and
the gap to the estimate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ecotrain.data import load_data
from ecotrain.core.levers import find_blocks, select_modules
from ecotrain.core.offload import MIN_BYTES
from ecotrain.core.selective import ATTENTION_OPS, MATMUL_OPS
from ecotrain.memory.planner import fmt_bytes
from ecotrain.models import build_model
from ecotrain.core.precision import Precision
from ecotrain.core.task import build_task


@dataclass
class Plan:
    params: int
    param_bytes: int
    grad_bytes: int
    optim_bytes: int
    act_bytes: float  # with the configured checkpointing
    act_bytes_off: float  # no checkpointing
    act_bytes_all: float  # every block checkpointed
    micro_batch: int
    n_checkpointed: int

    @property
    def total(self) -> float:
        return self.param_bytes + self.grad_bytes + self.optim_bytes + self.act_bytes


def optim_states(cfg) -> int:
    if cfg.optim.name in ("adam", "adamw") or ":" in cfg.optim.name:  # an import-path optimizer: assumed Adam-like
        return 2
    return 1 if cfg.optim.momentum > 0 else 0


def measure_saved(model: nn.Module, task, batch, precision, blocks: list[tuple[str, nn.Module]]) -> dict:
    """Bytes autograd saves for backward in one forward of `batch` (any structure the task reads): `outside` the blocks, per block
    `saved`, each block's `input` (what a checkpointed block keeps instead), the outputs of its
    `attention` and `matmul` ops (what the two checkpoint policies keep besides) and its `offloadable`
    saved storages (those of at least offload.MIN_BYTES)."""
    params = {p.data_ptr() for p in model.parameters()}
    seen: set[int] = set()
    where = {"name": None}
    out = {"outside": 0, "saved": {n: 0 for n, _ in blocks}, "input": {n: 0 for n, _ in blocks},
           "attention": {n: 0 for n, _ in blocks}, "matmul": {n: 0 for n, _ in blocks},
           "offloadable": {n: 0 for n, _ in blocks}}

    class KeptOutputs(TorchDispatchMode):  # what the checkpoint policies keep (core/selective.py)
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            if func in MATMUL_OPS and where["name"] is not None:
                n = sum(t.nelement() * t.element_size() for t in tree_leaves(result) if torch.is_tensor(t))
                out["matmul"][where["name"]] += n
                if func in ATTENTION_OPS:
                    out["attention"][where["name"]] += n
            return result

    def pack(t: torch.Tensor):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params and ptr not in seen:  # weights are not activations; views share storage
            seen.add(ptr)
            n = t.untyped_storage().nbytes()
            if where["name"] is None:
                out["outside"] += n
            else:
                out["saved"][where["name"]] += n
                out["offloadable"][where["name"]] += n if n >= MIN_BYTES else 0
        return t

    def enter(name):
        def hook(mod, args):
            where["name"] = name
            out["input"][name] += sum(a.nelement() * a.element_size() for a in args if torch.is_tensor(a))
        return hook

    def leave(mod, args, result):
        where["name"] = None

    handles = [h for n, m in blocks for h in (m.register_forward_pre_hook(enter(n)), m.register_forward_hook(leave))]
    try:
        model.train()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), KeptOutputs(), precision.autocast():
            loss = task.loss(task.forward(model, batch), batch)
        del loss
    finally:
        for h in handles:
            h.remove()
    return out


def _activations(m: dict, chosen: set[str], policy: str = "attention", offloaded=frozenset()) -> float:
    keeps = "attention" if policy == "attention" else "matmul"
    kept = m["outside"]
    for n, s in m["saved"].items():
        if n in chosen:
            kept += m["input"][n] + m[keeps][n]
        else:
            kept += s - m["offloadable"][n] if n in offloaded else s
    # during backward, one block at a time is recomputed (less what its policy kept) or read back
    recompute = max((m["saved"][n] - (m["matmul"][n] if policy == "matmuls" else 0) for n in chosen), default=0)
    restore = max((m["offloadable"][n] for n in offloaded), default=0)
    return kept + max(recompute, restore)


def saved_profile(bundle, model: nn.Module, task, precision, blocks) -> tuple[dict, dict]:
    """`measure_saved` of the 1 and the 2 longest training samples."""
    lengths = bundle.extra.get("lengths")
    order = torch.argsort(lengths, descending=True) if lengths is not None else torch.arange(len(bundle.train))
    return (measure_saved(model, task, bundle.train.take(order[:1]), precision, blocks),
            measure_saved(model, task, bundle.train.take(order[:2]), precision, blocks))


def activations_at(m1: dict, m2: dict, chosen: set[str], batch: int, policy: str = "attention",
                   offloaded=frozenset()) -> float:
    """Activation bytes at `batch` samples with the `chosen` blocks checkpointed under `policy` and the
    `offloaded` ones offloaded."""
    a1, a2 = _activations(m1, chosen, policy, offloaded), _activations(m2, chosen, policy, offloaded)
    return max(0.0, a1 + (a2 - a1) * (batch - 1))  # linear in the batch: intercept + slope * b


def make_plan(cfg) -> tuple[Plan, list[str]]:
    bundle = load_data(cfg)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, bundle.input_shape, bundle.num_classes)
    task = build_task(cfg, bundle.sample, lm=bundle.extra.get("task") == "lm")
    precision = Precision(cfg.precision, torch.device("cpu"))
    trainable = [p for p in model.parameters() if p.requires_grad]
    param_bytes = sum(p.nelement() * p.element_size() for p in model.parameters())
    grad_bytes = sum(p.nelement() * p.element_size() for p in trainable)
    optim_bytes = optim_states(cfg) * sum(p.nelement() * 4 for p in trainable)  # states are fp32

    blocks = find_blocks(model)
    chosen = {n for n, _ in select_modules(model, cfg.memory.activation_checkpointing)}
    for n, m in select_modules(model, cfg.memory.activation_checkpointing):
        if n not in {b for b, _ in blocks}:
            blocks.append((n, m))
    m1, m2 = saved_profile(bundle, model, task, precision, blocks)
    b = cfg.data.batch_size

    def at_batch(choice: set[str]) -> float:
        return activations_at(m1, m2, choice, b)

    plan = Plan(sum(p.nelement() for p in model.parameters()), param_bytes, grad_bytes, optim_bytes,
                at_batch(chosen), at_batch(set()), at_batch({n for n, _ in find_blocks(model)}), b, len(chosen))
    return plan, [n for n, _ in find_blocks(model)]


def _mb(n: float) -> str:
    return f"{n / 2**20:10.1f} MB"


def format_plan(cfg, plan: Plan, block_names: list[str]) -> str:
    ac = cfg.memory.activation_checkpointing
    ac_text = ac if isinstance(ac, str) else ac.model_dump()
    lines = [
        f"plan for {cfg.name}: model {cfg.model.name}, {plan.params / 1e6:.2f}M parameters, precision {cfg.precision}",
        f"micro-batch {plan.micro_batch} x accumulate {cfg.loop.accumulate} (effective batch "
        f"{plan.micro_batch * cfg.loop.accumulate}); activation checkpointing: {ac_text} "
        f"({plan.n_checkpointed} of {len(block_names)} blocks)",
        f"  parameters        {_mb(plan.param_bytes)}",
        f"  gradients         {_mb(plan.grad_bytes)}",
        f"  optimizer state   {_mb(plan.optim_bytes)}   ({cfg.optim.name}: {optim_states(cfg)} fp32 tensor(s) per parameter"
        f"{', assumed' if ':' in cfg.optim.name else ''})",
        f"  activations       {_mb(plan.act_bytes)}   (measured: saved tensors of real forwards of 1 and 2 samples,"
        f" x{plan.micro_batch} linearly)",
        f"  total             {_mb(plan.total)}   (plus the process itself: interpreter, libraries, data)",
    ]
    if block_names:
        lines.append(f"  activations with checkpointing off: {_mb(plan.act_bytes_off).strip()}; "
                     f"on every block: {_mb(plan.act_bytes_all).strip()}")
    levers = ["halve the activations: data.batch_size / 2 with loop.accumulate x 2 (same maths)"]
    if block_names and plan.act_bytes_all < plan.act_bytes:
        levers.append("memory.activation_checkpointing=all (~1.2-1.3x step time)")
    if cfg.precision == "fp32":
        levers.append("precision=bf16-mixed (activations mostly halve)")
    lines.append("levers: " + "; ".join(levers))
    return "\n".join(lines)


def measured_report(plan: Plan, out: Optional[dict], device: dict, steps: int,
                    error: str = "") -> tuple[list[str], Optional[str]]:
    """(the measured lines, the one line that says the plan does not fit or could not be measured, or
    None). `out` is the measuring worker's result (None when it failed with `error`), `device` its GPU."""
    where = (f"{device['gpu_name']} ({fmt_bytes(device['gpu_total_bytes'])})" if device.get("gpu_name")
             else "cpu")
    verdict = f"the plan does not fit: estimate {_mb(plan.total).strip()}, device total " + (
        fmt_bytes(device["gpu_total_bytes"]) if device.get("gpu_total_bytes") else "unknown")
    if out is None:
        if "out of memory" in error.lower():
            return [], f"plan: measuring {steps} training steps on {where} ran out of memory ({error}); {verdict}"
        return [], f"plan: measuring {steps} training steps on {where} failed: {error}"
    peak = out["peak_bytes"]
    if out["device_type"] == "cuda":
        lines = [f"  measured peak     {_mb(peak)}   (torch.cuda.max_memory_allocated, {steps} training steps "
                 f"in a fresh process on {where})",
                 f"  reserved          {_mb(out['reserved_bytes'])}   (max_memory_reserved: what the caching "
                 "allocator held, as nvidia-smi shows it less the CUDA context)"]
        why = "transient buffers, activation gradients, workspaces"
    else:
        lines = [f"  measured peak     {_mb(peak)}   (peak RSS of a fresh process, {steps} training steps on cpu: "
                 "includes the interpreter, torch's libraries and the data)"]
        why = "mostly the process itself"
    lines.append(f"  gap               {(peak - plan.total) / 2**20:+10.1f} MB   (measured / estimate "
                 f"{peak / plan.total:.2f}x{': ' + why if peak > plan.total else ''})")
    if out["oom_recoveries"]:
        return lines, (f"plan: the configured step ran out of memory on {where} and trained only once OOM "
                       f"recovery cut the batch into {out['micro_batches']} micro-batches; {verdict}")
    return lines, None
