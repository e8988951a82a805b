"""The one exception family of autotune.

Every error a user can cause (bad input, unreadable files, impossible
setups) is an :class:`AutotuneError`. The CLI turns it into one red line and
an exit code; library users catch it like any other exception.
"""

from __future__ import annotations

import errno
import functools
import inspect
import os
import re
import traceback
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
E = TypeVar("E", bound="AutotuneError")

#: What a call into the user's code (a factory, a dataset, a loss) may raise that a check turns into one line:
#: any exception, and ``SystemExit`` (a script's ``sys.exit()`` run on import or in the factory).
USER_CODE_ERRORS = (Exception, SystemExit)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` says memory ran out: ``MemoryError``, torch's ``OutOfMemoryError``, or a ``RuntimeError`` of
    the CPU allocator (``can't allocate memory``) or of a device (``out of memory``; a CUDA library's handle or
    workspace it could not allocate near a full card: cuBLAS's ``CUBLAS_STATUS_ALLOC_FAILED``, cuDNN's
    ``CUDNN_STATUS_ALLOC_FAILED``, nvjpeg's ``NVJPEG_STATUS_ALLOCATOR_FAILURE``)."""
    try:
        import torch

        oom_types: tuple[type[BaseException], ...] = (torch.OutOfMemoryError, MemoryError)
    except Exception:  # pragma: no cover - torch always imports where trials run
        oom_types = (MemoryError,)
    message = str(exc)
    return isinstance(exc, oom_types) or (
        isinstance(exc, RuntimeError) and ("can't allocate memory" in message or "out of memory" in message.lower()
                                           or any(status in message for status in CUDA_ALLOC_FAILURES))
    )


#: What CUDA libraries say when they cannot allocate on a full device (see :func:`is_out_of_memory`).
CUDA_ALLOC_FAILURES = ("STATUS_ALLOC_FAILED", "NVJPEG_STATUS_ALLOCATOR_FAILURE")


#: How PyTorch says that loader workers found /dev/shm full: a batch it cannot allocate there, or a worker's SIGBUS
#: (its message adds that the workers may be out of shared memory).
SHM_FULL = ("unable to allocate shared memory", "killed by signal: Bus error")


def is_shm_full(exc: BaseException) -> bool:
    """Whether ``exc`` says /dev/shm ran full: a ``RuntimeError`` of the DataLoader or its collate in PyTorch's words
    (:data:`SHM_FULL`), or an ``OSError`` ENOSPC that Python's multiprocessing raised (a /dev/shm with no room left: the
    DataLoader fails as it starts its workers, creating their queue's lock there, before any batch)."""
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return raised_in_multiprocessing(exc)
    return isinstance(exc, RuntimeError) and any(words in str(exc) for words in SHM_FULL)


def raised_in(exc: BaseException) -> list[str]:
    """The files of the frames ``exc``'s traceback passed through, outermost first (no source read)."""
    return [frame.f_code.co_filename for frame, _ in traceback.walk_tb(exc.__traceback__)]


def raised_in_multiprocessing(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside Python's ``multiprocessing`` (the innermost frame of its traceback is there)."""
    files = raised_in(exc)
    return bool(files) and f"{os.sep}multiprocessing{os.sep}" in files[-1]


#: What a command stopped (Ctrl-C, SIGTERM, SIGHUP) before it began says (``autotune/entry.py``, ``autotune/cli.py``).
BEFORE_START = "interrupted (before the command started)"


class AutotuneError(Exception):
    """Base class of every error autotune raises on purpose.

    Attributes:
        exit_code: The process exit code the CLI uses for this error.
    """

    exit_code: int = 1


class UsageError(AutotuneError):
    """The user asked for something malformed (a bad flag value, a bad knob)."""

    exit_code = 2


class StudyMismatch(UsageError):
    """The study holds another search's trials (a flag of the command differs): a usage error, as for an --out that
    holds another study's files."""


class SetupError(UsageError):
    """A TrainSetup that cannot run: invalid or contradictory knobs."""


class WorkloadError(AutotuneError):
    """The model or data of a workload cannot be built."""


class DataError(WorkloadError):
    """The data cannot be read now (a file that cannot be decoded, the directory gone): once it is fixed in place, the
    same command resumes the search, so what the search measured before it is kept.

    Args:
        message: What is wrong and what to do.
        if_kept: Said after ``message`` while the study that the error stops holds a measurement (what a rerun on
            the same ``--out`` must then respect); :attr:`alone` is the message without it, for a study removed.
        if_recalibrated: Said after :attr:`alone` instead while the study holds only an unfinished calibration's runs.
        outcome: Where bad data stopped the confirmation, the search's summary (a ``tuner.SearchOutcome`` marked
            interrupted) holding its best so far, as a stop there gives it (written to best.json, unconfirmed, unless
            an earlier run's confirmed winner stays there); None otherwise.
    """

    def __init__(self, message: str, *, if_kept: str = "", if_recalibrated: str = "", outcome: object | None = None) -> None:
        super().__init__(message + if_kept)
        self.alone = message
        self.if_recalibrated = if_recalibrated
        self.outcome = outcome


class MalformedReference(WorkloadError, UsageError):
    """A model or workload reference malformed as typed (empty, not ``package.module:function``, a file name where a module
    name goes): a usage error (exit 2), and still a :class:`WorkloadError` for the Python API's callers. A well-formed
    name that names nothing (an unknown model, a module that cannot be imported) is a :class:`WorkloadError` (exit 1)."""


class ProbeError(AutotuneError):
    """The hardware could not be read."""


#: How a trial's error begins where CUDA itself failed to start (:class:`DeviceError`): no setup and no model can run.
CUDA_START = "CUDA cannot start on"


class DeviceError(AutotuneError):
    """The device cannot be used at all (CUDA fails to start: a driver older than torch's CUDA build, a GPU in a bad
    state), whatever the model and the setup."""


class StorageError(AutotuneError):
    """The study storage or the output directory is unusable."""


class MalformedStorageURL(StorageError, UsageError):
    """A ``--storage`` value that is no storage URL as typed (a plain path, ``postgres://``, a space around it): a usage
    error (exit 2), and still a :class:`StorageError`; a well-formed URL whose database cannot be opened is exit 1."""


class PendingTrialsError(StorageError):
    """The file of measured trials a lost study storage could not take (``OUT/pending-trials.json``) cannot be read:
    the rerun that would add them to the study stops rather than drop them."""


class SearchFailed(AutotuneError):
    """A search finished without a single feasible trial."""


class EmitError(AutotuneError):
    """A training script could not be rendered (missing or corrupt best.json,
    a value that cannot be rendered safely)."""


class SearchInterrupted(AutotuneError):
    """Ctrl-C (or SIGTERM, SIGHUP) stopped the search; finished trials are kept.

    Attributes:
        outcome: The search's summary with the best setup so far (a
            ``tuner.SearchOutcome`` marked interrupted), or None when no
            trial had measured a throughput yet.
        trial_stopped: Nothing stopped this process: a trial was terminated from outside (earlyoom's SIGTERM, a
            supervisor's), which stops the search as a stop would.
    """

    exit_code = 130

    def __init__(self, message: str, outcome: object | None = None, *, trial_stopped: bool = False) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.trial_stopped = trial_stopped


class SearchStopped(KeyboardInterrupt):
    """What :func:`autotune.search` raises where a stop reached the process (Ctrl-C, SIGTERM, SIGHUP): a
    ``KeyboardInterrupt``, as Python raises for Ctrl-C, so that a loop of searches that skips failed ones with
    ``except autotune.AutotuneError`` (or ``except Exception``) stops as asked. Finished trials are kept. A trial
    terminated from outside, with no stop of this process, stays a :class:`SearchInterrupted`.

    Attributes:
        outcome: As :attr:`SearchInterrupted.outcome`: the best setup so far, or None.
    """

    def __init__(self, message: str, outcome: object | None = None) -> None:
        super().__init__(message)
        self.outcome = outcome


def interrupted_in(exc: BaseException) -> SearchInterrupted | None:
    """The search's interruption behind ``exc``: ``exc`` itself, or one it was raised while handling (a second Ctrl-C
    that landed as the first one's SearchInterrupted unwound, through the lock's release or the display's teardown).
    None where there is none."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, SearchInterrupted):
            return seen
        if isinstance(seen, SearchStopped):  # the Python API's form of it, which the CLI's search calls too
            return SearchInterrupted(str(seen), seen.outcome)
        # An error raised over it on purpose (``raise ... from None``: a storage that failed as the lock was released)
        # is said instead.
        seen = None if seen.__suppress_context__ else seen.__context__
    return None


class TrialInterrupted(AutotuneError):
    """Ctrl-C (or SIGTERM, SIGHUP) stopped ``autotune trial`` before its result; its processes and directory are gone."""

    exit_code = 130


def check_bool(name: str, value: object) -> bool:
    """``value`` when it is True or False.

    Raises:
        UsageError: Naming ``name``, for anything else ("no" and "x" are truthy in Python).
    """
    if not isinstance(value, bool):
        raise UsageError(f"{name} must be True or False, got {value!r}")
    return value


#: A ``--set`` pin as the CLI's messages write it: ``amp=off,bf16`` whole, a ``:`` or ``.`` after it left outside
#: (:func:`in_python_terms` and :func:`autotune.api_results.in_api_words` both read it).
PIN = r"[\w.]+=[^\s;()]*[^\s;(),.:]"


def as_called(text: str) -> str:
    """``text`` told to a caller of the Python API, who ran no command: "rerun the same command" as "... the same call"."""
    return text.replace("the same command", "the same call")


def in_python_terms(error: E, parameters: Collection[str], renamed: Mapping[str, str]) -> E:
    """``error`` naming a Python function's parameters where its message names the CLI's flags.

    ``--trial-seconds must be ...`` becomes ``trial_seconds must be ...`` for
    the API's callers, who never typed the flag. A flag without a parameter of
    that name (or a ``renamed`` one: ``--set`` is ``constraints``) is left as it is. A pin
    (``--set num_workers=0``) reads ``constraints=["num_workers=0"]``; "the same
    command" (rerun it) reads "the same call".

    Args:
        error: The refusal, worded for the CLI.
        parameters: The function's parameter names.
        renamed: Flags (without dashes) whose parameter has another name.
    """

    def named(found: re.Match[str]) -> str:
        flag = found.group(1)
        name = renamed.get(flag, flag.replace("-", "_"))
        return name if name in parameters else found.group(0)

    def pinned(found: re.Match[str]) -> str:  # ``--set num_workers=0`` as the list the API takes
        name = renamed.get("set", "set")
        return f'{name}=["{found.group(1)}"]' if name in parameters else found.group(0)

    message = re.sub(rf"(?<![\w-])--set ({PIN})", pinned, str(error))
    message = as_called(re.sub(r"(?<![\w-])--([a-z][a-z0-9-]*)", named, message))
    if message == str(error):
        return error
    return type(error)(message)


def worded_for_python(renamed: Mapping[str, str]) -> Callable[[F], F]:
    """Decorate an API function so that its errors name its parameters, not CLI flags (:func:`in_python_terms`): a
    :class:`UsageError`, and any other :class:`AutotuneError` made of its message alone (a :class:`StorageError`'s
    ``--out /proc/x cannot be created``; not one that carries more, such as :class:`SearchInterrupted`'s outcome), and
    a :class:`SearchStopped` (its outcome kept)."""

    def decorate(function: F) -> F:
        parameters = frozenset(inspect.signature(function).parameters)

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return function(*args, **kwargs)
            except SearchStopped as stop:  # a stop: "rerun the same command" to a caller who ran none
                said = str(in_python_terms(AutotuneError(str(stop)), parameters, renamed))
                if said == str(stop):
                    raise
                raise SearchStopped(said, stop.outcome) from None
            except AutotuneError as error:
                if type(error).__init__ is not AutotuneError.__init__:  # more than a message: kept as it is
                    raise
                translated = in_python_terms(error, parameters, renamed)
                if translated is error:
                    raise
                raise translated from error

        return wrapper  # type: ignore[return-value]

    return decorate
