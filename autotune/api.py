"""The Python API: :func:`search` and :func:`trial`, the same as the CLI commands.

Example::

    import autotune

    result = autotune.search(workload="mypkg.train:make_task", trials=30, device="cuda")
    print(result.setup.describe(), result.samples_per_s, result.speedup, result.best_json)

    one = autotune.trial(workload="mypkg.train:make_task", setup=autotune.TrainSetup(batch_size=64, num_workers=2))
    print(one.status, one.samples_per_s)

A workload given as a function must be importable by the trial processes:
define it at the top level of a module, not in ``__main__`` or as a lambda.
Errors are :class:`~autotune.errors.AutotuneError` subclasses, raised before
anything is written when the input is bad; a refusal names the function's
parameters (``trial_seconds``, ``constraints``) where the CLI's names its flags.
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from autotune.api_results import SearchResult, TrialOutcome, in_api_words
from autotune.errors import SearchInterrupted, SearchStopped, SetupError, UsageError, check_bool, interrupted_in, worded_for_python
from autotune.files import check_temp_dir_for_workers
from autotune.records import DEFAULT_TRIAL_SECONDS, TrialOptions, Workload
from autotune.redact import recorded_call
from autotune.train_setup import TrainSetup
from autotune.tuner import Reporter, SearchConfig, run_search
from autotune.tuner.config import check_synthetic_images, check_timeout, check_trial_seconds, parse_max_memory, path_of
from autotune.tuner.constraints import parse_constraints
from autotune.tuner.placement import Placement
from autotune.tuner.progress import check_reporter
from autotune.tuner.signals import imported_whole
from autotune.units import counted

__all__ = ["SearchResult", "TrialOutcome", "search", "trial"]

WorkloadRef = str | Callable[..., Any]

#: Refusal of a workload given together with the classifier shorthand's data.
WORKLOAD_AND_DATA = "give a workload (--workload) or the classifier shorthand (--model, --data, --image-size), not both"
#: The shorthand's defaults (SearchConfig's) of the options a workload has its own answer to (its Task's lr and dataset).
SHORTHAND_DEFAULTS = {f.name: f.default for f in dataclasses.fields(SearchConfig) if f.name in ("lr", "cache_dir", "synthetic_images")}


def _shorthand(
    workload: WorkloadRef | None, model: str | None, data: str | Path | None, image_size: int | None, default_model: str,
    **shorthand_only: Any,
) -> tuple[str, int]:
    """The classifier shorthand's model and crop size; refuses them next to a workload.

    Raises:
        UsageError: A workload given together with ``model``, ``data`` or
            ``image_size``, or with a ``shorthand_only`` option off its default
            (``lr``, ``cache_dir``, ``synthetic_images``: a Task has its own).
    """
    if workload is not None and (model is not None or data is not None or image_size is not None):
        raise UsageError(WORKLOAD_AND_DATA)
    changed = [name for name, value in shorthand_only.items() if value != SHORTHAND_DEFAULTS[name]]
    if workload is not None and changed:
        flags = ", ".join("--" + name.replace("_", "-") for name in changed)
        owns = " and ".join(w for w, on in (("learning rate", "lr" in changed), ("data", set(changed) - {"lr"})) if on)
        raise UsageError(f"{flags}: for the classifier shorthand only; a workload's Task sets its own {owns}")
    if model is not None and not isinstance(model, str):
        raise UsageError(f"--model must be a string, got {model!r}")
    from autotune.workloads.models import default_image_size

    model = model if model is not None else default_model
    return model, image_size if image_size is not None else default_image_size(model)


@worded_for_python({"set": "constraints", "timeout": "timeout_s"})
def search(
    workload: WorkloadRef | None = None,
    *,
    model: str | None = None,
    data: str | Path | None = None,
    image_size: int | None = None,
    trials: int = 30,
    device: str = "auto",
    out: str | Path = "autotune-out",
    trial_seconds: float = DEFAULT_TRIAL_SECONDS,
    effective_batch: int | None = None,
    max_memory: int | str | None = None,
    constraints: Sequence[str] = (),
    confirm_top: int = 3,
    confirm_rounds: int = 4,
    ceilings: bool = True,
    seed: int = 0,
    sampler: str = "tpe",
    study: str | None = None,
    storage: str | None = None,
    timeout_s: float | None = None,
    lr: float = 1e-3,
    cache_dir: str | Path | None = None,
    synthetic_images: int | None = None,
    reporter: Reporter | None = None,
    progress: bool = False,
    command: str | None = None,
    nproc_per_node: int = 1,
    devices: str | None = None,
) -> SearchResult:
    """Search the fastest training setup, as ``autotune search`` does.

    Args:
        workload: The user's workload factory (``"package.module:function"``
            or the function) returning an :class:`autotune.Task`; ``None``
            for the image-classifier shorthand (``model``, ``data``,
            ``image_size``, ``lr``).
        model: torchvision name or ``module:function`` (shorthand only; default resnet50).
        data: ImageFolder directory (shorthand only; ``None``: synthetic JPEGs).
        image_size: Crop size (shorthand only; default 224).
        trials: Finished trials wanted in the study.
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:K``.
        out: Output directory (``best.json``, ``trials.csv``, ``train.py``); ``~`` is the home directory, as in a shell.
        trial_seconds: Measured seconds per trial.
        effective_batch: Pin micro-batch x accumulation.
        max_memory: Memory budget (bytes or text such as ``"20GiB"``).
        constraints: ``--set`` items, e.g. ``["num_workers=0..2", "amp=bf16"]``.
        confirm_top: Finalists re-measured.
        confirm_rounds: Most interleaved rounds of re-measurement (fewer when
            the ranking settles after two).
        ceilings: Measure the winner computing alone and loading alone after
            the confirmation (two more runs), for a bottleneck verdict at the
            winner's own setup; ``False`` skips them (the verdict then uses the
            calibration's ceilings).
        seed: Sampler seed.
        sampler: ``tpe`` or ``random``.
        study: Study name.
        storage: Optuna storage URL.
        timeout_s: Per-trial timeout.
        lr: Learning rate at the reference batch (shorthand only; a Task has its own).
        cache_dir: Synthetic data cache (shorthand only).
        synthetic_images: Files in the synthetic dataset (shorthand only; None: 2000 on a CPU, 16384 on CUDA).
        reporter: Progress hooks (see :class:`autotune.tuner.Reporter`).
        progress: Draw the CLI's live progress on stderr (when no reporter is given).
        command: The command line recorded in best.json and train.py
            (default: names this function and the calling script).
        nproc_per_node: Ranks per trial: DDP trials under torch.distributed
            (gloo on a CPU, nccl on CUDA); ``effective_batch`` counts every rank.
        devices: Parallel single-device trials, one per device:
            ``"cuda:0,cuda:1"``, ``"all"``, or ``"cpu,cpu"`` (splits the cores).

    Returns:
        The winner, its confirmed speed and the files written.

    Raises:
        AutotuneError: Bad input (before anything is written), an unusable
            storage or no feasible trial.
        SearchStopped: Ctrl-C, SIGTERM or SIGHUP (finished trials kept): a
            ``KeyboardInterrupt``, which ``except AutotuneError`` lets through.
    """
    called = recorded_call(search, locals())  # the arguments as given, before any is read
    imported_whole()  # a Ctrl-C inside a lazy import left a broken module for the rest of the session
    model, image_size = _shorthand(workload, model, data, image_size, "resnet50", lr=lr, cache_dir=cache_dir,
                                   synthetic_images=synthetic_images)
    check_reporter(reporter)
    config = SearchConfig(
        model=model,
        trials=trials,
        image_size=image_size,
        data=None if data is None else path_of("--data", data),
        device=device,
        effective_batch=effective_batch,
        max_memory=parse_max_memory(max_memory),
        trial_seconds=trial_seconds,
        constraints=parse_constraints(constraints),
        out=path_of("--out", out),
        study=study,
        storage=storage,
        seed=seed,
        sampler=sampler,
        cache_dir=None if cache_dir is None else path_of("--cache-dir", cache_dir),
        synthetic_images=synthetic_images,
        confirm_top=confirm_top,
        confirm_rounds=confirm_rounds,
        ceilings=ceilings,
        lr=lr,
        timeout_s=timeout_s,
        command=command if command is not None else called,
        workload=workload,
        nproc_per_node=nproc_per_node,
        devices=devices,
    )
    try:
        if check_bool("progress", progress) and reporter is None:
            from autotune.render import RichReporter, console

            try:
                with RichReporter(console(stderr=True), words=in_api_words) as live:
                    outcome = run_search(config, live)
            except SearchInterrupted as exc:  # the best so far's notes, as the CLI's summary shows them
                _print_notes(getattr(exc.outcome, "best", None))
                raise
            _print_notes(outcome.best)
        else:
            outcome = run_search(config, reporter)
    except BaseException as exc:  # a stop, not an error: `except AutotuneError` in a loop of searches must let it through
        stop = interrupted_in(exc)  # also behind a second Ctrl-C that landed as the display was torn down
        if stop is None or stop.trial_stopped:
            raise
        raise SearchStopped(str(stop), stop.outcome) from None  # in the API's words through worded_for_python, not the CLI's
    best = outcome.best
    assert best is not None  # run_search raises instead
    return SearchResult(
        setup=best.setup,
        samples_per_s=best.samples_per_s,
        speedup=best.speedup,
        best_json=(outcome.out / "best.json").absolute(),  # found again after a notebook's %cd
        train_py=(outcome.out / "train.py").absolute(),
        verdict=in_api_words(outcome.verdict),
        notes=tuple(in_api_words(note) for note in best.notes),
        outcome=outcome,
    )


def _print_notes(best: Any) -> None:
    """The ``note:`` lines of ``best`` (a :class:`~autotune.output.best.Best`, or None) on stderr, unwrapped, as the CLI prints them."""
    from autotune.render import console

    stderr = console(stderr=True)
    for note in best.notes if best is not None else ():
        stderr.print(f"note: {in_api_words(note)}", style="yellow", markup=False, highlight=False, soft_wrap=True, crop=False)


def trial_workload(
    workload: WorkloadRef | None,
    *,
    model: str,
    image_size: int,
    data: str | Path | None,
    device: str,
    cache_dir: str | Path | None,
    synthetic_images: int | None,
    workers: bool, nproc_per_node: int = 1, warn: Callable[[str], None] | None = None, options: TrialOptions | None = None,
) -> tuple[Any, Any, Workload, Placement]:
    """``(hardware, device, workload, placement)`` of one trial: the probe, the device and ranks checked (before any
    synthetic JPEGs are written), and the checked workload (``warn``: build_workload's; ``options``: the run's, whose
    timeout a Task's factory must fit in)."""
    import probes
    from autotune.tuner.placement import place
    from autotune.workloads import build_workload
    from autotune.workloads.tasks import build_task_workload

    check_synthetic_images(synthetic_images, data)  # before the probe: a typo must not write 500 GB of JPEGs
    hardware = probes.collect()
    placement = place(device, None, nproc_per_node, hardware)  # resolves the device, checks the ranks
    dev = placement.device
    if workload is not None:
        if data is not None:
            raise UsageError(WORKLOAD_AND_DATA)
        return hardware, dev, build_task_workload(workload, device=dev.name, workers=workers, options=options, warn=warn), placement
    built = build_workload(
        model=model,
        image_size=image_size,
        data=None if data is None else path_of("--data", data),
        device=dev.name,
        cache_dir=None if cache_dir is None else path_of("--cache-dir", cache_dir),
        synthetic_images=synthetic_images, warn=warn,
    )
    return hardware, dev, built, placement


@worded_for_python({"timeout": "timeout_s"})
def trial(
    workload: WorkloadRef | None = None,
    *,
    setup: TrainSetup | None = None,
    model: str | None = None,
    data: str | Path | None = None,
    image_size: int | None = None,
    device: str = "auto",
    trial_seconds: float = DEFAULT_TRIAL_SECONDS,
    mode: str = "train",
    timeout_s: float | None = None,
    max_memory: int | str | None = None,
    cache_dir: str | Path | None = None,
    synthetic_images: int | None = None,
    announce: Callable[[str], None] | None = None,
    nproc_per_node: int = 1,
    task_batch: bool = False,
) -> TrialOutcome:
    """Run one short, isolated, measured trial of ``setup``, as ``autotune trial`` does.

    Args:
        workload: The user's workload factory, or ``None`` for the classifier shorthand.
        setup: The knobs (default: ``TrainSetup()``, PyTorch's defaults, at
            the Task's ``batch_size`` for a workload).
        model: torchvision name or ``module:function`` (shorthand only; default resnet18).
        data: ImageFolder directory (shorthand only).
        image_size: Crop size (shorthand only; default 224).
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:K``.
        trial_seconds: Measured steady-state seconds.
        mode: ``train``, ``compute`` (no loader) or ``loader`` (no model).
        timeout_s: Kill the trial after this many seconds.
        max_memory: Memory budget; a peak above it is an ``oom``.
        cache_dir: Synthetic data cache (shorthand only).
        synthetic_images: Files in the synthetic dataset (shorthand only; None: 2000 on a CPU, 16384 on CUDA).
        announce: Called with one line saying what is trained, once the
            workload is checked and before the trial starts (first with any
            data warning, and before synthetic JPEGs are written).
        nproc_per_node: Ranks of the trial: a DDP trial under
            torch.distributed (gloo on a CPU, nccl on CUDA), each rank on its
            share of the usable cores; samples/s counts every rank.
        task_batch: Measure at the Task's ``batch_size`` (a classifier's: ``setup.batch_size``), or all the
            samples when there are fewer, as a search's defaults (``autotune trial`` without ``--batch-size``).

    Returns:
        The setup, the workload and what was measured; a failed trial is a
        status, not an exception.

    Raises:
        AutotuneError: Bad input, found before the trial starts.
    """
    from autotune.runner import prestart, run_trial
    from autotune.tuner.explore import unfed
    from autotune.tuner.offered import COMPILED, autocast_refusal
    from autotune.tuner.pins import ddp_values
    from autotune.workloads.streams import UNSHARDED

    imported_whole()
    model, image_size = _shorthand(workload, model, data, image_size, "resnet18", cache_dir=cache_dir,
                                   synthetic_images=synthetic_images)
    if setup is not None and not isinstance(setup, TrainSetup):
        raise UsageError(f"setup must be an autotune.TrainSetup (autotune.load_setup(path) reads one from best.json), got {type(setup).__name__}")
    if announce is not None and not callable(announce):
        raise UsageError(f"announce must be a function called with one line, got {type(announce).__name__}")
    task_batch = check_bool("task_batch", task_batch) or setup is None
    setup = setup or TrainSetup()
    trial_seconds = check_trial_seconds(trial_seconds)
    timeout_s = check_timeout(timeout_s, trial_seconds)
    if nproc_per_node == 1 and (ddp := [knob for knob, (default,) in ddp_values(1).items() if getattr(setup, knob) != default]):
        raise SetupError(f"{ddp[0]}: a DDP knob; it changes nothing in a trial of one process (pass --nproc-per-node 2 or more)")
    if setup.num_workers > 0 and mode != "compute":  # their sockets must fit under TMPDIR, or the trial hangs to its timeout
        check_temp_dir_for_workers()
    prestart()  # the trial server's imports overlap the workload's checks below
    options = TrialOptions(trial_seconds=trial_seconds, timeout_s=timeout_s, max_memory_bytes=parse_max_memory(max_memory),
                           mode=mode)  # type: ignore[arg-type]
    hardware, dev, built, placement = trial_workload(
        workload,
        model=model,
        image_size=image_size,
        data=data,
        device=device,
        cache_dir=cache_dir,
        synthetic_images=synthetic_images,
        workers=setup.num_workers > 0, nproc_per_node=nproc_per_node, warn=announce,  # a minute or more before 16384 JPEGs on CUDA
        options=options,
    )
    share = built  # what one rank reads: the batch cap and the unrunnable check are per rank, as the search's
    if nproc_per_node != 1:
        options = dataclasses.replace(options, world_size=nproc_per_node, cores=placement.slots[0].cores)
        built = dataclasses.replace(built, device=placement.slots[0].device)
        share = placement.rank_workload(built)
    if task_batch:  # the Task's batch (a classifier's: 32), or all of fewer samples (as a search's defaults)
        base = built.reference_batch or setup.batch_size
        setup = setup.replace(batch_size=max(1, min(base, share.images or base)))
    setup.check_device(dev.name, bf16_supported=dev.bf16, tf32_supported=dev.tf32)
    if built.unsharded and setup.num_workers > 1:
        raise SetupError(f"num_workers={setup.num_workers}: {UNSHARDED}; use 0 or 1, or shard it")
    if setup.channels_last and not built.image_input:
        raise SetupError("channels_last: this workload's batches hold no 4-D floating tensor for it to act on")
    if setup.amp != "off" and (why := autocast_refusal(setup.amp, built)):  # as the search's space leaves it out
        raise SetupError(f"amp={setup.amp}: {why}")
    if setup.compile != "off" and built.compiled:  # compiling a compiled module: the search refuses it too
        raise SetupError(f"compile={setup.compile}: {COMPILED}; return the plain module to measure compiling against eager")
    fed = setup if mode == "train" else setup.replace(accumulation_steps=1)  # the loader alone: its batches and queue
    if mode != "compute" and (refused := unfed(fed, share, knob_terms=True)) is not None:  # as the search and train.py do
        raise SetupError(f"{refused}; a search never runs it")  # a SetupError: the CLI names the flags that set the knobs
    if announce is not None:
        ranks = f"; {nproc_per_node} DDP ranks, samples/s counts them all" if nproc_per_node > 1 else ""
        announce(f"trial: {built.describe()} ({dev.label}{ranks})")
    cores = len(options.cores) if options.cores else int(hardware.cpu.usable_cores)
    if setup.num_threads is not None and setup.num_threads > cores:  # measured at 9 samples/s against 200: said, as train.py says it
        said = (f"num_threads={setup.num_threads} is more than the {counted(cores, 'CPU core')} this trial may use: the threads share "
                "them, which slows the step")
        if announce is not None:
            announce(f"warning: {said}")
        else:
            warnings.warn(said, stacklevel=3)  # the caller's line, past worded_for_python's wrapper
    result = run_trial(setup, built, options)
    if result.status == "error" and result.error and built.task is None and "DataLoader worker" not in result.error:  # the model's:
        from autotune.workloads.models import size_hint  # the image size a classifier needs, as the search says it

        result = dataclasses.replace(result, error=result.error + size_hint(built, result.error, named_only=True))
    if result.status == "bad_data" and result.error:  # the folder's other bad images, as the search names them
        from autotune.workloads.scan import others_of

        result = dataclasses.replace(result, error=result.error + others_of(built, result.error).words())
    return TrialOutcome(setup=setup, workload=built, result=result)


cli_search, cli_trial = inspect.unwrap(search), inspect.unwrap(trial)  # for the CLI, whose refusals name its flags
