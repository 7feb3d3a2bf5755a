"""A small CNN that is not in Ferret's zoo, written the way a user would bring their own model.

    ferret profile --model examples.custom_cnn:build --input-shape 1,28,28 --out custom_cnn.json
    ferret plan --profile custom_cnn.json --budget 2MiB

The factory returns an ``nn.Sequential`` whose children are the units the planner may cut between
(docs/your-model.md). The residual block is one unit: its skip connection cannot be cut. GroupNorm, not
BatchNorm, because the stream trains on one item at a time (ferret_core.zoo.base explains why).
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn


class ResidualBlock(nn.Module):
    """x + conv(relu(norm(conv(x)))): one unit, since the skip connection joins its input and output."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.GroupNorm(8, channels),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.GroupNorm(8, channels),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.body(x))


def build(input_shape: tuple[int, ...], num_classes: int, width: int = 16) -> nn.Sequential:
    """Stem → residual block → downsampling conv → pooled classifier, for images of ``input_shape`` (C, H, W)."""
    channels = input_shape[0]
    return nn.Sequential(
        OrderedDict(
            stem=nn.Sequential(nn.Conv2d(channels, width, 3, padding=1), nn.ReLU()),
            block=ResidualBlock(width),
            down=nn.Sequential(nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.ReLU()),
            head=nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, num_classes)),
        )
    )
