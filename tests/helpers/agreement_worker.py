"""Run under torchrun (2 gloo ranks): `Agreement` and `broadcast_object` on a real process group.

Rank 1 alone requests "preempted" at step 3; every rank polls each step (some twice: polls are
idempotent within a step) and writes, as JSON, the step at which it saw the agreed flag, the
agreement steps it went through, and what `broadcast_object` gave it."""

import json
import os
import sys
import time

import torch

from ecotrain.core.distributed import TorchDist

out = sys.argv[1]
dist = TorchDist("ddp", torch.device("cpu"), 60)
agreement = dist.agreement()
seen, agreed_at = None, []
for step in range(1, 400):
    time.sleep(0.002 * (1 + dist.rank))  # ranks at different speeds: the schedule must not depend on it
    if step == 3 and dist.rank == 1:
        agreement.request("preempted")
    before = agreement.next_step
    flags = agreement.poll(step)
    assert agreement.poll(step) == flags  # a second poll in the same step: no second collective
    if agreement.next_step != before:
        agreed_at.append(step)
    if "preempted" in flags:
        seen = step
        break
picked = dist.broadcast_object({"run": f"picked-by-{dist.rank}"})
with open(f"{out}.{dist.rank}", "w") as f:
    json.dump({"seen": seen, "agreed_at": agreed_at, "picked": picked}, f)
dist.shutdown()
os._exit(0)
