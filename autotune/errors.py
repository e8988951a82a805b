"""The one exception family of autotune.

Every error a user can cause (bad input, unreadable files, impossible
setups) is an :class:`AutotuneError`. The CLI turns it into one red line and
an exit code; library users catch it like any other exception.
"""

from __future__ import annotations


class AutotuneError(Exception):
    """Base class of every error autotune raises on purpose.

    Attributes:
        exit_code: The process exit code the CLI uses for this error.
    """

    exit_code: int = 1


class UsageError(AutotuneError):
    """The user asked for something malformed (a bad flag value, a bad knob)."""

    exit_code = 2


class SetupError(UsageError):
    """A TrainSetup that cannot run: invalid or contradictory knobs."""


class WorkloadError(AutotuneError):
    """The model or data of a workload cannot be built."""


class ProbeError(AutotuneError):
    """The hardware could not be read."""


class StorageError(AutotuneError):
    """The study storage or the output directory is unusable."""


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
    """

    exit_code = 130

    def __init__(self, message: str, outcome: object | None = None) -> None:
        super().__init__(message)
        self.outcome = outcome
