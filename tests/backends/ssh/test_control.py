"""`stop` and `status` on real processes, through the real CLI: the local transport and a stand-in
`python` (as in test_supervisor.py), so this takes seconds; the SSH path is in test_control_ssh.py."""

from __future__ import annotations

import re

from clusterddp.backends.ssh import launch as jobs
from clusterddp.record import NodeState, RunStatus
from clusterddp.store import RunStore
from helpers import cddp, eventually
from test_supervisor import job_pids, make_plan


def node_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("  ")]


def test_stop_and_status_say_the_same_words(tmp_path):
    p = make_plan(tmp_path, {"a": "hang", "b": "ok"})
    store = RunStore(tmp_path / "runs")
    prep = jobs.Prepared(p, store, tmp_path)
    store.create(jobs.new_record(prep, str(tmp_path / "inv.yaml")))
    jobs.execute(prep, lambda h, b: None, detach=True)
    run_id = p.run_id
    b_done = tmp_path / "b" / "runs" / run_id / ".clusterddp" / "b" / "exit_code"
    assert eventually(b_done.is_file, 30)  # b's job ends by itself; a's runs until stopped

    stop = cddp("stop", run_id, "--runs-dir", str(store.root), "--grace", "2", check_rc=0, timeout=60).stdout
    assert eventually(lambda: not job_pids(p), 10)
    status = cddp("status", run_id, "--runs-dir", str(store.root), check_rc=0, timeout=60).stdout
    assert stop.splitlines()[0] == status.splitlines()[0] == f"run {run_id}: stopped"
    # stop adds how it ended each job, after a `;`; the words before it are the ones status prints
    assert node_lines(stop) == ["  a: stopped (exit code 143: SIGTERM); ended by SIGTERM",
                                "  b: succeeded (exit code 0); nothing left to stop"]
    assert [re.sub(r"; .*$", "", line) for line in node_lines(stop)] == node_lines(status)

    rec = store.load(run_id)
    assert rec.status is RunStatus.STOPPED and rec.exit_code == 130
    assert [(n.state, n.exit_code) for n in rec.nodes] == [(NodeState.STOPPED, 143), (NodeState.SUCCEEDED, 0)]
    assert "hello from b rank 1" in (store.run_dir(run_id) / "logs" / "b.log").read_text()  # stop collected it
