"""Log-mel features with torch alone: `torch.stft` and a triangular mel filterbank built here
(HTK mel scale), so nothing is downloaded and no torchaudio is needed."""

from __future__ import annotations

import math

import torch

SAMPLE_RATE = 22050  # espeak-ng's output rate
N_FFT = 512  # 23 ms windows
HOP = 220  # 10 ms frames
N_MELS = 40


def hz_to_mel(f: float) -> float:
    return 2595.0 * math.log10(1.0 + f / 700.0)


def mel_to_hz(m: torch.Tensor) -> torch.Tensor:
    return 700.0 * (10 ** (m / 2595.0) - 1.0)


def mel_filterbank(n_mels: int = N_MELS, n_fft: int = N_FFT, sample_rate: int = SAMPLE_RATE,
                   f_min: float = 60.0, f_max: float | None = None) -> torch.Tensor:
    """[n_fft // 2 + 1, n_mels] triangles, equally spaced on the mel scale, peak 1."""
    f_max = f_max or sample_rate / 2
    mels = torch.linspace(hz_to_mel(f_min), hz_to_mel(f_max), n_mels + 2, dtype=torch.float64)
    edges = mel_to_hz(mels)
    freqs = torch.linspace(0, sample_rate / 2, n_fft // 2 + 1, dtype=torch.float64)
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    up = (freqs[None] - lo) / (mid - lo)
    down = (hi - freqs[None]) / (hi - mid)
    return torch.clamp(torch.minimum(up, down), min=0).T.float()


_FB: dict = {}


def log_mel(wave: torch.Tensor, n_mels: int = N_MELS) -> torch.Tensor:
    """[frames, n_mels] log-mel energies of a mono float waveform, normalised per utterance
    (zero mean, unit variance per bin: loudness and channel differences between speakers drop out)."""
    if n_mels not in _FB:
        _FB[n_mels] = mel_filterbank(n_mels)
    spec = torch.stft(wave.float(), N_FFT, HOP, window=torch.hann_window(N_FFT), return_complex=True)
    power = spec.abs().pow(2).T  # [frames, bins]
    feats = torch.log(power @ _FB[n_mels] + 1e-6)
    return (feats - feats.mean(0)) / (feats.std(0) + 1e-5)
