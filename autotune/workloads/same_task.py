"""The Task a trial process builds is the one the search checked.

Every trial process imports the workload factory's module from its file and calls the factory again. In a
notebook, a module global changed in the session or an edit not reloaded reaches the search's own check (this
process) but not the trials, which then measured another dataset or model than the search decided about (its
batch caps, epochs and study). The trial compares what it built with the counts the check stored in the
workload (``images``, ``parameters``) and fails in one line where they differ.
"""

from __future__ import annotations

from typing import Any

from autotune.errors import WorkloadError
from autotune.records import Workload

#: Why a trial process built another Task than the search checked.
NOT_THE_SAME_TASK = ("the trial processes import the factory's module from its file and call the factory again, so a module global "
                     "changed in this Python session (a notebook), an edit not reloaded (importlib.reload) or a factory that "
                     "builds another Task on each call does not reach them the same way; make the factory build the same Task "
                     "from its file's code alone")


def same_dataset(dataset: Any, workload: Workload, world_size: int = 1) -> Any:
    """``dataset``, once a Task's map-style dataset has the length the search's check read (``workload.images``: the
    whole dataset's, or one rank's share of ``world_size``).

    Raises:
        WorkloadError: It has another length in this process (:data:`NOT_THE_SAME_TASK`).
    """
    expected = workload.images
    if workload.task is None or expected is None or workload.iterable or not hasattr(dataset, "__len__"):
        return dataset
    if expected not in (len(dataset), max(1, len(dataset) // world_size)):
        share = "" if world_size == 1 else f" (a share of {world_size} ranks)"
        raise WorkloadError(f"workload {workload.task}: this trial process built a dataset of {len(dataset)} samples, the "
                            f"search's own check {expected}{share}: {NOT_THE_SAME_TASK}")
    return dataset


def trainable_parameters(model: Any) -> int:
    """The count of the model's trainable parameters: what the search's check stores (``Workload.parameters``) and
    each trial compares, counted one way on both sides."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def same_model(model: Any, workload: Workload) -> None:
    """Refuse a Task's model whose trainable parameters differ in count from those the search's check counted.

    Raises:
        WorkloadError: Another count in this process (:data:`NOT_THE_SAME_TASK`).
    """
    expected = workload.parameters
    if workload.task is None or expected is None:
        return
    count = trainable_parameters(model)
    if count != expected:
        raise WorkloadError(f"workload {workload.task}: this trial process built a model of {count:,} trainable parameters, "
                            f"the search's own check {expected:,}: {NOT_THE_SAME_TASK}")
