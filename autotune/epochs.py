"""What fits in one epoch of the data: the loader's queue (:func:`queue_fits`)."""

from __future__ import annotations


def queue_fits(workers: int, prefetch: int, batch: int, images: int | None) -> bool:
    """Whether a loader queue of ``workers x prefetch x batch`` samples fits in one epoch of ``images`` (unknown: yes).

    A larger queue prefetches batches the epoch does not hold: the space does
    not offer it, the search refuses it, and the verdict names it as the limit.
    """
    return images is None or workers * prefetch * batch <= images
