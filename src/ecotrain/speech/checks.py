"""Label and drift checks on incoming feedback, seen through the current model.

- `contradiction_scores`: per utterance, how much less likely the user's transcript is than the
  model's own best reading, in nats per word (CTC negative log-likelihoods). A transcript the
  model strongly contradicts (score above a threshold, and a different word count or words) is
  held back from training and listed for review.
- `frame_posteriors`: the model's per-frame token probabilities (padding dropped), which the
  continual drift report reads like class probabilities: shift of the predicted-token
  distribution and of confidence against the holdout.
"""

from __future__ import annotations

import torch

from ecotrain.speech.ctc import greedy_decode, utterance_nll
from ecotrain.speech.model import out_lengths


@torch.inference_mode()
def contradiction_scores(model, source, batch_size: int = 64) -> tuple[torch.Tensor, list[list[int]]]:
    """(score per utterance, the model's greedy reading of each)."""
    was = model.training
    model.eval()
    scores, hyps = [], []
    for s in range(0, len(source), batch_size):
        x, y = source.take(torch.arange(s, min(s + batch_size, len(source))))
        out = model(x)
        hyp = greedy_decode(out, y[:, 0])
        yh = y.new_zeros(len(y), 2 + max(1, max(len(h) for h in hyp)))
        yh[:, 0] = y[:, 0]
        for j, h in enumerate(hyp):
            yh[j, 1] = len(h)
            yh[j, 2: 2 + len(h)] = torch.tensor(h, dtype=torch.long)
        gap = utterance_nll(out, y) - utterance_nll(out, yh)
        scores.append(gap / y[:, 1].clamp_min(1))
        hyps += hyp
    model.train(was)
    return torch.cat(scores), hyps


def flag_contradictions(scores: torch.Tensor, hyps: list[list[int]], labels: list[list[int]],
                        threshold: float) -> list[bool]:
    return [bool(s > threshold) and h != lab for s, h, lab in zip(scores.tolist(), hyps, labels)]


@torch.inference_mode()
def frame_posteriors(model, source, batch_size: int = 64) -> torch.Tensor:
    """[frames, vocab] probabilities over every utterance's real (unpadded) output frames."""
    was = model.training
    model.eval()
    rows = []
    for s in range(0, len(source), batch_size):
        x, y = source.take(torch.arange(s, min(s + batch_size, len(source))))
        p = torch.softmax(model(x).float(), -1)
        for j, n in enumerate(out_lengths(y[:, 0]).clamp(max=p.shape[1]).tolist()):
            rows.append(p[j, :n])
    model.train(was)
    return torch.cat(rows)
