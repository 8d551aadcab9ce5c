"""In CI, a skipped integration test fails; elsewhere it is a skip (tests/ci_skips.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

CASES = """
import pytest

@pytest.mark.integration
def test_real_host_skips():
    pytest.skip("no sshd here")

@pytest.mark.integration
@pytest.mark.skipif(True, reason="no cron here")
def test_real_host_skipif():
    pass

def test_unit_skip():
    pytest.skip("unit tests may skip")
"""


@pytest.mark.parametrize("ci, strict", [("true", True), ("1", True), ("", False), ("false", False)])
def test_integration_skips_fail_only_in_ci(tmp_path, ci, strict):
    (tmp_path / "test_cases.py").write_text(CASES)
    env = {**os.environ, "CI": ci, "PYTHONPATH": str(TESTS)}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "ci_skips", "-p", "no:cacheprovider",
                        "-o", "markers=integration", str(tmp_path / "test_cases.py")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    summary = r.stdout.strip().splitlines()[-1]
    if strict:  # a skip in the test body fails it; a skipif mark fails its set-up (an error)
        assert r.returncode == 1 and "1 failed, 1 skipped, 1 error" in summary, r.stdout
        assert "): Skipped: no sshd here" in r.stdout and "): Skipped: no cron here" in r.stdout, r.stdout
    else:
        assert r.returncode == 0 and "3 skipped" in summary, r.stdout
