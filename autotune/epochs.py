"""What fits in one epoch of the data: the loader's queue (:func:`queue_fits`), and what an epoch of the winner's
optimizer steps leaves out or holds (:func:`epoch_notes`)."""

from __future__ import annotations


def queue_fits(workers: int, prefetch: int, batch: int, images: int | None) -> bool:
    """Whether a loader queue of ``workers x prefetch x batch`` samples fits in one epoch of ``images`` (unknown: yes).

    A larger queue prefetches batches the epoch does not hold: the space does
    not offer it, the search refuses it, and the verdict names it as the limit.
    """
    return images is None or workers * prefetch * batch <= images


def epoch_notes(images: int | None, step: int, reference: int, unit: str, per_rank: str = "") -> list[str]:
    """The notes on an epoch of ``images`` samples (one rank's) in optimizer steps of ``step`` (one rank's micro-batch
    x accumulation; ``reference``: the reference effective batch over the ranks, as one rank's share): the samples each
    epoch skips when a step does not divide it, and how few steps it holds when a step is a large part of it (a small
    dataset, fine-tuning: the winner trains with fewer updates per epoch than the recipe's batch would)."""
    if not images:
        return []
    notes = []
    if images % step >= 0.1 * images:
        notes.append(f"an epoch holds whole optimizer steps of {step} only: each skips {images % step} of the {images} training "
                     f"{unit}{per_rank} (a different one each epoch, as they are shuffled); a smaller batch uses more of a small dataset")
    steps, reference_steps = images // step, images // reference
    if step > reference and steps <= 4 and reference_steps > steps:
        notes.append(f"an epoch of the {images} training {unit}{per_rank} is {steps} optimizer step{'' if steps == 1 else 's'} of "
                     f"{step}, where the reference batch of {reference} makes {reference_steps}: the same epochs make "
                     f"{reference_steps / steps:.3g}x fewer updates, so check the accuracy per epoch once")
    return notes
