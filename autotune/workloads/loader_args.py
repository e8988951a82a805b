"""The DataLoader arguments a Task does not take, and what to do instead: the hint of a factory that passed one.

A Task's loader is the one autotune tunes and train.py builds (docs/workloads.md, "A Task has no sampler").
"""

from __future__ import annotations

#: DataLoader arguments a Task does not take, and what to do instead (docs/workloads.md, "A Task has no sampler").
LOADER_ARGUMENTS = (
    ("sampler", "; it has no sampler: give the dataset the order instead"),
    ("batch_sampler", "; it has no batch_sampler: an IterableDataset that yields the bucketed stream batches it as you would"),
    ("shuffle", "; a map-style dataset is always shuffled: for a fixed order give an IterableDataset"),
    ("drop_last", "; an epoch of a map-style dataset holds whole optimizer steps"),
    ("worker_init_fn", "; it has no worker_init_fn: split a stream in its __iter__ by get_worker_info(), open files lazily in __getitem__"),
    ("generator", "; the order follows train.py's --seed"),
    ("pin_memory", "; pin_memory is a knob the search tunes"),
    ("num_workers", "; num_workers is a knob the search tunes"),
)
