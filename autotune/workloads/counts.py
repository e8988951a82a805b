"""Whether a Task's batches count their samples as every trial counts them (``batch_size_of``, else the first dimension
of the first tensor, depth first): a positive count that grows with the items and is theirs, checked in the parent on
the first items collated (:func:`check_count`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autotune.errors import USER_CODE_ERRORS, WorkloadError
from autotune.workloads.batches import describe_batch, first_tensor
from autotune.workloads.task import Task


def check_count(task: Task, batch: Any, first: Callable[[int], Any], available: int, check_items: int,
                warn: Callable[[str], None] | None = None) -> None:
    """The samples of the first batch, as every trial counts them, must be a positive count; counted by the first
    dimension, it must count the items (``first(n)``: the first n items collated, for 1, ``check_items`` (``batch``) and
    ``available``): not a count that stays the same, a sequence-first length, or rows that vary per item (tokens
    joined). Rows that are a fixed number per item (an item that is a chunk of samples, views stacked) are counted as
    they are, said through ``warn``.

    Raises:
        WorkloadError: The count is none of those, naming the batch and what to give ``batch_size_of``.
    """
    checked = min(available, check_items)
    origin = "batch_size_of(batch)" if task.batch_size_of is not None else "counting the samples"
    try:
        count = task.samples_in(batch)
    except WorkloadError:
        raise
    except USER_CODE_ERRORS as exc:
        raise WorkloadError(f"{origin} failed on the first batch {describe_batch(batch)}: {type(exc).__name__}: {exc}") from None
    if count < 1:
        raise WorkloadError(f"{origin} returned {count} for the first batch {describe_batch(batch)}; it must be >= 1")
    if task.batch_size_of is not None or available < 2:  # the user's own count (tokens, a mask's sum) is theirs to define
        return
    try:
        one, whole = first(1), first(available)
        alone, every = task.samples_in(one), task.samples_in(whole)
    except (WorkloadError, *USER_CODE_ERRORS):  # one item does not collate alone, or the count fails: nothing to compare
        return
    heads = [(n, first_tensor(b)) for n, b in ((1, one), (checked, batch), (available, whole))]
    if any(t.shape[0] != n for n, t in heads) and all(t.dim() > 1 and t.shape[1] == n for n, t in heads):
        raise WorkloadError(  # [length, batch]: the count would be the longest item's length, whatever the batch
            f"the first dimension of the batch's first tensor (depth first) counts {every} samples in a batch of {available} "
            f"items ({describe_batch(whole)}), where its second dimension holds the items: a sequence-first batch (as "
            "pad_sequence makes by default) would count the length of its longest item, so samples/s would not count "
            "samples; give autotune.Task(batch_size_of=...) the count (lambda batch: batch[0].shape[1] for (inputs, targets))")
    if alone == count == every:  # 1, 2 and all the items read count alike: a batch of 256 would count as few as one of 2
        raise WorkloadError(
            f"the first dimension of the batch's first tensor (depth first) counts {count} samples in a batch of "
            f"{checked} items, {alone} in a batch of 1 and {every} in one of {available} "
            f"({describe_batch(batch)}): it does not count the items, so samples/s would measure steps/s; give "
            "autotune.Task(batch_size_of=...) the count (for batches of lists, such as detection's (images, targets): "
            "lambda batch: len(batch[0]))")
    if alone < 1 or (count == checked and every == available):  # an item a collate_fn dropped, or the items themselves
        return
    if count == alone * checked and every == alone * available:  # a fixed number of rows per item: chunks, views
        if warn is not None:
            warn(f"a batch's first tensor holds {alone} rows per item ({describe_batch(batch)} for {checked} items): "
                 "samples/s counts those rows; give autotune.Task(batch_size_of=...) to count otherwise (lambda batch: "
                 "len(batch[-1]) where the last part holds one label per item)")
        return
    raise WorkloadError(  # rows that vary per item, tokens joined into one tensor: samples/s would follow their lengths
        f"the first dimension of the batch's first tensor (depth first) counts {count} samples in a batch of {checked} "
        f"items, {alone} in a batch of 1 and {every} in one of {available} ({describe_batch(batch)}): it does not count "
        "the items (a collate_fn that joins items of different lengths, such as token ids for nn.EmbeddingBag, makes it "
        "count their rows), so samples/s would follow the items' lengths; give autotune.Task(batch_size_of=...) the count "
        "(lambda batch: len(batch[-1]) where the last part holds one label per item; lambda batch: batch[0].numel() to "
        "rank by tokens/s)")
