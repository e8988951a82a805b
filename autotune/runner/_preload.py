"""Imported once by the zygote (the trial fork server), so each forked trial starts warm.

Only imports: no tensor is created and CUDA is not touched, so forking from
the server is as safe as forking from a fresh interpreter.
"""

import numpy  # noqa: F401
import PIL.Image  # noqa: F401
import torch  # noqa: F401
import torchvision
import torchvision.datasets
import torchvision.models
import torchvision.transforms.v2  # noqa: F401

import autotune.runner.entry
import autotune.workloads.data
import autotune.workloads.models  # noqa: F401
