"""Which adapter reads an utterance, when the request does not say: continual/router.py's learned
router on the speech model's own features.

Per utterance, the features are the mean and standard deviation over time of the base model's
encoder output (the input of its head: the bidirectional GRU's frames), read by the frozen base
model that every cohort's adapter shares. Chosen on the design seed's gate halves (docs/speech.md):
routing accuracy 0.97 against 0.57 for the log-mel frames' mean and spread, at a confidence floor
of 0.8 (0.96 at 0.6). The router learns the cohort from the training utterances of every cohort
seen so far (the base voices' training split and each round's feedback, whose cohort is known
where it was collected). At inference an utterance goes to its predicted cohort's adapter when the
router is confident enough, else to the base model; a cohort without an adapter is read by the
base model too.
"""

from __future__ import annotations

import numpy as np
import torch

from ecotrain.continual.router import CohortRouter

MIN_CONFIDENCE = 0.8  # chosen with the features, on the design seed's gate halves


@torch.inference_mode()
def encoder_features(model, source) -> np.ndarray:
    """[utterances, 2 x head inputs]: the mean and standard deviation over time of what the model's head
    reads, one utterance at a time (no padding frames in the statistics)."""
    grab: list[torch.Tensor] = []
    hook = model.head.register_forward_pre_hook(lambda _m, a: grab.append(a[0][0]))
    was = model.training
    model.eval()
    try:
        dev = next(model.parameters()).device
        for seg in source.segs:
            model(seg[None].to(dev))
    finally:
        hook.remove()
        model.train(was)
    return torch.stack([torch.cat([a.mean(0), a.std(0)]).float().cpu() for a in grab]).numpy()


class SpeechRouter:
    """The router, refitted on every cohort's utterances added so far; features from `model` (the base)."""

    def __init__(self, model, min_confidence: float = MIN_CONFIDENCE, seed: int = 0):
        self.model = model
        self.router = CohortRouter(min_confidence, seed)
        self.x: list[np.ndarray] = []
        self.y: list[str] = []

    def add(self, source, cohort: str) -> None:
        self.x.append(encoder_features(self.model, source))
        self.y += [cohort] * len(source)
        self.router.fit(np.concatenate(self.x), self.y)

    def copy(self) -> "SpeechRouter":
        out = SpeechRouter(self.model, self.router.min_confidence, self.router.seed)
        out.x, out.y = list(self.x), list(self.y)
        out.router.classes, out.router.params = list(self.router.classes), self.router.params  # refit on add
        return out

    def route(self, source) -> list[str | None]:
        """The cohort per utterance, or None (low confidence: the base model)."""
        return self.router.route(encoder_features(self.model, source))
