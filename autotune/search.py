"""The search: probe, calibrate, build the space, run Optuna, confirm, write.

``run_search`` is the library entry point behind ``autotune search``. Each
Optuna trial is one isolated :func:`~autotune.trial.run_trial`; infeasible
trials (oom, timeout, error, diverged) are recorded as finished trials worth
0 samples/s so the sampler learns to avoid their region, and they never stop
the study. The study lives in an Optuna storage (SQLite in the output
directory by default), so re-running the same command resumes it.
"""

from __future__ import annotations

import json
import signal
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from autotune import trial as _trial
from autotune.best import Best, write_best
from autotune.calibrate import Calibration, calibrate
from autotune.config import TrainSetup
from autotune.confirm import Candidate, Confirmed, confirm
from autotune.errors import AutotuneError, SearchFailed, StorageError, UsageError
from autotune.outputs import TrialRecord, check_writable, write_trials_csv
from autotune.pruning import SlowerThanBestPruner
from autotune.resolve import DeviceInfo, build_workload, resolve_device
from autotune.space import (
    Constraint,
    Space,
    build_space,
    check_constraints,
    defaults_setup,
    guess_setups,
    merge_constraints,
)
from autotune.trial import TrialOptions, TrialResult
from autotune.winner import bottleneck_verdict, make_best
from autotune.workload import Workload

ROLE_DEFAULTS = "defaults"
ROLE_GUESS = "guess"
ROLE_SEARCH = "search"


class SearchInterrupted(AutotuneError):
    """Ctrl-C (or SIGTERM) stopped the search; finished trials are kept."""

    exit_code = 130


@dataclass(frozen=True)
class SearchConfig:
    """Everything ``autotune search`` takes.

    Attributes:
        model: torchvision name or ``package.module:function``.
        trials: Finished trials wanted in the study, in total (resume included).
        image_size: Crop size fed to the model.
        data: ImageFolder directory, or None for synthetic JPEGs.
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:K``.
        effective_batch: Pin micro-batch x accumulation to this value.
        max_memory: Memory budget in bytes.
        trial_seconds: Measured seconds per trial.
        constraints: The user's ``--set`` pins and bounds.
        out: Output directory.
        study: Study name (default derived from the workload).
        storage: Optuna storage URL (default SQLite in ``out``).
        seed: Sampler seed.
        sampler: ``tpe`` (default) or ``random`` (a baseline for comparisons).
        cache_dir: Synthetic data cache.
        synthetic_images: Files in the synthetic dataset.
        confirm_top: Finalists re-measured.
        confirm_rounds: Interleaved rounds of re-measurement.
        lr: Learning rate at the reference batch.
        timeout_s: Per-trial timeout (None: derived from trial_seconds).
        command: The command line, for the record.
    """

    model: str
    trials: int
    image_size: int = 224
    data: Path | None = None
    device: str = "auto"
    effective_batch: int | None = None
    max_memory: int | None = None
    trial_seconds: float = 10.0
    constraints: tuple[Constraint, ...] = ()
    out: Path = Path("autotune-out")
    study: str | None = None
    storage: str | None = None
    seed: int = 0
    sampler: str = "tpe"
    cache_dir: Path | None = None
    synthetic_images: int = 2000
    confirm_top: int = 3
    confirm_rounds: int = 3
    lr: float = 1e-3
    timeout_s: float | None = None
    command: str = ""

    def validate(self) -> None:
        """Reject bad values before anything runs or is written.

        Raises:
            UsageError: With a one-line reason.
        """
        if self.trials < 1:
            raise UsageError(f"--trials must be >= 1, got {self.trials}")
        if self.effective_batch is not None and self.effective_batch < 1:
            raise UsageError(f"--effective-batch must be >= 1, got {self.effective_batch}")
        if not self.trial_seconds > 0:
            raise UsageError(f"--trial-seconds must be > 0, got {self.trial_seconds}")
        if self.confirm_top < 1 or self.confirm_rounds < 1:
            raise UsageError("--confirm-top and --confirm-rounds must be >= 1")
        if self.sampler not in ("tpe", "random"):
            raise UsageError(f"--sampler must be tpe or random, got {self.sampler!r}")
        if self.image_size < 8:
            raise UsageError(f"--image-size must be >= 8, got {self.image_size}")
        knobs = merge_constraints(self.constraints)
        if self.effective_batch is not None and "accumulation_steps" in knobs:
            raise UsageError("--effective-batch fixes accumulation_steps; do not --set it as well")


