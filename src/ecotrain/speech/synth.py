"""Rendering speech with espeak-ng (the Debian package `espeak-ng`), one process per utterance.

A speaker is an espeak-ng voice (a language, which gives the accent, plus a variant such as `+f2`),
a speed in words per minute and a pitch (0-99). Rendering is deterministic for the same espeak-ng
version, which is part of the dataset cache key.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ecotrain.base import safefile
from ecotrain.base.errors import DataError

INSTALL_HINT = "install it with `apt-get install espeak-ng` (or `make speech`)"


@dataclass(frozen=True)
class Speaker:
    voice: str  # espeak-ng voice: language + variant, e.g. "en-us+m3", "de+f2"
    speed: int = 160  # words per minute
    pitch: int = 50  # 0-99

    @property
    def id(self) -> str:
        return f"{self.voice}-s{self.speed}-p{self.pitch}"


def espeak_binary() -> str:
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise DataError(f"espeak-ng: not found on PATH; the speech data is rendered with it; {INSTALL_HINT}")
    return exe


def espeak_version() -> str:
    out = subprocess.run([espeak_binary(), "--version"], capture_output=True, text=True, check=False)
    return out.stdout.strip().split("  ")[0] or "unknown"


def render(text: str, speaker: Speaker, workdir: Path) -> torch.Tensor:
    """The utterance as a float waveform in [-1, 1] at espeak-ng's rate (22,050 Hz)."""
    with tempfile.NamedTemporaryFile(suffix=".wav", dir=workdir, delete=False) as f:
        path = Path(f.name)
    try:
        cmd = [espeak_binary(), "-v", speaker.voice, "-s", str(speaker.speed), "-p", str(speaker.pitch),
               "-w", str(path), text]
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if r.returncode != 0 or path.stat().st_size <= 44:
            raise DataError(f"espeak-ng: voice '{speaker.voice}' could not render '{text}' "
                            f"({(r.stderr or 'no audio').strip()[:200]}); check `espeak-ng --voices`")
        with safefile.open_regular(path, "espeak-ng output", error=DataError) as fh, wave.open(fh, "rb") as w:
            pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    finally:
        path.unlink(missing_ok=True)
    return torch.from_numpy(pcm.astype(np.float32) / 32768.0)


def add_noise(wave_: torch.Tensor, snr_db: float, seed: int) -> torch.Tensor:
    """White noise at `snr_db` below the signal's power, seeded per utterance."""
    g = torch.Generator().manual_seed(seed)
    power = wave_.pow(2).mean().clamp_min(1e-8)
    noise = torch.randn(wave_.shape, generator=g) * torch.sqrt(power / 10 ** (snr_db / 10))
    return wave_ + noise
