"""A tiny convolutional classifier, used by ``custom_model.py`` as a
``module:function`` model factory (``tiny_net:tiny_net``)."""

from torch import nn


def tiny_net(num_classes: int = 10) -> nn.Module:
    """Two strided conv blocks, global pooling and a linear head."""
    return nn.Sequential(
        nn.Conv2d(3, 16, kernel_size=3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU(inplace=True),
        nn.Conv2d(16, 32, kernel_size=3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(32),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, num_classes),
    )
