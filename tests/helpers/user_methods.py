"""Test-only training methods named in configs by import path (`methods: [{name: tests.helpers.user_methods:StepCounter}]`)."""

from ecotrain.methods import Method


class StepCounter(Method):
    """Counts the optimizer steps it sees (a Callback hook), from `start` on; no `key`, so the builder names it."""

    def __init__(self, start: int = 0, label: str = "counted"):
        self.start, self.label, self.steps = start, label, 0

    def on_step_end(self, state):
        if state.step > self.start:
            self.steps += 1

    def summary(self) -> dict:
        return {self.label: self.steps}

    def state_dict(self) -> dict:
        return {"steps": self.steps}

    def load_state_dict(self, sd: dict) -> None:
        self.steps = int(sd["steps"])


class Keyed(Method):
    key = "keyed"


def make_counter(start: int = 0) -> StepCounter:
    """A factory: the config may name a function returning a Method."""
    m = StepCounter(start=start, label="from_factory")
    m.key = "made"
    return m


class NotAMethod:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


class Refuses(Method):
    def __init__(self, alpha: float = 0.5):
        if not 0 <= alpha <= 1:
            raise ValueError(f"alpha must be in [0, 1],\n got {alpha}")
