"""The stall watchdog on a real `up local` run that floods its log (issue 40): a plain script printing
8 MiB of debug lines between two progress lines, a step a second for 10 s, with `--stall-timeout 3`
and an epoch-only style regex. The watcher read at most 2 MiB a second, counted a progress line when
it reached it, and ended this healthy job as "hang: no rank made progress"; it now reads as fast as the
job writes (or says it is behind) and judges a line by when it was written: the run succeeds."""

from __future__ import annotations

import shutil
import subprocess
import sys

from helpers import record

FLOOD = r'''
import os, sys, time
junk = b"".join(b"NCCL INFO rank 0 debug dump %09d: channel 02/32 ring 0 -> 1 via P2P/IPC\n" % i
                for i in range(8 * 1048576 // 80))
for i in range(10):
    t = time.monotonic()
    os.write(1, junk)
    os.write(1, b"step %d\n" % i)
    time.sleep(max(0.0, 1.0 - (time.monotonic() - t)))
'''


def test_a_job_flooding_its_log_between_progress_lines_is_not_a_hang(tmp_path):
    (tmp_path / "flood.py").write_text(FLOOD)
    runs = tmp_path / "runs"
    try:
        r = subprocess.run([sys.executable, "-m", "clusterddp", "up", "local", "flood.py", "--gpus", "1",
                            "--skip-check", "--runs-dir", str(runs), "--stall-timeout", "3",
                            "--progress-regex", r"step (\d+)"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, timeout=600)
        [run] = [d.name for d in runs.iterdir() if d.is_dir()]
        rec = record(runs, run)
        assert (r.returncode, rec["status"]) == (0, "succeeded"), (r.stderr, rec.get("failure"))
        log = (runs / run / "logs" / "local.log").read_bytes()
        assert all(b"step %d\n" % i in log for i in range(10)) and b"stall:" not in log
    finally:
        shutil.rmtree(runs, ignore_errors=True)  # some 160 MiB of logs
