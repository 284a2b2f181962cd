"""The callback protocol and its dispatcher.

Hooks, in the order a run meets them:
  on_fit_start, on_epoch_start, on_step_start, on_after_backward, on_step_end, on_log,
  on_eval_end, on_epoch_end, on_save, on_fit_end, on_exception;
plus state_dict / load_state_dict so a callback's own state rides in the checkpoint.
A callback asks for changes through TrainState flags (`state.stop(...)`, `state.skip_step`).
"""

from __future__ import annotations

HOOKS = ("on_fit_start", "on_epoch_start", "on_step_start", "on_after_backward", "on_step_end",
         "on_log", "on_eval_end", "on_epoch_end", "on_save", "on_fit_end", "on_exception")


class Callback:
    """Override only the hooks you need; each gets the TrainState (and on_log/on_eval_end the record)."""

    def on_fit_start(self, state): ...
    def on_epoch_start(self, state): ...
    def on_step_start(self, state): ...
    def on_after_backward(self, state): ...
    def on_step_end(self, state): ...
    def on_log(self, state, record: dict): ...
    def on_eval_end(self, state, record: dict): ...
    def on_epoch_end(self, state): ...
    def on_save(self, state, path): ...
    def on_fit_end(self, state): ...
    def on_exception(self, state, exc: BaseException): ...

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, sd: dict) -> None: ...


class CallbackList:
    """Calls each hook only on the callbacks that override it, so unused hooks cost nothing per step."""

    def __init__(self, callbacks):
        self.callbacks = list(callbacks)
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

    def state_dict(self) -> dict:
        return {f"{i}:{type(cb).__name__}": cb.state_dict() for i, cb in enumerate(self.callbacks)}

    def load_state_dict(self, sd: dict) -> None:
        for i, cb in enumerate(self.callbacks):
            key = f"{i}:{type(cb).__name__}"
            if key in sd:
                cb.load_state_dict(sd[key])
