"""A 2-D convolutional classifier with BatchNorm for images (N, C, H, W): stages of two 3x3
convolutions (conv, BatchNorm, ReLU), 2x2 max-pooling between stages, global average pooling and a
linear head. The pooling makes it take any image size, so lower resolution early in training
(progressive_resize) works on it; its width is the `widths` list, one entry per stage."""

from __future__ import annotations

from torch import nn


def _conv(c_in: int, c_out: int) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]


class Cnn2d(nn.Module):
    def __init__(self, in_channels: int, num_classes: int, widths: list[int] | tuple[int, ...] = (16, 32, 64),
                 dropout: float = 0.0):
        super().__init__()
        layers: list[nn.Module] = []
        c = in_channels
        for i, w in enumerate(widths):
            if i:
                layers.append(nn.MaxPool2d(2, ceil_mode=True))  # ceil: a small image never pools to nothing
            layers += _conv(c, w) + _conv(w, w)
            c = w
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout), nn.Linear(c, num_classes))

    def forward(self, x):
        if x.ndim == 3:  # (N, H, W): one channel
            x = x.unsqueeze(1)
        return self.head(self.features(x))
