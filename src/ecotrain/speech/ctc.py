"""CTC over word tokens: the task `fit` trains with, greedy decoding, and word error rate.

y is SpeechSource's one tensor per batch: y[:, 0] input frames, y[:, 1] label lengths, y[:, 2:]
word ids. The loss is a mean over utterances (each utterance's CTC negative log-likelihood), so
`normalized_loss` keeps accumulation exact. WER comes from jiwer (the `speech` extra), not
hand-rolled: it imports in 0.1 s where torchmetrics' WordErrorRate costs ~5 s of CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ecotrain.base.errors import ConfigError
from ecotrain.speech.transcripts import decode
from ecotrain.speech.model import out_lengths


def targets(y: torch.Tensor):
    """(frames, label lengths, flat label ids) of a batch's y."""
    frames, lens = y[:, 0], y[:, 1]
    ids = torch.cat([y[i, 2: 2 + int(n)] for i, n in enumerate(lens.tolist())]) if len(y) else y.new_zeros(0)
    return frames, lens, ids


def utterance_nll(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-utterance CTC negative log-likelihood of y's labels under logits `out` [b, T', V]."""
    frames, lens, ids = targets(y)
    logp = F.log_softmax(out.float(), -1).transpose(0, 1)  # [T', b, V]
    in_len = out_lengths(frames).clamp(max=out.shape[1])
    return F.ctc_loss(logp, ids, in_len, lens, blank=0, reduction="none", zero_infinity=True)


class CTCTask:
    """Usable as `fit(..., loss_fn=CTCTask())`: a mean-reduced loss `fn(out, y)`."""

    def __call__(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return utterance_nll(out, y).mean()


def greedy_decode(out: torch.Tensor, frames: torch.Tensor) -> list[list[int]]:
    """Best path: argmax per frame, repeats merged, blanks dropped."""
    best = out.argmax(-1).cpu()
    lens = out_lengths(frames.cpu()).clamp(max=out.shape[1]).tolist()
    hyps = []
    for row, n in zip(best, lens):
        seq = torch.unique_consecutive(row[:n]).tolist()
        hyps.append([t for t in seq if t != 0])
    return hyps


def word_error_rate(hyps: list[str], refs: list[str]) -> float:
    """Corpus WER (substitutions + deletions + insertions over reference words), by jiwer."""
    try:
        import jiwer
    except ImportError:
        raise ConfigError("speech WER needs jiwer: pip install 'ecotrain[speech]'") from None
    if not refs:
        return float("nan")
    return float(jiwer.wer(list(refs), list(hyps)))


@torch.inference_mode()
def transcribe(model, source, batch_size: int = 64, device=None) -> list[list[int]]:
    """Greedy transcripts of every utterance of `source`, in order (eval mode); the inputs go to
    `device`, by default the model's own (a CUDA-trained model gets CUDA inputs)."""
    if device is None:
        device = next(model.parameters()).device
    was = model.training
    model.eval()
    hyps: list[list[int]] = []
    for s in range(0, len(source), batch_size):
        x, y = source.take(torch.arange(s, min(s + batch_size, len(source))))
        hyps += greedy_decode(model(x.to(device)), y[:, 0])
    model.train(was)
    return hyps


def evaluate_wer(model, source, batch_size: int = 64) -> float:
    hyps = transcribe(model, source, batch_size)
    refs = [decode(lab) for lab in source.label_ids]
    return word_error_rate([decode(h) for h in hyps], refs)
