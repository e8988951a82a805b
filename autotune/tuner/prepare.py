"""The first step of a search: probe, check the input and output, build the workload, open the study.

Nothing is written before every check has passed: a refused command leaves no output directory, no
study and no synthetic JPEGs behind (:func:`prepare`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import probes
from autotune.devices import DeviceInfo, visible_gpus
from autotune.files import check_out, check_temp_dir_for_workers
from autotune.output.emit import script_target
from autotune.records import TrialOptions, Workload
from autotune.tuner import elections
from autotune.tuner.config import SearchConfig
from autotune.tuner.constraints import allows_workers, check_constraints, check_effective_batch
from autotune.tuner.identity import machine_fingerprint, signature, study_name
from autotune.tuner.leftovers import nothing_left_if_stopped
from autotune.tuner.lock import OutputLock
from autotune.tuner.offered import check_workload_constraints
from autotune.tuner.patience import patience_s
from autotune.tuner.pending import add_pending
from autotune.tuner.pins import check_pins_act, threads_over_cores
from autotune.tuner.placement import Placement, place
from autotune.tuner.progress import Reporter
from autotune.tuner.signals import stop_requested
from autotune.tuner.storage import close_connections
from autotune.tuner.storage_urls import check_storage_url, is_shared, sqlite_url
from autotune.tuner.study import SearchStudy
from autotune.tuner.study_files import check_one_study
from autotune.tuner.workers import Crew
from autotune.units import counted
from autotune.workloads import build_workload, check_synthetic_target, write_synthetic
from autotune.workloads.scan import LIST_FILE, stale_list
from autotune.workloads.tasks import build_task_workload
from probes.hardware import gpu_busy_warning


@dataclass(frozen=True)
class Prepared:
    """What the first step checked and opened."""

    hardware: Any
    device: DeviceInfo
    workload: Workload
    study: SearchStudy
    out: Path
    held: ExitStack
    placement: Placement
    crew: Crew | None = None  # this worker's view of a shared study (None: the study is this search's alone)
    made_out: Path | None = None  # --out when this search made it


def search_warnings(hardware: Any, placement: Placement) -> list[str]:
    """The probe's warnings that concern this search (a small /dev/shm, a CPU quota, a ``ulimit -v``), a busy GPU's only
    for the GPUs the trials use, named as the search names them (``cuda:K``, which counts the visible GPUs; NVML's
    index, ``GPU n``, counts them all): a busy GPU 0 was reported to a search on an idle ``cuda:1``."""
    gpus = list(getattr(hardware, "gpus", None) or [])
    busy = {gpu_busy_warning(gpu) for gpu in gpus}
    said = [warning for warning in hardware.warnings if warning not in busy]
    visible = visible_gpus(gpus, getattr(hardware, "cuda_visible_devices", None))
    for name in placement.cuda_devices:
        index = int(name.split(":", 1)[1])
        gpu = visible[index] if index < len(visible) else None
        if gpu is not None and (warning := gpu_busy_warning(gpu, name)) is not None:
            said.append(warning)
    return said


def prepare(config: SearchConfig, reporter: Reporter) -> Prepared:
    """Probe, resolve the device, check the input and output, build the workload, open the study.

    Nothing is written before every check has passed; the synthetic JPEGs not before the stored study accepts the workload.
    """
    hardware = probes.collect()
    placement = place(config.device, config.devices, config.nproc_per_node, hardware)
    device = placement.device
    constraints = config.pins
    check_constraints(constraints, device)
    check_pins_act(constraints, None, placement.world_size)  # those that need no workload: before its import and checks
    workers = allows_workers(constraints.get("num_workers"))
    if workers:
        check_temp_dir_for_workers()
    out = Path(config.out)
    check_out(out, config.data)
    OutputLock(out).refuse_if_held()  # at once, not after the workload's imports
    script_target(out / "train.py", "--out")  # the winner's script must not meet the user's own train.py at the end
    if config.storage is not None:
        check_storage_url(config.storage)  # a typo must not wait for the workload (thousands of JPEGs on a first run)
    if config.workload is not None:
        timed = TrialOptions(trial_seconds=config.trial_seconds, timeout_s=config.timeout_s)  # a Task's factory must fit in its timeout
        workload = build_task_workload(config.workload, device=device.name, workers=workers, options=timed, warn=reporter.message)
    else:
        workload = build_workload(model=config.model, image_size=config.image_size, data=config.data, device=device.name, cache_dir=config.cache_dir,
                                  synthetic_images=config.synthetic_images, lr=config.lr, warn=reporter.message, write_data=False,
                                  tell=reporter.message)
    check_synthetic_target(workload)  # the JPEGs are written below, once the study accepts the workload: refused before that
    check_pins_act(constraints, workload.image_input, placement.world_size)
    check_workload_constraints(constraints, workload, device)
    workload = placement.rank_workload(workload)  # with N ranks, each reads 1/N of the data
    check_effective_batch(  # before calibration runs
        placement.rank_batch(config.effective_batch), workload.images, constraints=constraints, unit="samples" if workload.task else "images",
        ranks=placement.world_size,
    )
    for warning in search_warnings(hardware, placement):  # after the checks (an error stays one line)
        reporter.message(f"probe: {warning}")
    if (said := threads_over_cores(constraints.get("num_threads"), placement.rank_cores)) is not None:
        reporter.message(said)
    name = config.study or study_name(config, device, workload)
    check_one_study(out, name, local=config.storage is None)
    fresh = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    storage = config.storage or sqlite_url(out / "study.db")
    shared, crew = is_shared(storage), None
    try:
        with ExitStack() as stack:  # on an error below, both are released at once
            stack.enter_context(OutputLock(out))
            if stale_list(out, workload.data):  # an earlier stop's list of bad images: this run finds its own, if any
                with contextlib.suppress(OSError):
                    (out / LIST_FILE).unlink()
            seed = (config.seed + os.getpid()) % 2**32 if shared else config.seed  # workers sample apart
            study = SearchStudy.open(storage, name, sampler=config.sampler, seed=seed, trials=config.trials, shared=shared,
                                     parallel=placement.parallel, in_out=config.storage is None, pins=config.pins)
            stack.callback(close_connections, study.study._storage)  # last, once the study is released: no file left open
            if shared:
                crew = Crew(study, wait_s=patience_s(config.trial_seconds, config.timeout_s))
                stack.callback(elections.withdraw, study.study, crew.me)  # however it ends: its elections go on without it
                add_pending(study, out, reporter.message)  # before the stale trials: the measured one is not queued again
                stale = crew.join(signature(config, workload, machine_fingerprint(hardware, device), len(placement.slots)))
            else:
                study.claim()
                stack.callback(study.release)
                add_pending(study, out, reporter.message)  # before recover(): a measured defaults trial is not queued again
                kept = study.calibration_runs()
                searched = signature(config, workload, machine_fingerprint(hardware, device), len(placement.slots))
                study.check_signature(searched, in_out=config.storage is None)
                if kept and not study.calibration_runs():  # a study holding nothing else takes the new settings
                    runs = counted(sum(map(len, kept.values())), "calibration run")
                    reporter.message(f"dropped the {runs} that a search with other settings kept here (it stopped before its "
                                     "calibration ended): they measured that search, not this one")
                stale = study.recover()
            with nothing_left_if_stopped(study, shared):  # after the signature: a refused rerun writes no JPEGs
                write_synthetic(workload, reporter.message, stop_requested)  # a stop whose interrupt was swallowed
            if stale:  # the reporter's lines while the stack holds the lock: one that raises (a Ctrl-C) releases it
                reporter.message(f"left running by a search that died, marked failed: {', '.join(f'trial #{n}' for n in stale)}")
            cores = counted(int(hardware.cpu.usable_cores), "usable CPU core")
            reporter.message(f"{workload.describe(placement.world_size)} ({device.label}); {cores}")
            if placement.world_size > 1 or placement.parallel:
                reporter.message(placement.describe(workload.iterable))
            held = stack.pop_all()
    except BaseException:
        if fresh:  # made just now and holding nothing of value: leave no trace
            shutil.rmtree(out, ignore_errors=True)
        raise
    return Prepared(hardware, device, workload, study, out, held, placement, crew, out if fresh else None)
