"""A spot machine's notice without a signal: a file that appears, an endpoint that starts answering.
The run checkpoints, exits 75 and says how long the notice took to become a complete checkpoint; a
notice file left from before is not taken for a new one when the run resumes."""

import http.server
import json
import threading
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_cli as ecotrain

BASE = {
    "name": "notice", "seed": 0,
    "data": {"name": "digits", "batch_size": 64, "val_split": 0.15},
    "model": {"name": "mlp", "kwargs": {"hidden": [16]}},
    "loop": {"max_steps": 3000, "max_epochs": None, "log_every": 100, "eval_every": 1000},
    "checkpoint": {"every_minutes": None, "at_end": True},
    "logging": {"progress": "off"},
}


def recipe(tmp_path, **preemption):
    marker = tmp_path / "touched"
    tree = {**BASE, "preemption": {"poll_seconds": 0.05, **preemption},
            "callbacks": [{"path": "tests.helpers.killer:TouchAt", "kwargs": {"step": 20, "path": str(marker)}}]}
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump(tree))
    return p


def check_preempted(r, run):
    assert r.returncode == 75, r.stderr[-2000:]
    ckpts = sorted((run / "checkpoints").iterdir())
    assert len(ckpts) == 1 and int(ckpts[0].name.split("-")[1]) >= 20, ckpts
    assert not (run / "summary.json").exists()
    line = next(x for x in r.stdout.splitlines() if x.startswith("preempted at step"))
    seconds = float(line.split("(")[1].split(" s after the notice")[0])
    assert 0 <= seconds < 25  # within the default grace
    assert "preemption: checkpoint" in r.stderr and "(grace 25 s)" in r.stderr


def test_a_notice_file_stops_the_run_and_an_old_one_is_not_a_new_notice(tmp_path):
    rec, run = recipe(tmp_path, notice_file=str(tmp_path / "touched")), tmp_path / "run"
    r = ecotrain("fit", rec, "--run-dir", run)
    check_preempted(r, run)
    assert "preemption notice file" in r.stderr
    r = ecotrain("resume", run)  # the file is still there: the resumed run trains to its end
    assert r.returncode == 0, r.stderr[-2000:]
    assert "exists from before this start; ignored" in r.stderr
    s = json.loads((run / "summary.json").read_text())
    assert s["steps"] == 3000 and s["resumes"] == 1


class Metadata(http.server.BaseHTTPRequestHandler):
    """GCP's `instance/preempted`: 200 FALSE until the notice, then 200 TRUE."""
    marker: Path

    def do_GET(self):
        body = b"TRUE" if self.marker.exists() else b"FALSE"
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def metadata_server(tmp_path):
    Metadata.marker = tmp_path / "touched"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/computeMetadata/v1/instance/preempted"
    server.shutdown()


def test_a_metadata_endpoint_that_says_true_stops_the_run(tmp_path, metadata_server):
    rec, run = recipe(tmp_path, notice_url=metadata_server), tmp_path / "run"
    r = ecotrain("fit", rec, "--run-dir", run)
    check_preempted(r, run)
    assert "preemption notice from http://127.0.0.1" in r.stderr


def test_a_notice_url_that_is_not_http_is_one_line(tmp_path):
    r = ecotrain("fit", recipe(tmp_path, notice_url="metadata.google.internal/x"), "--run-dir", tmp_path / "run")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "preemption.notice_url" in r.stderr and "not an http:// or https:// address" in r.stderr


@pytest.mark.parametrize("kind", ["garbage", "200_headers"])
def test_a_notice_endpoint_that_answers_no_http_is_one_warning_and_the_run_trains_on(tmp_path, kind):
    """http.client's BadStatusLine / 'got more than 100 headers' ended the poll thread with a traceback
    (issue 44); now: one warning, however many polls, and the run trains to its end."""
    from tests.helpers.raw_server import ANSWERS, answering

    with answering(ANSWERS[kind]) as (server, url):
        r = ecotrain("fit", recipe(tmp_path, notice_url=url), "--run-dir", tmp_path / "run", "loop.max_steps=300",
                     timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert server.hits >= 3  # polled on after the first bad answer
    assert "Traceback" not in r.stderr and "Exception in thread" not in r.stderr, r.stderr[-2000:]
    warned = [line for line in r.stderr.splitlines() if "preemption.notice_url" in line]
    assert len(warned) == 1 and warned[0].startswith(f"ecotrain: warning: preemption.notice_url {url}: the answer "
                                                     "is not HTTP ("), r.stderr[-2000:]


def test_a_poll_interval_past_an_hour_is_one_line(tmp_path):
    r = ecotrain("fit", recipe(tmp_path, notice_url="http://127.0.0.1:1/", poll_seconds=1e10), "--run-dir",
                 tmp_path / "run")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "preemption.poll_seconds" in r.stderr and "at most 3600 seconds" in r.stderr
    assert not (tmp_path / "run").exists()
