"""The Slurm test bed itself (tests/slurmbed.py): a real cluster on the namespace nodes."""

from __future__ import annotations

import pytest

from helpers import eventually

pytestmark = [pytest.mark.integration]


def test_srun_runs_one_task_on_each_namespace_node_and_leaves_the_queue_empty(slurm):
    assert slurm.node_states() == {"node-1": "idle", "node-2": "idle"}
    out = slurm.client("srun", "-N2", "hostname", timeout=60).stdout.split()
    assert sorted(out) == ["node-1", "node-2"]  # each task ran in its own UTS namespace
    # and on its own network namespace: each node has the address the bed gave it
    addrs = slurm.client("srun", "-N2", "-l", "ip", "-o", "-4", "addr", "show", "dev", "eth0", timeout=60).stdout
    for node in slurm.bed.nodes:
        assert node.address + "/24" in addrs
    assert eventually(lambda: slurm.jobs() == [], timeout=30), slurm.jobs()  # COMPLETING, then gone
