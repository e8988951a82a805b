"""Human-readable byte sizes and CPU quotas, shared by the warnings and the renderer."""

from __future__ import annotations

KIB = 1024
MIB = 1024**2
GIB = 1024**3


def format_bytes(n: int | None) -> str:
    """Format a byte count with binary units.

    Args:
        n: A number of bytes, or None when unknown.

    Returns:
        ``"23.5 GiB"`` from 1 GiB up, ``"64 MiB"`` below, ``"n/a"`` for None.
    """
    if n is None:
        return "n/a"
    if n >= GIB:
        return f"{n / GIB:.1f} GiB"
    if n >= MIB:
        return f"{n / MIB:.0f} MiB"
    if n >= KIB:
        return f"{n / KIB:.0f} KiB"
    return f"{n} B"


def format_cpus(quota: float) -> str:
    """A CPU quota as the warnings and the table say it: ``1 CPU``, ``1.5 CPUs``."""
    return f"{quota:g} CPU{'' if quota == 1 else 's'}"
