"""A node's log is streamed to disk on the launcher, never held whole in memory (`logs`, `collect`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import cddp, job_script, run_id_of

pytestmark = pytest.mark.integration

MIB = 1 << 20


def peak_rss_mib(tmp_path: Path, *args: str) -> tuple[int, float, bytes]:
    """Run the real CLI; return its exit code, its peak resident memory and its stdout."""
    out = tmp_path / "out.bin"
    with open(out, "wb") as f:
        p = subprocess.Popen([sys.executable, "-m", "clusterddp", *args], stdout=f, stderr=subprocess.STDOUT,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
        _, status, usage = os.wait4(p.pid, 0)
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss / 1024, out.read_bytes()


def test_a_huge_node_log_goes_to_disk_in_chunks(bed, tmp_path):
    runs = tmp_path / "runs"
    inv = bed.write_inventory(tmp_path / "inv.yaml")
    script = job_script(tmp_path, "hello.py", "import os\nprint('hello from', os.environ['RANK'], flush=True)\n")
    run_id = run_id_of(cddp("up", str(inv), str(script), "--runs-dir", str(runs), "--gpus", "1", check_rc=0).stdout)

    # The nodes share this filesystem: grow node 1's log to 192 MiB, as a chatty two-day job would.
    node = bed.nodes[0]
    log = Path(node.workdir) / "runs" / run_id / ".clusterddp" / node.name / "node.log"
    line = b"x" * 1023 + b"\n"
    with open(log, "ab") as f:
        for _ in range(192):
            f.write(line * 1024)
        f.write(b"the very last line\n")
    size = log.stat().st_size

    rc, base, _ = peak_rss_mib(tmp_path, "status", run_id, "--runs-dir", str(runs))  # same imports, one SSH round
    assert rc == 0

    rc, rss, out = peak_rss_mib(tmp_path, "logs", run_id, "--runs-dir", str(runs), "--host", node.name, "--tail", "1")
    assert rc == 0 and out.rstrip().endswith(b"the very last line"), out[-300:]
    local = runs / run_id / "logs" / f"{node.name}.log"
    assert local.stat().st_size == size  # the local copy was refreshed whole
    assert rss < base + 64, f"logs --tail 1 of a {size / MIB:.0f} MiB log peaked at {rss:.0f} MiB (status: {base:.0f})"

    local.unlink()
    rc, rss, out = peak_rss_mib(tmp_path, "collect", run_id, "--runs-dir", str(runs))
    assert rc == 0, out[-2000:]
    assert local.stat().st_size == size
    assert rss < base + 64, f"collect of a {size / MIB:.0f} MiB log peaked at {rss:.0f} MiB (status: {base:.0f})"
