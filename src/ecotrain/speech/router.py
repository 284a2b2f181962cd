"""Which adapter reads an utterance, when the request does not say: continual/router.py's learned
router on the speech features.

Per utterance, the features are the mean and standard deviation of its log-mel frames over time (a
voice's spectral shape and loudness); the router learns the cohort from the training utterances of
every cohort seen so far (the base voices' training split and each round's feedback, whose cohort
is known where it was collected). At inference an utterance goes to its predicted cohort's adapter
when the router is confident enough, else to the base model; a cohort without an adapter is read by
the base model too.
"""

from __future__ import annotations

import numpy as np
import torch

from ecotrain.continual.router import MIN_CONFIDENCE, CohortRouter


def utterance_features(source) -> np.ndarray:
    return torch.stack([torch.cat([s.mean(0), s.std(0)]) for s in source.segs]).numpy()


class SpeechRouter:
    """The router, refitted on every cohort's utterances added so far."""

    def __init__(self, min_confidence: float = MIN_CONFIDENCE, seed: int = 0):
        self.router = CohortRouter(min_confidence, seed)
        self.x: list[np.ndarray] = []
        self.y: list[str] = []

    def add(self, source, cohort: str) -> None:
        self.x.append(utterance_features(source))
        self.y += [cohort] * len(source)
        self.router.fit(np.concatenate(self.x), self.y)

    def route(self, source) -> list[str | None]:
        """The cohort per utterance, or None (low confidence: the base model)."""
        return self.router.route(utterance_features(source))
