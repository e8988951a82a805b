"""The test run's own rules (tests/conftest.py): what keeps CI green and within its time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("processes", [[], ["-n", "2"]], ids=["alone", "xdist"])
def test_a_hung_test_fails_at_the_time_limit_and_the_run_goes_on(tmp_path, processes: list[str]) -> None:
    """conftest's per-test limit: a test sleeping past it fails with the limit named, the next one still runs; so too in
    pytest-xdist processes, as the suite runs in (pyproject's addopts; two here: each starts torch)."""
    (tmp_path / "test_hangs.py").write_text("import time\n\n\ndef test_hangs():\n    time.sleep(60)\n\n\ndef test_after():\n    pass\n")
    tests = Path(__file__).parent
    env = {**os.environ, "AUTOTUNE_TEST_TIMEOUT_S": "1", "PYTHONPATH": str(tests)}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider", *processes, str(tmp_path)],
                         capture_output=True, text=True, env=env, timeout=180, cwd=tmp_path)
    assert "TimeoutError: the test ran over 1 s (AUTOTUNE_TEST_TIMEOUT_S)" in run.stdout, run.stdout
    assert "1 failed, 1 passed" in run.stdout and run.returncode == 1