@dataclass(frozen=True)
class SearchOutcome:
    """What a search produced.

    Attributes:
        best: The winner (also written as best.json), None if interrupted
            before any feasible trial.
        records: Every finished trial.
        confirmed: The confirmation measurements (empty if interrupted).
        calibration: The pre-search measurements.
        verdict: Which side limits the training speed, in words.
        out: Output directory.
        storage: Storage URL of the study.
        study: Study name.
        interrupted: True if Ctrl-C stopped the search.
    """

    best: Best | None
    records: tuple[TrialRecord, ...]
    confirmed: tuple[Confirmed, ...]
    calibration: Calibration
    verdict: str
    out: Path
    storage: str
    study: str
    interrupted: bool = False
    files: tuple[str, ...] = field(default_factory=tuple)
    timing: "Timing | None" = None

    def to_dict(self) -> dict[str, Any]:
        """The final summary as JSON (``--json``)."""
        return {
            "best": self.best.to_dict() if self.best else None,
            "verdict": self.verdict,
            "interrupted": self.interrupted,
            "out": str(self.out),
            "storage": self.storage,
            "study": self.study,
            "files": list(self.files),
            "timing": asdict(self.timing) if self.timing else None,
            "calibration": self.calibration.to_dict(),
            "confirmation": [
                {
                    "setup": c.candidate.setup.to_dict(),
                    "label": c.candidate.label,
                    "samples_per_s": c.median,
                    "samples_per_s_spread": c.spread,
                    "measurements": list(c.values),
                    "failures": list(c.failures),
                }
                for c in self.confirmed
            ],
            "trials": [r.to_dict() for r in self.records],
        }


@dataclass
class Timing:
    """Where the time of a search went (this invocation only).

    Attributes:
        wall_s: Wall time of :func:`run_search`.
        measured_s: Steady-state windows measured, summed over every trial
            run (calibration, search trials, confirmation).
        runs: Trial processes started.
    """

    wall_s: float = 0.0
    measured_s: float = 0.0
    runs: int = 0


class _CountingRunner:
    """Wraps the trial runner to account measured time."""

    def __init__(self, timing: Timing) -> None:
        self.timing = timing

    def __call__(
        self,
        setup: TrainSetup,
        workload: Workload,
        options: TrialOptions,
        on_window: Callable[[int, float], bool] | None = None,
    ) -> TrialResult:
        result = _trial.run_trial(setup, workload, options, on_window=on_window)
        self.timing.runs += 1
        self.timing.measured_s += result.measured_s or 0.0
        return result


class Reporter:
    """Progress hooks; the CLI renders them with Rich. The default is silent."""

    def message(self, text: str) -> None:
        """A line of progress information."""

    def trial_started(self, done: int, total: int, role: str, setup: TrainSetup) -> None:
        """A trial begins (``done`` finished so far, ``total`` wanted)."""

    def trial_finished(self, done: int, total: int, record: TrialRecord, best: float | None) -> None:
        """A trial finished."""

    def confirm_progress(self, done: int, total: int, label: str, result: TrialResult) -> None:
        """A confirmation measurement finished."""


def _study_name(config: SearchConfig, device: DeviceInfo) -> str:
    model = config.model.replace(":", ".")
    name = f"{model}-{config.image_size}px-{device.name.replace(':', '')}"
    if config.effective_batch:
        name += f"-eb{config.effective_batch}"
    return name


def _signature(config: SearchConfig, workload: Workload) -> dict[str, Any]:
    return {
        "model": workload.model,
        "image_size": workload.image_size,
        "data": workload.data,
        "synthetic_images": workload.synthetic_images if workload.data is None else None,
        "device": workload.device,
        "effective_batch": config.effective_batch,
        "max_memory": config.max_memory,
        "trial_seconds": config.trial_seconds,
        "constraints": sorted(repr(c) for c in config.constraints),
    }


@contextmanager
def _signals_handled(signals: tuple[int, ...], handler: Callable[[int, Any], None]) -> Iterator[None]:
    """Run the block with ``handler`` on ``signals``; restore the previous handlers after.

    Outside the main thread signals cannot be handled: the block runs as is.
    """
    try:
        previous = {sig: signal.signal(sig, handler) for sig in signals}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    with _signals_handled((signal.SIGTERM,), handler):
        yield


