"""Which adapter reads an utterance, when the request does not say: a small learned router.

Per utterance, the features are the mean and standard deviation of its log-mel frames over time (a
voice's spectral shape and loudness); a logistic-regression classifier (scikit-learn) learns the
cohort from the training utterances of every cohort seen so far (the base voices' training split and
each round's feedback, whose cohort is known where it was collected). At inference an utterance goes
to its predicted cohort's adapter when the router's probability is at least `min_confidence`, else
to the base model; a cohort without an adapter is read by the base model too.
"""

from __future__ import annotations

import numpy as np
import torch


def utterance_features(source) -> np.ndarray:
    return torch.stack([torch.cat([s.mean(0), s.std(0)]) for s in source.segs]).numpy()


class CohortRouter:
    def __init__(self, min_confidence: float = 0.6, seed: int = 0):
        self.min_confidence, self.seed = min_confidence, seed
        self.x: list[np.ndarray] = []
        self.y: list[str] = []
        self.clf = None

    def add(self, source, cohort: str) -> None:
        """Training utterances of `cohort` (the router is refitted on everything seen so far)."""
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        self.x.append(utterance_features(source))
        self.y += [cohort] * len(source)
        if len(set(self.y)) < 2:
            self.clf = None  # one cohort: nothing to tell apart
            return
        self.clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, random_state=self.seed))
        self.clf.fit(np.concatenate(self.x), np.array(self.y))

    def route(self, source) -> list[str | None]:
        """The cohort per utterance, or None (low confidence: the base model)."""
        if self.clf is None:
            return [None] * len(source)
        p = self.clf.predict_proba(utterance_features(source))
        best = p.argmax(1)
        return [str(self.clf.classes_[b]) if p[i, b] >= self.min_confidence else None for i, b in enumerate(best)]
