"""A bug inside clusterddp: one line naming what failed and where the traceback was written, exit 1."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

from typer.testing import CliRunner

from clusterddp.backends.ssh import launch as jobs
from clusterddp.cli.app import app
from helpers import REPO


def _crash_files(state) -> list:
    return sorted((state / "clusterddp").glob("crash-*.txt"))


def test_an_internal_error_is_one_line_and_a_private_crash_report(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))

    def broken(*a, **k):
        raise RuntimeError("boom\nsecond line")
    monkeypatch.setattr(jobs, "prepare", broken)
    (tmp_path / "t.py").write_text("print('hi')\n")
    r = CliRunner().invoke(app, ["up", "local", str(tmp_path / "t.py"), "--runs-dir", str(tmp_path / "runs")])
    assert r.exit_code == 1, r.output
    [crash] = _crash_files(tmp_path / "state")
    lines = r.output.strip().splitlines()
    assert lines == [f"internal error in `clusterddp up`: RuntimeError: boom; details written to {crash} "
                     "(please attach it to a bug report)"], r.output
    assert "Traceback" not in r.output
    text = crash.read_text()
    assert "Traceback (most recent call last)" in text and "RuntimeError: boom" in text and "in broken" in text
    assert stat.S_IMODE(crash.stat().st_mode) == 0o600
    assert stat.S_IMODE(crash.parent.stat().st_mode) == 0o700

    # Ctrl-C stays "interrupted", 130, and writes no report; click's own errors stay exit 2
    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(jobs, "prepare", interrupted)
    r = CliRunner().invoke(app, ["up", "local", str(tmp_path / "t.py"), "--runs-dir", str(tmp_path / "runs")])
    assert (r.exit_code, r.output.strip()) == (130, "interrupted")
    r = CliRunner().invoke(app, ["up", "local", str(tmp_path / "t.py"), "--gpus", "x"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert len(_crash_files(tmp_path / "state")) == 1


def test_an_internal_error_in_a_real_process(tmp_path):
    """The installed command, a fault planted from outside (sitecustomize), no hook in clusterddp."""
    plant = tmp_path / "plant"
    plant.mkdir()
    (plant / "sitecustomize.py").write_text(
        "import clusterddp.store as s\n"
        "def broken(self, *a, **k):\n    raise KeyError('planted')\n"
        "s.RunStore.list = broken\n")
    env = {**os.environ, "PYTHONPATH": f"{plant}{os.pathsep}{REPO / 'tests'}", "XDG_STATE_HOME": str(tmp_path / "st")}
    r = subprocess.run([sys.executable, "-m", "clusterddp", "runs", "--runs-dir", str(tmp_path / "runs")],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    [crash] = _crash_files(tmp_path / "st")
    assert r.returncode == 1, r.stderr
    assert r.stderr == (f"internal error in `clusterddp runs`: KeyError: 'planted'; details written to {crash} "
                        "(please attach it to a bug report)\n")
    assert "KeyError: 'planted'" in crash.read_text()


def test_without_a_writable_state_folder_the_traceback_is_printed(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "file"))  # not a folder: the report cannot be written
    monkeypatch.setattr(jobs, "prepare", lambda *a, **k: 1 / 0)
    (tmp_path / "t.py").write_text("")
    r = CliRunner().invoke(app, ["up", "local", str(tmp_path / "t.py")])
    assert r.exit_code == 1
    assert "ZeroDivisionError" in r.output and "Traceback (most recent call last)" in r.output
    assert "could not write a crash report" in r.output