@contextmanager
def _interrupts_held() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM until the block ends, then raise KeyboardInterrupt.

    Storage writes (ask, tell, user attributes) run inside it, so an
    interrupt never lands half-way through a database transaction; the
    trial itself runs outside it and stops at once.
    """
    caught: list[int] = []
    # A signal the process ignores (nohup) stays ignored.
    held = tuple(sig for sig in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(sig) is not signal.SIG_IGN)
    try:
        with _signals_handled(held, lambda signum, frame: caught.append(signum)):
            yield
    finally:
        if caught:
            raise KeyboardInterrupt


def _open_study(config: SearchConfig, storage: str, name: str, n_startup: int) -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    sampler: optuna.samplers.BaseSampler
    if config.sampler == "random":
        sampler = optuna.samplers.RandomSampler(seed=config.seed)
    else:
        sampler = optuna.samplers.TPESampler(
            seed=config.seed,
            n_startup_trials=n_startup,
            multivariate=True,
            group=True,
        )
    try:
        return optuna.create_study(
            storage=storage,
            study_name=name,
            direction="maximize",
            sampler=sampler,
            pruner=SlowerThanBestPruner(),
            load_if_exists=True,
        )
    except Exception as exc:  # sqlalchemy / redis / journal errors all differ
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StorageError(f"cannot open study storage {storage!r}: {first[:200]}") from None


def _startup_trials(config: SearchConfig, storage: str, name: str) -> int:
    """Random start-up trials of TPE: fixed when the study is created, so a
    resumed study (with a larger --trials) keeps the schedule it began with."""
    import optuna

    wanted = max(3, min(10, config.trials // 3))
    try:
        existing = optuna.load_study(study_name=name, storage=storage)
    except Exception:  # a new study (or an unreachable storage, reported when opened)
        return wanted
    return int(existing.user_attrs.get("n_startup_trials", wanted))


def _records(study: Any) -> list[TrialRecord]:
    from optuna.trial import TrialState

    records = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        if "setup" not in t.user_attrs or "result" not in t.user_attrs:
            continue
        records.append(
            TrialRecord(
                number=t.number,
                role=t.user_attrs.get("role", ROLE_SEARCH),
                setup=TrainSetup.from_dict(t.user_attrs["setup"]),
                result=TrialResult.from_dict(t.user_attrs["result"]),
                reused_from=t.user_attrs.get("reused_from"),
            )
        )
    return records


def _finished(study: Any) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))


def run_search(config: SearchConfig, reporter: Reporter | None = None) -> SearchOutcome:
    """Search the fastest setup for the workload; write best.json and trials.csv.

    Args:
        config: What to search and where to write.
        reporter: Progress hooks (silent by default).

    Returns:
        The outcome; ``best`` is the confirmed winner.

    Raises:
        UsageError: Bad input (nothing is written).
        WorkloadError: Unknown model, missing or empty data (nothing is written).
        StorageError: Unwritable output or unreachable storage.
        SearchFailed: Every trial failed.
        SearchInterrupted: Ctrl-C; finished trials are kept and the best so far
            is written.
    """
    import probes

    reporter = reporter or Reporter()
    config.validate()
    timing = Timing()
    began = time.monotonic()
    runner = _CountingRunner(timing)
    constraints = merge_constraints(config.constraints)
    hardware = probes.collect()
    device = resolve_device(config.device, hardware)
    check_constraints(constraints, device)  # before anything is written
    out = Path(config.out)
    if config.storage is None:
        check_writable(out)
    workload = build_workload(
        model=config.model,
        image_size=config.image_size,
        data=config.data,
        device=device.name,
        cache_dir=config.cache_dir,
        synthetic_images=config.synthetic_images,
        lr=config.lr,
    )
    name = config.study or _study_name(config, device)
    storage = config.storage
    if storage is not None:
        study = _open_study(config, storage, name, _startup_trials(config, storage, name))
        check_writable(out)
        out.mkdir(parents=True, exist_ok=True)
    else:
        out.mkdir(parents=True, exist_ok=True)
        storage = f"sqlite:///{(out / 'study.db').resolve()}"
        study = _open_study(config, storage, name, _startup_trials(config, storage, name))
    signature = _signature(config, workload)
    stored = study.user_attrs.get("signature")
    if stored is not None and stored != json.loads(json.dumps(signature)):
        raise StorageError(
            f"study {name!r} in {storage} was made for a different search "
            f"({_first_difference(stored, signature)}); pass --study NEW_NAME or another --out"
        )
    study.set_user_attr("signature", signature)
    if "n_startup_trials" not in study.user_attrs:
        study.set_user_attr("n_startup_trials", _startup_trials(config, storage, name))
    usable = int(hardware.cpu.usable_cores)
    reporter.message(
        f"{workload.model} @ {workload.image_size}px on {device.name} ({device.label}); "
        f"{usable} usable CPU cores; data: {workload.data or 'synthetic JPEGs (no --data given)'}"
    )
    if "calibration" in study.user_attrs:
        calibration = Calibration.from_dict(study.user_attrs["calibration"])
        reporter.message("calibration: reusing the measurements stored in the study")
    else:
        reporter.message("calibration: memory pre-pass, compute-only and loader-only ceilings")
        try:
            with _sigterm_as_interrupt():
                calibration = calibrate(
                    workload,
                    device,
                    usable_cores=usable,
                    available_bytes=int(hardware.memory.available_bytes),
                    max_memory=config.max_memory,
                    trial_seconds=config.trial_seconds,
                    bf16_ok=device.bf16,
                    log=reporter.message,
                    runner=runner,
                )
        except KeyboardInterrupt:
            raise SearchInterrupted(
                "interrupted during calibration, before the first trial; rerun the same command to start again"
            ) from None
        study.set_user_attr("calibration", calibration.to_dict())
    space = build_space(
        device=device,
        calibration=calibration,
        usable_cores=usable,
        effective_batch=config.effective_batch,
        constraints=constraints,
        images=workload.images,
    )
    reporter.message(_describe_space(space))
    defaults = defaults_setup(config.effective_batch)
    if not study.trials:
        study.enqueue_trial({}, user_attrs={"role": ROLE_DEFAULTS})
        if config.trials > 1 and config.sampler == "tpe":
            for guess in guess_setups(space, calibration, device, usable)[: config.trials - 1]:
                study.enqueue_trial(space.params_for(guess), user_attrs={"role": ROLE_GUESS})
    options = TrialOptions(
        trial_seconds=config.trial_seconds, timeout_s=config.timeout_s, max_memory_bytes=config.max_memory
    )
    interrupted = False
    files: list[str] = []
    try:
        with _sigterm_as_interrupt():
            _run_trials(study, space, defaults, workload, options, config.trials, out, reporter, runner)
    except KeyboardInterrupt:
        interrupted = True
    records = _records(study)
    write_trials_csv(out / "trials.csv", records)
    files.append(str(out / "trials.csv"))
    feasible = [r for r in records if r.result.ok and r.result.samples_per_s]
    if not feasible:
        if interrupted:
            raise SearchInterrupted(f"interrupted before any feasible trial; {len(records)} trials kept in {storage}")
        reasons = sorted({f"{r.result.status}: {r.result.error}" for r in records})
        raise SearchFailed(f"all {len(records)} trials failed ({'; '.join(reasons)[:300]})")
    confirmed: list[Confirmed] = []
    if not interrupted:
        try:
            with _sigterm_as_interrupt():
                confirmed = _confirm(study, feasible, defaults, workload, options, config, reporter, runner)
        except KeyboardInterrupt:
            interrupted = True
            confirmed = []
    best = make_best(config, workload, hardware, feasible, confirmed, defaults, records, interrupted)
    write_best(out / "best.json", best)
    files.append(str(out / "best.json"))
    try:
        from autotune.emit import write_script

        files.append(str(write_script(best, out / "train.py")))
    except ImportError:  # pragma: no cover - emit ships with the package
        pass
    verdict = bottleneck_verdict(best, calibration, records, device)
    timing.wall_s = time.monotonic() - began
    outcome = SearchOutcome(
        best=best,
        records=tuple(records),
        confirmed=tuple(confirmed),
        calibration=calibration,
        verdict=verdict,
        out=out,
        storage=storage,
        study=name,
        interrupted=interrupted,
        files=tuple(files),
        timing=timing,
    )
    if interrupted:
        raise SearchInterrupted(
            f"interrupted: {len(records)} finished trials kept in {storage}; best so far written to "
            f"{out / 'best.json'} (unconfirmed); rerun the same command to resume"
        )
    return outcome


def _first_difference(stored: dict[str, Any], current: dict[str, Any]) -> str:
    for key in sorted(set(stored) | set(current)):
        if stored.get(key) != json.loads(json.dumps(current.get(key))):
            return f"{key}: {stored.get(key)!r} there, {current.get(key)!r} now"
    return "settings differ"


def _describe_space(space: Space) -> str:
    parts = []
    for knob, values in space.values.items():
        if knob == "accumulation_steps" and space.effective_batch is not None:
            parts.append(f"accumulation_steps=effective_batch/batch_size ({space.effective_batch})")
            continue
        if knob in ("num_workers", "prefetch_factor") and len(values) > 1:
            parts.append(f"{knob}={min(values)}..{max(values)}")
        else:
            parts.append(f"{knob}={'|'.join(str(v).lower() if isinstance(v, bool) else str(v) for v in values)}")
    return "space: " + ", ".join(parts)


def _run_trials(
    study: Any,
    space: Space,
    defaults: TrainSetup,
    workload: Workload,
    options: TrialOptions,
    wanted: int,
    out: Path,
    reporter: Reporter,
    runner: _CountingRunner,
) -> None:
    from optuna.trial import TrialState

    while (done := _finished(study)) < wanted:
        trial = None
        try:
            with _interrupts_held():
                trial = study.ask()
                role = trial.user_attrs.get("role", ROLE_SEARCH)
                setup = defaults if role == ROLE_DEFAULTS else space.suggest(trial)
                reporter.trial_started(done, wanted, role, setup)
                previous = _same_setup(study, setup, trial.number)
                too_big = _larger_than_data(setup, workload)
            if too_big is not None:
                result = too_big
            elif previous is not None:
                result = TrialResult.from_dict(previous.user_attrs["result"])
            else:
                result = runner(setup, workload, options, on_window=_pruning_hook(trial, role))
            with _interrupts_held():
                if too_big is None and previous is not None:
                    trial.set_user_attr("reused_from", previous.number)
                trial.set_user_attr("role", role)
                trial.set_user_attr("setup", setup.to_dict())
                trial.set_user_attr("result", result.to_dict())
        except KeyboardInterrupt:
            if trial is not None:
                with _interrupts_held():
                    study.tell(trial, state=TrialState.FAIL)
            raise
        with _interrupts_held():
            if result.status == "pruned":
                study.tell(trial, state=TrialState.PRUNED)
            else:
                study.tell(trial, result.samples_per_s if result.ok and result.samples_per_s else 0.0)
            records = _records(study)
            write_trials_csv(out / "trials.csv", records)
            best = max((r.result.samples_per_s or 0.0 for r in records if r.result.ok), default=None)
            record = next(r for r in records if r.number == trial.number)
            reporter.trial_finished(_finished(study), wanted, record, best)


def _larger_than_data(setup: TrainSetup, workload: Workload) -> TrialResult | None:
    """An infeasible result, not run, for a step larger than the data."""
    if workload.images is None or setup.effective_batch() <= workload.images:
        return None
    return TrialResult(
        status="error",
        error=(
            f"batch {setup.batch_size} x {setup.accumulation_steps} accumulation = {setup.effective_batch()} "
            f"exceeds the {workload.images} training images: an epoch would hold no optimizer step"
        ),
    )


def _pruning_hook(trial: Any, role: str) -> Callable[[int, float], bool] | None:
    if role != ROLE_SEARCH:
        return None  # the defaults and the guesses are always measured in full

    def hook(index: int, value: float) -> bool:
        trial.report(value, step=index)
        return bool(trial.should_prune())

    return hook


def _same_setup(study: Any, setup: TrainSetup, number: int) -> Any:
    from optuna.trial import TrialState

    target = setup.to_dict()
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.number != number and t.user_attrs.get("setup") == target and "result" in t.user_attrs:
            return t
    return None


def _confirm(
    study: Any,
    feasible: list[TrialRecord],
    defaults: TrainSetup,
    workload: Workload,
    options: TrialOptions,
    config: SearchConfig,
    reporter: Reporter,
    runner: _CountingRunner,
) -> list[Confirmed]:
    ranked = sorted(feasible, key=lambda r: r.result.samples_per_s or 0.0, reverse=True)
    candidates: list[Candidate] = []
    seen: set[str] = set()
    for record in ranked:
        key = record.setup.to_json()
        if key in seen:
            continue
        seen.add(key)
        candidates.append(Candidate(key, record.setup, f"#{record.number} {record.setup.describe()}"))
        if len(candidates) == config.confirm_top:
            break
    default_key = defaults.to_json()
    defaults_ok = any(r.setup.to_json() == default_key for r in feasible)
    if defaults_ok and default_key not in seen:
        candidates.append(Candidate(default_key, defaults, f"defaults {defaults.describe()}"))
    stored: dict[str, Any] = dict(study.user_attrs.get("confirmation", {}))
    known = {k: (list(v[0]), list(v[1])) for k, v in stored.items()}

    def store(key: str, values: list[float], failures: list[str]) -> None:
        stored[key] = [values, failures]
        study.set_user_attr("confirmation", stored)

    reporter.message(
        f"confirmation: {len(candidates)} setups x {config.confirm_rounds} interleaved rounds "
        f"of {options.trial_seconds * 1.5:.0f} s"
    )
    confirm_options = replace(options, trial_seconds=options.trial_seconds * 1.5)
    return confirm(
        candidates,
        workload,
        confirm_options,
        rounds=config.confirm_rounds,
        known=known,
        store=store,
        on_measure=lambda done, total, cand, result: reporter.confirm_progress(done, total, cand.label, result),
        runner=runner,
    )



