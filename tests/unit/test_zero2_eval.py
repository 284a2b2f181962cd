"""ZeRO-2 evaluation gathers the parameters once per pass (`distributed.one_gather`), not once per
batch, and leaves them sharded at the pass's end. Sharding after every no-grad forward made each
evaluation batch gather the whole model again (a 34M-parameter MLP on 2 gloo ranks: ~40 s of
evaluation for 3 training steps). Under FSDP2 a module's parameters are DTensors while sharded and
plain tensors while gathered, which is what the child process prints. A real process group (gloo,
one rank) in a child process, so this worker's process stays without one."""

import os
import subprocess
import sys

from ecotrain.memory.shard import free_port

CHILD = """
import types, torch
from torch import nn
from torch.distributed.tensor import DTensor
from ecotrain.core.distributed import TorchDist, one_gather

d = TorchDist("fsdp", torch.device("cpu"), 60)
zero2 = types.SimpleNamespace(fsdp=types.SimpleNamespace(reshard_after_forward=False, cpu_offload=False))
model = d.wrap(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), zero2)
x = torch.randn(5, 4)
sharded = lambda: isinstance(model[0].weight, DTensor)
seen = [sharded()]
with torch.no_grad():
    model(x)
    seen.append(sharded())  # a lone no-grad forward shards again at once
    with one_gather(model):
        model(x)
        model(x)
        seen.append(sharded())  # within a pass: still gathered after its batches
    seen.append(sharded())  # sharded once at the pass's end
model(x).sum().backward()
seen.append(sharded())
print("SEEN", seen)
"""


def test_a_zero2_pass_gathers_once_and_ends_sharded():
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "SEEN [True, True, False, True, True]" in r.stdout
