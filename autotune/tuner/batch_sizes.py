"""The micro-batch sizes a search offers: powers of two, or every divisor of a pinned effective batch; and why the data bounds them."""

from __future__ import annotations

import math


def powers_of_two(low: int, high: int) -> tuple[int, ...]:
    """Powers of two in ``[low, high]``."""
    if high < 1:
        return ()
    k = max(0, math.ceil(math.log2(max(1, low))))
    values = []
    while 2**k <= high:
        values.append(2**k)
        k += 1
    return tuple(values)


def batch_sizes(low: int, high: int, effective_batch: int | None) -> tuple[int, ...]:
    """The batches in ``[low, high]`` a search offers.

    Free, the powers of two. With ``effective_batch`` pinned, every batch
    that divides it (96: 8, 12, 16, 24, 32, 48 and 96 itself, with 12 down
    to 1 accumulation steps), so that a batch of the whole effective batch is
    among them when it fits; when none lies in the range, its largest divisor
    up to ``high``.
    """
    if effective_batch is None:
        return powers_of_two(low, high)
    divisors = [d for d in range(1, min(effective_batch, high) + 1) if effective_batch % d == 0]
    return tuple(d for d in divisors if d >= low) or (max(divisors),)


def divisor_space(effective_batch: int | None) -> bool:
    """Whether :func:`batch_sizes` may offer other batches for ``effective_batch`` than powers of two (versions before
    this rule offered only those: a study of such an effective batch sampled another space)."""
    return effective_batch is not None and effective_batch & (effective_batch - 1) != 0


def data_limit(samples: int) -> str:
    """Why the data's size bounds the batch, in words (the calibration's reason, and the space's)."""
    return f"an optimizer step must fit in the data's {samples} samples"
