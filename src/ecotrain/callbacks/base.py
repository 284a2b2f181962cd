"""The callback protocol and its dispatcher.

Hooks, in the order a run meets them:
  on_fit_start, on_epoch_start, on_step_start, on_after_backward, on_step_end, on_log,
  on_eval_end, on_epoch_end, on_fit_end, on_finished (summary.json written: the run's results are
  final; a preempted run's state saved), on_exception;
plus state_dict / load_state_dict so a callback's own state rides in the checkpoint, keyed by the
callback's stable `state_key` (its class name by default), never by its position in the list: the
list changes with the TTY, `--quiet` and the rank.
A callback asks for changes through TrainState flags (`state.stop(...)`, `state.skip_step`).

Order: a callback declares the callbacks it must run after (`after`) or before (`before`), by class
name; `after = ("*",)` runs it after every callback that does not name it in its own `after` (the
Checkpointer saves what all the others did this step). `CallbackList` resolves the order once: each
callback goes where it was given, unless a declaration pulls another one in front of it.
"""

from __future__ import annotations

from ecotrain.base.errors import CheckpointError, ConfigError

HOOKS = ("on_fit_start", "on_epoch_start", "on_step_start", "on_after_backward", "on_step_end",
         "on_log", "on_eval_end", "on_epoch_end", "on_fit_end", "on_finished", "on_exception", "on_rollback")


class Callback:
    """Override only the hooks you need; each gets the TrainState (and on_log/on_eval_end the record).
    A stateful callback (one that overrides `state_dict`) may set `state_key` when two instances of
    its class run together."""

    state_key: str | None = None
    # a rollback (divergence guard) restores every callback's state from the checkpoint, except one that
    # measures the run as it really went (the ledger's cost, the guard's own count): those set this
    keeps_state_on_rollback: bool = False
    after: tuple[str, ...] = ()  # class names this callback runs after ("*": after all that do not name it)
    before: tuple[str, ...] = ()  # class names this callback runs before

    def on_fit_start(self, state): ...
    def on_epoch_start(self, state): ...
    def on_step_start(self, state): ...
    def on_after_backward(self, state): ...
    def on_step_end(self, state): ...
    def on_log(self, state, record: dict): ...
    def on_eval_end(self, state, record: dict): ...
    def on_epoch_end(self, state): ...
    def on_fit_end(self, state): ...
    def on_finished(self, state, memory: dict): ...  # the results are final; `memory`: every rank's peaks
    def on_exception(self, state, exc: BaseException): ...
    def on_rollback(self, state): ...  # the run was rolled back to an earlier checkpoint (state restored)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, sd: dict) -> None: ...


class CallbackList:
    """Calls each hook only on the callbacks that override it, so unused hooks cost nothing per step."""

    def __init__(self, callbacks):
        self.callbacks = ordered(list(callbacks))
        for hook in HOOKS:
            users = [getattr(cb, hook) for cb in self.callbacks
                     if getattr(type(cb), hook, None) is not getattr(Callback, hook)]
            setattr(self, hook, self._dispatch(users))

    @staticmethod
    def _dispatch(fns):
        if not fns:
            return lambda *a: None
        if len(fns) == 1:
            return fns[0]

        def call(*args):
            for fn in fns:
                fn(*args)
        return call

    def stateful(self) -> dict:
        """{stable key: callback} of the callbacks that override `state_dict`."""
        out: dict = {}
        for cb in self.callbacks:
            if getattr(type(cb), "state_dict") is getattr(Callback, "state_dict") or getattr(cb, "state_in_methods", False):
                continue
            key = cb.state_key or type(cb).__qualname__
            if key in out:
                raise ConfigError(f"callbacks: two share the state key '{key}'; give one a distinct `state_key`")
            out[key] = cb
        return out

    def state_dict(self) -> dict:
        return {key: cb.state_dict() for key, cb in self.stateful().items()}

    def load_state_dict(self, sd: dict, where="checkpoint", allow_missing: bool = False) -> list[str]:
        """Restore each stateful callback; one whose state is missing is an error (its state
        would silently restart), or, with `allow_missing`, returned for a warning."""
        missing = []
        for key, cb in self.stateful().items():
            if key in sd:
                cb.load_state_dict(sd[key])
            elif allow_missing:
                missing.append(key)
            else:
                raise CheckpointError(f"{where}: the checkpoint holds no state for callback '{key}' (saved: "
                                      f"{sorted(sd) or 'none'}); resume with the same callbacks, or pass "
                                      "--allow-config-change to start it afresh")
        return missing


def ordered(cbs: list) -> list:
    """The callbacks in the order their declarations ask for: in the order given, except that a
    callback's predecessors (its `after`, and those that name it in their `before`) are placed first.
    A circle of declarations is one ConfigError naming it."""
    names = [type(cb).__name__ for cb in cbs]
    # read once, and with a default: a user's duck-typed callback need not derive from Callback
    after = [tuple(getattr(cb, "after", ())) for cb in cbs]
    before = [tuple(getattr(cb, "before", ())) for cb in cbs]

    def must_precede(i: int) -> list[int]:
        star = "*" in after[i]
        return [j for j in range(len(cbs)) if j != i and (
            names[j] in after[i] or names[i] in before[j]
            or (star and names[i] not in after[j] and "*" not in after[j]))]

    out, done, visiting = [], set(), []

    def visit(i: int) -> None:
        if i in done:
            return
        if i in visiting:
            loop = [names[j] for j in visiting[visiting.index(i):]] + [names[i]]
            raise ConfigError(f"callbacks: their declared order is a circle ({' -> '.join(loop)}); "
                              "change one's `after` or `before`")
        visiting.append(i)
        for j in must_precede(i):
            visit(j)
        visiting.pop()
        done.add(i)
        out.append(cbs[i])

    for i in range(len(cbs)):
        visit(i)
    return out
