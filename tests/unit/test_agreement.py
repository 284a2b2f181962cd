"""distributed.Agreement: stop requests agreed on a schedule every rank computes alike (one small
all-reduce every AGREE_SECONDS of training, 1 to AGREE_MAX_STEPS steps apart), never per step.
The 2-rank case on a real process group: tests/distributed/test_agreement.py."""

import pytest

from ecotrain.core import distributed
from ecotrain.core.distributed import AGREE_MAX_STEPS, AGREE_SECONDS, Agreement, Dist


class TwoRanks(Dist):
    """A rank whose peer reports the same numbers: the all-reduce doubles; counts the collectives."""

    world_size = 2

    def __init__(self):
        self.calls = 0

    def all_reduce_sum(self, t):
        self.calls += 1
        return t * 2


def run(agreement, steps, seconds_per_step, clock, request_at=()):
    seen = {}
    for step in steps:
        clock[0] += seconds_per_step
        if step in request_at:
            agreement.request("preempted")
        flags = agreement.poll(step)
        if flags:
            seen[step] = flags
    return seen


@pytest.fixture
def clock(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(distributed.time, "perf_counter", lambda: now[0])
    return now


def test_one_process_agrees_every_step_without_a_collective():
    a = Dist().agreement()
    assert a.poll(1) == frozenset()
    a.request("preempted")
    assert a.poll(2) == {"preempted"} and a.poll(3) == frozenset()
    with pytest.raises(ValueError, match="unknown agreement flag"):
        a.request("bogus")


@pytest.mark.parametrize("seconds_per_step, interval", [(0.001, AGREE_MAX_STEPS), (0.1, int(AGREE_SECONDS / 0.1)),
                                                        (3.0, 1)])
def test_the_schedule_follows_the_measured_step_time(clock, seconds_per_step, interval):
    dist = TwoRanks()
    a = Agreement(dist)
    run(a, range(1, 3), seconds_per_step, clock)  # the first poll agrees, the second measures one step
    assert a.next_step == 2 + interval
    calls = dist.calls
    run(a, range(3, 2 + interval), seconds_per_step, clock)
    assert dist.calls == calls  # no collective between agreement steps


def test_a_request_is_returned_at_the_next_agreement_step_only(clock):
    dist = TwoRanks()
    a = Agreement(dist)
    seen = run(a, range(1, 200), 0.1, clock, request_at={7})
    agreed_steps = [s for s in seen]
    assert len(agreed_steps) == 1 and agreed_steps[0] >= 7 and seen[agreed_steps[0]] == {"preempted"}
    assert agreed_steps[0] - 7 < int(AGREE_SECONDS / 0.1) + 1  # within one interval
    assert dist.calls < 200 / int(AGREE_SECONDS / 0.1) + 3


def test_a_second_poll_in_a_step_repeats_the_answer_without_a_collective():
    dist = TwoRanks()
    a = Agreement(dist)
    a.request("nonfinite_loss")
    assert a.poll(5) == {"nonfinite_loss"} and a.next_step == 6 and not a.requested
    assert a.poll(5) == {"nonfinite_loss"} and dist.calls == 1
