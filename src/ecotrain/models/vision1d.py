"""Classifiers for flat or 1-D signal inputs: an MLP, the MNIST-1D paper's ConvBase, a small ResNet."""

from __future__ import annotations

import math

from torch import nn


class MLP(nn.Module):
    def __init__(self, in_dim: int, num_classes: int, hidden: list[int] | tuple[int, ...] = (128, 128), dropout: float = 0.0):
        super().__init__()
        layers: list[nn.Module] = []
        d = in_dim
        for h in hidden:
            layers += [nn.Linear(d, h), nn.ReLU(), nn.Dropout(dropout)]
            d = h
        layers.append(nn.Linear(d, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x.flatten(1))


class ConvBase(nn.Module):
    """The CNN of the MNIST-1D paper (Greydanus & Kobak): three strided convolutions and a linear head."""

    def __init__(self, in_len: int, num_classes: int, channels: int = 25, dropout: float = 0.0):
        super().__init__()
        self.conv1 = nn.Conv1d(1, channels, 5, stride=2, padding=1)
        self.conv2 = nn.Conv1d(channels, channels, 3, stride=2, padding=1)
        self.conv3 = nn.Conv1d(channels, channels, 3, stride=2, padding=1)
        length = in_len
        for k in (5, 3, 3):
            length = (length + 2 - k) // 2 + 1
        self.drop = nn.Dropout(dropout)
        self.linear = nn.Linear(channels * length, num_classes)

    def forward(self, x):
        x = x.view(x.shape[0], 1, -1)
        h = self.conv1(x).relu()
        h = self.conv2(h).relu()
        h = self.conv3(h).relu()
        return self.linear(self.drop(h.flatten(1)))


class _Block(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv1d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm1d(c_out)
        self.conv2 = nn.Conv1d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm1d(c_out)
        self.skip = nn.Identity() if stride == 1 and c_in == c_out else nn.Sequential(
            nn.Conv1d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm1d(c_out))

    def forward(self, x):
        h = self.bn1(self.conv1(x)).relu()
        return (self.bn2(self.conv2(h)) + self.skip(x)).relu()


class ResNet1d(nn.Module):
    """A small 1-D ResNet with BatchNorm: a stem and `len(widths)` stages of basic blocks."""

    def __init__(self, in_len: int, num_classes: int, widths: list[int] | tuple[int, ...] = (32, 64, 128), dropout: float = 0.0):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv1d(1, widths[0], 5, 1, 2, bias=False), nn.BatchNorm1d(widths[0]), nn.ReLU())
        blocks, c = [], widths[0]
        for i, w in enumerate(widths):
            blocks.append(_Block(c, w, 1 if i == 0 else 2))
            c = w
        self.blocks = nn.Sequential(*blocks)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(c, num_classes)

    def forward(self, x):
        h = self.blocks(self.stem(x.view(x.shape[0], 1, -1)))
        return self.head(self.drop(h.mean(-1)))


def flat_dim(shape: tuple[int, ...]) -> int:
    return math.prod(shape)
