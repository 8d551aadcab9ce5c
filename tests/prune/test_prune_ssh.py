"""`clusterddp prune` and the inventory's `keep_runs` on the test bed: real sshd nodes, real torchrun."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from clusterddp.record import RunStatus
from clusterddp.store import RunStore
from helpers import cddp, eventually, job_pids, job_script, make_record, run_id_of

pytestmark = pytest.mark.integration

JOB = r'''
import os, time
with open("ckpt.bin", "wb") as f:  # in the node's run folder: what prune must remove
    f.write(os.urandom(1 << 20))
print("wrote ckpt.bin", flush=True)
time.sleep(float(os.environ.get("CDDP_TEST_SLEEP", "0")))
'''


def node_folders(bed, run_id: str) -> list[bool]:
    """Whether each node's run folder exists (the nodes share this filesystem)."""
    return [(Path(n.workdir) / "runs" / run_id).is_dir() for n in bed.nodes]


def test_keep_runs_and_prune_remove_old_runs_everywhere_and_never_a_running_one(bed, tmp_path):
    runs = tmp_path / "runs"
    inv = bed.write_inventory(tmp_path / "inv.yaml", extra={"keep_runs": 2})
    script = job_script(tmp_path, "job.py", JOB)
    store = RunStore(runs)

    def up(*extra: str, rc: int = 0):
        return cddp("up", str(inv), str(script), "--runs-dir", str(runs), "--gpus", "1", *extra, check_rc=rc,
                    timeout=120)

    def prune(*args: str, rc: int = 0):
        return cddp("prune", *args, "--runs-dir", str(runs), check_rc=rc, timeout=120)

    long = run_id_of(up("--detach", "--master-port", "29533", "-e", "CDDP_TEST_SLEEP=600").stdout)
    assert eventually(lambda: len(job_pids(long)) >= 2, timeout=60)
    # An old run of this inventory whose record points outside a run folder: keep_runs must refuse it,
    # say so, and leave the run's exit code alone.
    dead = make_record("20200101-000000-dead", status=RunStatus.SUCCEEDED, inventory=str(inv.resolve()),
                       started_at="2020-01-01T00:00:00+00:00", ended_at="2020-01-01T00:01:00+00:00")
    store.create(replace(dead, nodes=tuple(replace(n, run_dir="/", control_dir="/.clusterddp") for n in dead.nodes)))
    short = [run_id_of(up().stdout) for _ in range(2)]
    r = up()
    short.append(run_id_of(r.stdout))
    # keep_runs 2, newest first: short[2], short[1] kept; short[0] removed; the long run is running
    assert f"keep_runs 2: removed {short[0]} (succeeded" in r.stdout, r.stdout + r.stderr
    assert f"keep_runs 2: kept {long}: its record says running" in r.stderr
    assert "keep_runs 2: not removed 20200101-000000-dead" in r.stderr and "is not <workdir>/runs" in r.stderr
    assert "points outside a run folder" in r.stderr
    assert node_folders(bed, short[0]) == [False, False] and not (runs / short[0]).exists()
    assert node_folders(bed, short[1]) == [True, True] and (runs / short[1] / "run.json").is_file()
    assert node_folders(bed, long) == [True, True] and len(job_pids(long)) >= 2
    assert store.remove(dead.run_id, lambda rec: True)  # seen; out of the way of the exit codes below

    # A dry run names what would go, with sizes, and removes nothing.
    r = prune("--keep", "1", "--inventory", str(inv), "--dry-run")
    assert f"would remove {short[1]} (succeeded" in r.stdout and "node1 1." in r.stdout, r.stdout
    assert "nothing was removed" in r.stdout
    assert node_folders(bed, short[1]) == [True, True] and (runs / short[1]).is_dir()

    # A record that says the long run ended (edited by hand, or a stale one): the nodes still see its
    # processes, so nothing of it goes, and prune says why and exits 1.
    store.update(long, lambda rec: replace(rec, status=RunStatus.SUCCEEDED, ended_at="2026-01-01T00:00:00+00:00"))
    r = prune("--keep", "1", "--inventory", str(inv), rc=1)
    assert f"removed {short[1]} " in r.stdout and f"not removed {long} " in r.stderr, r.stdout + r.stderr
    assert "node1 running" in r.stderr and "node2 running" in r.stderr
    assert node_folders(bed, long) == [True, True] and (runs / long / "run.json").is_file()
    assert len(job_pids(long)) >= 2
    assert node_folders(bed, short[1]) == [False, False] and not (runs / short[1]).exists()

    # Once its job has ended, it goes like any other.
    cddp("stop", long, "--runs-dir", str(runs), "--grace", "2", check_rc=0, timeout=120)
    r = prune("--keep", "1", "--inventory", str(inv))
    assert f"removed {long} (" in r.stdout, r.stdout + r.stderr
    assert node_folders(bed, long) == [False, False] and not (runs / long).exists()
    assert [row["run_id"] for row in store.list()] == [short[2]]
    assert node_folders(bed, short[2]) == [True, True]
