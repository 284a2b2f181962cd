"""`Dist.grad_sync` really switches DDP's and FSDP's gradient all-reduce off for non-final
micro-batches (a one-rank gloo group in this process)."""

import socket

import pytest
import torch
from torch import nn

from ecotrain.config import Config
from ecotrain.core.distributed import TorchDist


@pytest.fixture
def group(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(k, v)
    made = []

    def make(strategy):
        d = TorchDist(strategy, torch.device("cpu"), 60)
        made.append(d)
        return d
    yield make
    for d in made:
        d.shutdown()
    torch.distributed.destroy_process_group()


def test_ddp_no_sync_on_non_final_micro_batches(group):
    dist = group("ddp")
    model = dist.wrap(nn.Linear(4, 2), Config().distributed)
    with dist.grad_sync(model, last=False):
        assert model.require_backward_grad_sync is False
    assert model.require_backward_grad_sync is True
    with dist.grad_sync(model, last=True):
        assert model.require_backward_grad_sync is True


def test_fsdp_gradient_sync_off_on_non_final_micro_batches(group):
    dist = group("fsdp")
    model = dist.wrap(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)), Config().distributed)
    from torch.distributed.fsdp import FSDPModule

    def states():
        return [g.reduce_grads for m in model.modules() if isinstance(m, FSDPModule)
                for g in m._get_fsdp_state()._fsdp_param_groups]
    with dist.grad_sync(model, last=False):
        assert states() and not any(states())
    assert all(states())
