"""The host a test with a fake trial runner pretends to be, so its outcome does not depend on the CI machine's CPU."""

from __future__ import annotations

import dataclasses

import pytest


def pretend_bf16_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the hardware probe report a CPU with native bf16 (AVX-512 BF16), as on the hosts that offer bf16 in the space.

    For searches whose fake runner's numbers assume bf16 among the precisions (fp32 with workers never fits there): on an
    AVX2-only host the space is fp32 only and such a search ends otherwise. Real trials must not run under it.
    """
    import probes

    real = probes.collect

    def collect() -> probes.Hardware:
        hardware = real()
        return dataclasses.replace(hardware, cpu=dataclasses.replace(hardware.cpu, bf16=True, bf16_flags=("avx512_bf16",)))

    monkeypatch.setattr(probes, "collect", collect)
