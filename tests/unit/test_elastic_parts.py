"""The parts behind elastic restarts, resizes and spot notices, in-process: the micro-batch count per
world size, the steps an interrupted segment trained past its checkpoint, the per-attempt store, the
notice watcher on a real file and a real HTTP endpoint."""

import http.server
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as td

from ecotrain.config import build_config
from ecotrain.core.distributed import attempt_store, micro_batches_for
from ecotrain.base.errors import ConfigError
from ecotrain.core.preemption import Preemption, _url_says_preempted
from ecotrain.core.resume import steps_past


def cfg(**loop):
    return build_config({"data": {"name": "digits", "batch_size": 64}, "loop": {"max_steps": 10, **loop}})


def test_micro_batches_follow_the_world_size_for_one_global_batch():
    assert micro_batches_for(cfg(), 2) is None  # not set: the config's accumulate
    assert [micro_batches_for(cfg(micro_batch_size=16), w) for w in (1, 2, 4)] == [4, 2, 1]
    assert micro_batches_for(cfg(micro_batch_size=16, accumulate=2), 2) == 4  # the step is 64 x 2 samples
    with pytest.raises(ConfigError, match=r"loop.micro_batch_size: 24 does not divide a rank's share of the step "
                                          r"\(64 samples over 2 ranks = 32\); choose a size that divides 32"):
        micro_batches_for(cfg(micro_batch_size=24), 2)


def test_steps_past_reads_the_lines_after_the_checkpoint_offset(tmp_path):
    m = tmp_path / "metrics.jsonl"
    kept = '{"step": 4, "loss": 1.0}\n{"step": 8, "loss": 0.9}\n'
    m.write_text(kept + '{"step": 9, "loss": 0.8}\n{"step": 11, "val_loss": 0.7}\n{"step": 12, "lo')  # cut by the kill
    assert steps_past(m, len(kept), 8) == 3
    assert steps_past(m, len(m.read_text()), 8) == 0  # nothing after the offset
    assert steps_past(m, None, 8) == 0 and steps_past(tmp_path / "absent.jsonl", 0, 8) == 0


def test_each_restart_attempt_has_its_own_keys_in_the_shared_store(monkeypatch):
    server = td.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.port), "GROUP_WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    assert attempt_store(td, 0, 1, timedelta(seconds=5)) == {}  # plain torchrun: torch's own store
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    stores = []
    for attempt in ("0", "1"):
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", attempt)
        kw = attempt_store(td, 0, 1, timedelta(seconds=5))
        assert kw["rank"] == 0 and kw["world_size"] == 1
        stores.append(kw["store"])
    stores[0].set("rank_0", "old address")
    stores[1].set("rank_0", "new address")
    assert stores[0].get("rank_0") == b"old address" and stores[1].get("rank_0") == b"new address"
    assert server.get("ecotrain/attempt-1/rank_0") == b"new address"
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")  # several agents: their restart counts may differ
    assert attempt_store(td, 0, 1, timedelta(seconds=5)) == {}


def wait_for(p: Preemption, seconds=5.0):
    end = time.monotonic() + seconds
    while p.requested is None and time.monotonic() < end:
        time.sleep(0.01)
    return p.requested


def test_the_watcher_sees_a_new_notice_file_and_not_an_old_one(tmp_path):
    notice = tmp_path / "NOTICE"
    watch = build_config({"preemption": {"notice_file": str(notice), "poll_seconds": 0.02}}).preemption
    p = Preemption()
    p.watch(watch)
    time.sleep(0.1)
    assert p.requested is None
    notice.write_text("x")
    assert wait_for(p) == f"preemption notice file {notice}" and p.noticed_at is not None
    p.stop_watching()
    q = Preemption()  # the next start: the file is still there
    q.watch(watch)
    time.sleep(0.15)
    assert q.requested is None
    time.sleep(0.01)
    notice.write_text("written again")
    assert wait_for(q) is not None
    q.stop_watching()


class Endpoint(http.server.BaseHTTPRequestHandler):
    answers: dict = {}

    def do_GET(self):
        code, body = self.answers[self.path]
        self.send_response(code)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_an_endpoint_is_a_notice_only_when_it_answers_200_with_a_body():
    Endpoint.answers = {"/aws": (404, b"Not Found"), "/gcp-false": (200, b"FALSE\n"), "/gcp-true": (200, b"TRUE"),
                        "/aws-action": (200, b'{"action": "terminate", "time": "2026-12-03T18:00:00Z"}'),
                        "/empty": (200, b"")}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Endpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        said = {path: _url_says_preempted(base + path, 2.0) for path in Endpoint.answers}
    finally:
        server.shutdown()
    assert said == {"/aws": False, "/gcp-false": False, "/gcp-true": True, "/aws-action": True, "/empty": False}
    assert _url_says_preempted("http://127.0.0.1:1/unreachable", 0.5) is False


def test_augmentation_draws_for_the_global_batch_so_every_world_size_augments_alike():
    import torch

    from ecotrain.config import AugmentConfig
    from ecotrain.data.augment import SignalAugment

    aug = AugmentConfig(shift=3, scale=0.1, noise=0.05)
    x = torch.randn(8, 1, 40)
    whole = SignalAugment(aug, 5)(x)
    ranks = [SignalAugment(aug, 5, rank, 2)(x[rank * 4:(rank + 1) * 4]) for rank in (0, 1)]
    assert torch.equal(torch.cat(ranks), whole)
    assert not torch.equal(ranks[0] - x[:4], ranks[1] - x[4:])  # the two ranks' items get their own draws
    four = [SignalAugment(aug, 5, rank, 4)(x[rank * 2:(rank + 1) * 2]) for rank in range(4)]
    assert torch.equal(torch.cat(four), whole)


def test_pinned_batches_only_for_cuda_and_on_by_default_there():
    import torch

    from ecotrain.data.loader import pins

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert build_config({}).data.pin_memory == "auto"
    assert pins("auto", cuda) and pins(True, cuda) and not pins(False, cuda)
    assert not pins("auto", cpu) and not pins(True, cpu)  # pinning needs a CUDA driver


def test_a_checkpoint_from_before_a_new_config_section_is_not_a_changed_config():
    from ecotrain.config import diff_configs
    from ecotrain.core.resume import with_defaults

    now = build_config({"data": {"name": "digits"}, "loop": {"max_steps": 5}}).to_dict()
    older = {k: v for k, v in now.items() if k != "preemption"}  # saved by a version without the section
    older["loop"] = {k: v for k, v in older["loop"].items() if k != "micro_batch_size"}
    assert diff_configs(older, now)  # compared raw, the new defaults look like changes
    assert diff_configs(with_defaults(older), now) == []
    changed = {**older, "seed": 7}
    assert diff_configs(with_defaults(changed), now) == ["seed: 7 -> 0"]
    assert with_defaults({"loop": "not a section"}) == {"loop": "not a section"}  # no longer valid: as saved
