"""A study that already holds a calibration, for tests whose subject is what happens after it."""

from __future__ import annotations


def seed_calibration(storage: str, study: str, *, trials: int = 30, shared: bool = False) -> None:
    """Store a calibration in the study a search will open, so that search goes straight to its trials.

    A real calibration (about 15 s of short trials) is tested on its own; the tests
    that use this one are about faults, interrupts or workers sharing a study.
    """
    from autotune.records import Calibration, LoaderPoint
    from autotune.train_setup import TrainSetup
    from autotune.tuner.study import SearchStudy

    calibration = Calibration(
        budget_bytes=2**30, max_batch=64, memory_points=(), probe_batch=64,
        compute_setup=TrainSetup(batch_size=64), compute_samples_per_s=1000.0,
        loader=(LoaderPoint(0, "ok", 300.0), LoaderPoint(1, "ok", 500.0)), max_workers=1,
    )
    SearchStudy.open(storage, study, trials=trials, shared=shared).store_calibration(calibration)
