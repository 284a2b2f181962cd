"""Stop requests that one rank alone sees are acted on by every rank at the same step, at agreement
steps instead of a collective per step (distributed.Agreement); `broadcast_object` gives rank 0's
object to every rank. Real torchrun, 2 gloo ranks."""

import json
import sys

from tests.distributed.test_torchrun import ROOT, free_port, run_group


def test_a_request_on_one_rank_is_agreed_at_one_step_on_every_rank(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), str(ROOT / "tests" / "helpers" / "agreement_worker.py"), str(out)]
    r = run_group(cmd, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"out.{k}").read_text()) for k in (0, 1)]
    assert ranks[0]["agreed_at"] == ranks[1]["agreed_at"]  # the same schedule, though the ranks run at different speeds
    assert ranks[0]["seen"] == ranks[1]["seen"] is not None and ranks[0]["seen"] >= 3
    assert ranks[0]["agreed_at"][0] == 1  # the first poll agrees
    assert [x["picked"] for x in ranks] == [{"run": "picked-by-0"}] * 2
