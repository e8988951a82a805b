"""How a failure inside a trial becomes a status: oom, diverged, bad_data or error.

Nothing is raised to the parent: :func:`classify` maps any exception to a
:class:`~autotune.records.TrialResult`.
"""

from __future__ import annotations

from autotune.errors import AutotuneError, is_out_of_memory
from autotune.records import TrialResult
from autotune.workloads.batches import hinted
from autotune.workloads.data import BadData
from probes.cgroup import oom_kills


class BudgetExceeded(AutotuneError):
    """Peak memory went above the user's --max-memory."""


class CompileFailed(AutotuneError):
    """torch.compile could not compile the model (status ``error``, the reason in one line)."""


class Diverged(AutotuneError):
    """The loss became NaN or infinite."""


def _one_line(exc: BaseException) -> str:
    """The first line of the message, after the exception's type (the user's or a library's: it says
    what failed); autotune's own errors are worded for the user and keep their message alone."""
    text = str(exc).strip().splitlines()
    first = next((ln.strip() for ln in text if ln.strip()), "")
    if isinstance(exc, AutotuneError) and first:
        return first[:300]
    return f"{type(exc).__name__}: {first}"[:300] if first else type(exc).__name__


def classify(exc: BaseException) -> TrialResult:
    """Map an exception raised in a trial to its result status."""
    if isinstance(exc, BudgetExceeded):
        return TrialResult(status="oom", error=str(exc))
    if isinstance(exc, Diverged):
        return TrialResult(status="diverged", error=str(exc))
    if isinstance(exc, CompileFailed):
        return TrialResult(status="error", error=str(exc))
    if isinstance(exc, BadData):
        # Re-raised from a loader worker, the message is the worker's whole
        # traceback; its last line is the original one, naming the file or item.
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        last = lines[-1] if lines else ""
        return TrialResult(status="bad_data", error=last.split(f"{type(exc).__name__}: ", 1)[-1][:400])
    message = str(exc)
    if "DataLoader worker" in message:
        # PyTorch re-raises a worker's exception with the original traceback as text: keep its last line.
        lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
        cause = lines[-1] if len(lines) > 1 else _one_line(exc)
        return TrialResult(status="error", error=hinted(f"failed in a DataLoader worker, not in the training loop: {cause}"[:300]))
    if is_out_of_memory(exc):
        return TrialResult(status="oom", error=_one_line(exc))
    return TrialResult(status="error", error=hinted(_one_line(exc)))


#: The words of a SIGKILL the kernel's OOM killer did not send (:func:`killed`).
KILLED_FROM_OUTSIDE = "was killed (SIGKILL) from outside"


def killed(who: str, oom_before: int | None) -> TrialResult:
    """The result of ``who`` killed by SIGKILL: ``oom`` unless the kernel's OOM kill counters, read before it started
    (``oom_before``), show the OOM killer did not act since (then someone else killed it: it says nothing of the setup's
    memory, and a memory pre-pass must not shrink the batch range for it)."""
    if oom_before is not None and oom_kills() == oom_before:  # counters read both times, and unchanged
        return TrialResult(status="error", error=f"{who} {KILLED_FROM_OUTSIDE}; not by the kernel's out-of-memory killer "
                                                 "(its oom_kill counters did not change): by a user, a supervisor or a "
                                                 "user-space OOM daemon (earlyoom, systemd-oomd)")
    return TrialResult(status="oom", error=f"{who} was killed (SIGKILL), most likely by the kernel's out-of-memory killer")
