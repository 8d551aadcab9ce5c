"""Leases are all or nothing across nodes (issue 22, section 5), on 2 real sshd hosts and real torchrun:
a run refused on its second node gives back what it took on the first, and holds nothing there while
it waits its turn. Mutation that the older lease tests let through (each of them holds every slot, or
asks the first node in order): the release in the ``except`` of ``leases.try_acquire`` removed."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from helpers import cddp, cddp_popen, eventually, job_pids, job_script, wait_for_line
from test_leases_ssh import JOB, id_in, seen, start, user

pytestmark = pytest.mark.integration


def lease_files(node) -> list[str]:
    """The lease records in a node's lease folder (``<workdir>/leases/<hostname>``; hostname = name)."""
    return sorted(p.name for p in (Path(node.workdir) / "leases" / node.name).glob("lease-*.json"))


def listed(inv: Path) -> dict[str, dict]:
    hosts = json.loads(cddp("leases", str(inv), "--json", check_rc=0).stdout)["hosts"]
    return {h["host"]: h for h in hosts}


def test_a_run_refused_on_its_second_node_holds_nothing_on_the_first_even_while_it_waits(make_bed, tmp_path):
    bed = make_bed(2)  # a private bed: a holder left by a failing test would keep the slots from later tests
    job = job_script(tmp_path, "job.py", JOB)
    inv = bed.write_inventory(tmp_path / "inv.yaml")
    runs, hold = tmp_path / "runs", tmp_path / "release"
    # Every launcher takes nodes in one order (address, port, name): A holds the one taken second only.
    first, second = sorted(bed.nodes, key=lambda n: (n.address, 22, n.name))
    try:
        a = start(inv, job, runs, "--hosts", second.name, hold=hold)
        seen(bed, a, 2)
        assert [h["run"] for h in listed(inv)[second.name]["leases"]] == [a]
        assert listed(inv)[first.name]["leases"] == [] and lease_files(first) == []

        # B wants both nodes: it gets the first, is refused on the second, and gives the first back.
        r = cddp("up", str(inv), str(job), "--runs-dir", str(runs), check_rc=75)
        assert f"it needs 2 slot(s) on {second.name}" in r.stderr, r.stderr
        assert f"held by run {a} of {user()}" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert lease_files(first) == [], "a refused run left a lease on the node it took first"

        p = cddp_popen("up", str(inv), str(job), "--runs-dir", str(runs), "--wait", "-e", f"HOLD_UNTIL={hold}")
        try:
            lines = wait_for_line(p, "waiting in the queue")
            b = id_in(lines[-1])
            assert a in lines[-1], lines[-1]
            # It waits: queued on both nodes, holding nothing on either, however long we look.
            assert eventually(lambda: all(b in [w["run"] for w in listed(inv)[n.name]["queue"]] for n in bed.nodes),
                              60), listed(inv)
            until = time.monotonic() + 6  # a few of its polls (one a second)
            while time.monotonic() < until:
                view = listed(inv)
                mine = [(n, x) for n, h in view.items() for x in h["leases"] if x["run"] == b]
                assert mine == [], f"run {b} holds slots while it waits: {mine}"
                assert view[first.name]["free"] == [0, 1], view[first.name]
                assert lease_files(first) == [], lease_files(first)
                assert not job_pids(b), "the waiting run started while A held its slots"
            hold.touch()  # A ends: B takes both nodes and runs
            rest = p.communicate(timeout=240)[0]
            assert p.returncode == 0, "".join(lines) + rest
        finally:
            p.kill()
        assert rest.count("SEEN ") == 4 and f"leased: {first.name} GPUs 0,1, {second.name} GPUs 0,1" in rest, rest
    finally:
        hold.touch()
    assert eventually(lambda: not job_pids(a) and not job_pids(b), 60)
    after = listed(inv)
    assert all(h["leases"] == [] and h["queue"] == [] and h["free"] == [0, 1] for h in after.values()), after
