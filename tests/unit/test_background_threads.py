"""Background threads report through one boundary (log.background): a failure is one warning line, never
a traceback from the thread. The preemption notice watch says a misbehaving endpoint once and polls on;
its interval is bounded in the config (issue 44)."""

import threading
import time

import pytest

from ecotrain.config import build_config
from ecotrain.base.errors import ConfigError
from ecotrain.base.log import background
from ecotrain.core.preemption import Preemption
from tests.helpers.raw_server import ANSWERS, answering


def said(caplog) -> list[str]:
    """The messages logged, each once (the fixture's handler may sit on the root logger too)."""
    return [r.getMessage() for r in {id(r): r for r in caplog.records}.values()]


def test_a_failing_thread_body_is_one_warning_and_no_traceback(ecotrain_log, capfd):
    def body():
        raise RuntimeError("the endpoint said\nsomething on two lines")

    background("test-thread", "the test watch", body, "the run goes on").join(5)
    assert said(ecotrain_log) == ["the test watch stopped: RuntimeError: the endpoint said something on two lines; "
                      "the run goes on"]
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception in thread" not in err


@pytest.mark.parametrize("kind", list(ANSWERS))
def test_a_notice_endpoint_that_answers_no_http_is_said_once_and_polled_on(kind, ecotrain_log, capfd):
    with answering(ANSWERS[kind]) as (server, url):
        p = Preemption()
        p.watch(build_config({"preemption": {"notice_url": url, "poll_seconds": 0.02}}).preemption)
        end = time.monotonic() + 10
        while server.hits < 6 and time.monotonic() < end:
            time.sleep(0.02)
        p.stop_watching()
    assert server.hits >= 6  # polling went on after the first bad answer
    assert p.requested is None  # a body of TRUE after broken headers is no notice
    warned = said(ecotrain_log)
    assert len(warned) == 1, warned
    assert warned[0].startswith(f"preemption.notice_url {url}: the answer is not HTTP (") and \
        warned[0].endswith("; polling goes on, and SIGTERM still stops the run with a checkpoint"), warned[0]
    assert len(warned[0]) < 500 and "\n" not in warned[0]
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception in thread" not in err


def test_a_poll_interval_past_an_hour_is_refused_in_one_line():
    """1e10 s overflowed the thread's wait (OverflowError: timestamp out of range, a traceback)."""
    with pytest.raises(ConfigError) as exc:
        build_config({"preemption": {"notice_url": "http://127.0.0.1:1/", "poll_seconds": 1e10}})
    msg = str(exc.value)
    assert "preemption.poll_seconds" in msg and "at most 3600 seconds" in msg and "poll every few seconds" in msg
    assert "\n" not in msg
    assert build_config({"preemption": {"poll_seconds": 3600}}).preemption.poll_seconds == 3600


def test_the_watch_threads_are_gone_after_stop():
    before = {t.name for t in threading.enumerate()}
    with answering(ANSWERS["garbage"]) as (_, url):
        p = Preemption()
        p.watch(build_config({"preemption": {"notice_url": url, "poll_seconds": 0.02}}).preemption)
        time.sleep(0.1)
        p.stop_watching()
        time.sleep(0.1)
    assert "ecotrain-preemption-notice" not in {t.name for t in threading.enumerate()} - before
