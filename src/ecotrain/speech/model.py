"""The acoustic model: strided 1-D convolutions over log-mel frames (4x fewer frames), a
bidirectional GRU, and a linear head over the word vocabulary plus the CTC blank.

Its Linear layers (`proj`, `head`) are what LoRA adapters attach to (PEFT supports Linear and
Conv1d, not GRU): a per-cohort adapter changes how the frames are projected and read out.
"""

from __future__ import annotations

import torch
from torch import nn

from ecotrain.speech.features import N_MELS
from ecotrain.speech.transcripts import VOCAB

SUBSAMPLE = 4  # output frames = ceil(input frames / SUBSAMPLE): 40 ms, ~8 per spoken digit


def out_lengths(frames: torch.Tensor) -> torch.Tensor:
    half = (frames + 1) // 2  # two stride-2 convolutions (kernel 5, padding 2)
    return (half + 1) // 2


class AcousticModel(nn.Module):
    def __init__(self, n_mels: int = N_MELS, channels: int = 128, hidden: int = 128, vocab: int = len(VOCAB),
                 dropout: float = 0.1):
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv1d(n_mels, channels, 5, stride=2, padding=2), nn.GELU(),
            nn.Conv1d(channels, channels, 5, stride=2, padding=2), nn.GELU())
        self.proj = nn.Linear(channels, hidden)
        self.gru = nn.GRU(hidden, hidden, batch_first=True, bidirectional=True)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(2 * hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [b, T, n_mels] -> logits [b, out_lengths(T), vocab]."""
        h = self.conv(x.transpose(1, 2)).transpose(1, 2)
        h, _ = self.gru(self.proj(h))
        return self.head(self.drop(h))
