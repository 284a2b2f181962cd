"""`glyphs`: 2-D images generated on this machine from scikit-learn's packaged 8x8 digits.

Each image is one of the 1,797 digits, drawn into a `size` x `size` canvas through a random affine
map (rotation, scale, shear, shift) with bilinear sampling, plus Gaussian pixel noise: as many
samples as `data.num_samples` asks, from a fixed generator seed, so every run of a recipe sees the
same dataset and its seed chooses only the splits and the order. The test images are drawn from
source digits the training images never use (a third of them, by a fixed permutation), so a test
figure is not a memory of a training glyph under another transform.

    data:
      name: glyphs
      num_samples: 12000           # training images (validation is held out of them)
      kwargs: {size: 16, test_samples: 3000, noise: 0.15}

Why generated: a 2-D convolutional net needs images, and nothing can be downloaded at run time.
The sizes keep a compute-bound run (its time in the convolutions) within minutes on 2 cores.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from ecotrain.base.errors import DataError
from ecotrain.data.builtin import Found, checked_tensors
from ecotrain.data.cache import load_or_make, package_version
from ecotrain.data.sources import ArraySource

DEFAULTS = {"size": 16, "test_samples": 3000, "noise": 0.15, "rotate": 20.0, "scale": 0.15, "shift": 0.12}
GENERATOR_SEED = 1234  # the dataset's own: not the run's seed (that one picks splits and order)
MAX_SIZE, MAX_SAMPLES = 128, 1_000_000


def options(kwargs: dict, num_samples: int) -> dict:
    """data.kwargs checked: known keys, finite numbers in range; one line naming the key otherwise."""
    unknown = sorted(set(kwargs) - set(DEFAULTS))
    if unknown:
        raise DataError(f"data.kwargs.{unknown[0]}: not a glyphs option; choose from {', '.join(DEFAULTS)}")
    out = {**DEFAULTS, **kwargs}
    for key in ("size", "test_samples"):
        v = out[key]
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= (MAX_SIZE if key == "size" else MAX_SAMPLES):
            top = MAX_SIZE if key == "size" else MAX_SAMPLES
            raise DataError(f"data.kwargs.{key}: a whole number from 1 to {top}; got {v!r}")
    if out["size"] < 8:
        raise DataError(f"data.kwargs.size: at least 8 pixels (the source digits are 8x8); got {out['size']}")
    for key in ("noise", "rotate", "scale", "shift"):
        v = out[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v <= 1000:
            raise DataError(f"data.kwargs.{key}: a finite number >= 0; got {v!r}")
    if out["scale"] >= 1 or out["shift"] >= 1:
        raise DataError("data.kwargs.scale and shift: fractions below 1 (of the glyph's size and of the canvas)")
    if num_samples > MAX_SAMPLES:
        raise DataError(f"data.num_samples: at most {MAX_SAMPLES} glyph images; got {num_samples}")
    return out


def draw(src: torch.Tensor, n: int, opts: dict, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """`n` images drawn from the (k, 8, 8) source glyphs: (indices into src, images (n, 1, size, size))."""
    pick = torch.randint(len(src), (n,), generator=gen)
    u = lambda: torch.rand(n, generator=gen) * 2 - 1  # noqa: E731 - uniform in [-1, 1]
    angle = u() * math.radians(opts["rotate"])
    scale = 1.0 + u() * opts["scale"]
    shear = u() * 0.15
    tx, ty = u() * opts["shift"], u() * opts["shift"]
    cos, sin = torch.cos(angle) * scale, torch.sin(angle) * scale
    theta = torch.stack([torch.stack([cos, -sin + shear, tx], 1), torch.stack([sin, cos, ty], 1)], 1)
    size = opts["size"]
    # the glyph fills ~80% of the canvas: sample the 8x8 source (zero outside) on the canvas's grid
    grid = F.affine_grid(theta / 0.8, (n, 1, size, size), align_corners=False)
    images = F.grid_sample(src[pick].unsqueeze(1), grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    images = images + opts["noise"] * torch.randn(images.shape, generator=gen)
    return pick, images


def make(num_samples: int, opts: dict, digits: np.ndarray, labels: np.ndarray) -> dict:
    gen = torch.Generator().manual_seed(GENERATOR_SEED)
    order = torch.randperm(len(digits), generator=gen)
    held = len(digits) // 3  # source glyphs for the test images only
    out = {}
    for name, ids, n in (("train", order[held:], num_samples), ("test", order[:held], opts["test_samples"])):
        src = torch.as_tensor(digits[ids.numpy()], dtype=torch.float32).reshape(-1, 8, 8) / 16.0
        chunks, ys = [], []
        for start in range(0, n, 4096):  # bounded memory for a large num_samples
            pick, images = draw(src, min(4096, n - start), opts, gen)
            chunks.append(images.numpy().astype(np.float32))
            ys.append(labels[ids.numpy()][pick.numpy()].astype(np.int64))
        out[f"x_{name}"], out[f"y_{name}"] = np.concatenate(chunks), np.concatenate(ys)
    return out


def load_glyphs(cfg):
    opts = options(dict(cfg.data.kwargs), cfg.data.num_samples)

    def made():
        from sklearn import datasets  # ~2 s to import: only on a cache miss

        d = datasets.load_digits()
        return make(cfg.data.num_samples, opts, d.data, d.target)

    versions = {"scikit-learn": package_version("scikit-learn"), "torch": torch.__version__.split("+")[0],
                "glyphs": "1"}
    d = load_or_make("glyphs", versions, {"num_samples": cfg.data.num_samples, **opts}, made)
    train = checked_tensors(d["x_train"], d["y_train"], "glyphs train", 10)
    test = checked_tensors(d["x_test"], d["y_test"], "glyphs test", 10)
    return Found(ArraySource(*train), test=ArraySource(*test), num_classes=10)
