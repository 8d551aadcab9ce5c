"""`stop` and `status` on real processes, through the real CLI: the local transport and a stand-in
`python` (as in test_supervisor.py), so this takes seconds; the SSH path is in test_control_ssh.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

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
    # status prints each node as it answers (in the order they do), then the run's status, which needs them all
    assert status.splitlines()[0] == f"run {run_id}: looking at its 2 nodes"
    assert stop.splitlines()[0] == status.splitlines()[-1] == f"run {run_id}: stopped"
    # stop adds how it ended each job, after a `;`; the words before it are the ones status prints
    assert node_lines(stop) == ["  a: stopped (exit code 143: SIGTERM); ended by SIGTERM",
                                "  b: succeeded (exit code 0); nothing left to stop"]
    assert [re.sub(r"; .*$", "", line) for line in node_lines(stop)] == sorted(node_lines(status))

    rec = store.load(run_id)
    assert rec.status is RunStatus.STOPPED and rec.exit_code == 130
    assert [(n.state, n.exit_code) for n in rec.nodes] == [(NodeState.STOPPED, 143), (NodeState.SUCCEEDED, 0)]
    assert "hello from b rank 1" in (store.run_dir(run_id) / "logs" / "b.log").read_text()  # stop collected it


def test_a_detached_run_looked_at_later_records_its_nodes_own_end_and_runs_says_as_of_when(tmp_path):
    p = make_plan(tmp_path, {"a": "ok", "b": "ok"})
    store = RunStore(tmp_path / "runs")
    prep = jobs.Prepared(p, store, tmp_path)
    store.create(jobs.new_record(prep, str(tmp_path / "inv.yaml")))
    jobs.execute(prep, lambda h, b: None, detach=True)
    run_id = p.run_id
    done = {n.host.name: Path(n.control_dir) / "exit_code" for n in p.nodes}
    assert eventually(lambda: all(f.is_file() for f in done.values()), 30)
    # As the issue met it: started 10 min ago, its nodes' clocks say they ended 60 s and 65 s after the start
    start = int(time.time()) - 600
    store.update(run_id, lambda r: replace(r, started_at=datetime.fromtimestamp(start, timezone.utc).isoformat()))
    for f, after in ((done["a"], 60), (done["b"], 65)):
        os.utime(f, (start + after, start + after))

    # runs asks no node: a run that ended since its last look is running "as of" that look, and says so
    table = cddp("runs", "--runs-dir", str(store.root), check_rc=0)
    as_of = store.load(run_id).updated_at
    assert as_of and f"running (as of {as_of[11:19]})" in table.stdout, table.stdout
    assert f"`clusterddp status {run_id}` looks now" in table.stderr

    st = cddp("status", run_id[-4:], "--runs-dir", str(store.root), check_rc=0, timeout=60).stdout  # its random end
    assert st.splitlines()[-1] == f"run {run_id}: succeeded", st
    rec = store.load(run_id)
    assert rec.ended_at == datetime.fromtimestamp(start + 65, timezone.utc).isoformat(timespec="seconds")
    row = json.loads(cddp("runs", "--json", "--runs-dir", str(store.root), check_rc=0).stdout)[0]
    assert row["status"] == "succeeded" and row["ended_at"] == rec.ended_at
    table = cddp("runs", "--runs-dir", str(store.root), check_rc=0)
    assert "succeeded" in table.stdout and "1m05s" in table.stdout and "as of" not in table.stdout + table.stderr


def test_ctrl_c_during_the_collect_of_a_run_that_succeeded_records_it_succeeded(tmp_path, monkeypatch):
    p = make_plan(tmp_path, {"a": "ok", "b": "ok"})
    store = RunStore(tmp_path / "runs")
    prep = jobs.Prepared(p, store, tmp_path)
    store.create(jobs.new_record(prep, str(tmp_path / "inv.yaml")))

    def interrupted(*a, **kw):
        raise KeyboardInterrupt  # Ctrl-C while the logs come back
    monkeypatch.setattr(jobs, "collect_nodes", interrupted)
    said: list[str] = []
    try:
        jobs.execute(prep, lambda h, b: None, on_warn=said.append)
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("the Ctrl-C was swallowed")
    rec = store.load(p.run_id)
    assert rec.status is RunStatus.SUCCEEDED and rec.ended_at, rec.status  # the job's outcome, not the collect's
    assert [(n.state, n.exit_code) for n in rec.nodes] == [(NodeState.SUCCEEDED, 0)] * 2
    assert said == [f"[clusterddp] collect interrupted: the run is recorded succeeded; "
                    f"`clusterddp collect {p.run_id}` fetches its logs and files"]


def test_the_jobs_outcome_is_recorded_before_the_collect_begins(tmp_path, monkeypatch):
    # A launcher killed during the end-of-run collect (SIGKILL, a closed laptop) can record nothing more:
    # the record must already say what the job did, not running (issue 40)
    p = make_plan(tmp_path, {"a": "ok", "b": "ok"})
    store = RunStore(tmp_path / "runs")
    prep = jobs.Prepared(p, store, tmp_path)
    store.create(jobs.new_record(prep, str(tmp_path / "inv.yaml")))
    seen = []

    def looking(*a, **kw):
        seen.append(store.load(p.run_id))
        return []
    monkeypatch.setattr(jobs, "collect_nodes", looking)
    jobs.execute(prep, lambda h, b: None)
    (rec,) = seen
    assert rec.status is RunStatus.SUCCEEDED and rec.ended_at, rec.status
    assert [(n.state, n.exit_code) for n in rec.nodes] == [(NodeState.SUCCEEDED, 0)] * 2


def test_ctrl_c_after_the_start_before_the_watch_ends_the_jobs_and_records_the_stop(tmp_path, monkeypatch):
    p = make_plan(tmp_path, {"a": "hang", "b": "hang"})
    store = RunStore(tmp_path / "runs")
    prep = jobs.Prepared(p, store, tmp_path)
    store.create(jobs.new_record(prep, str(tmp_path / "inv.yaml")))

    def interrupted(self):
        raise KeyboardInterrupt  # Ctrl-C right after every node started
    monkeypatch.setattr(jobs.Mirror, "start", interrupted)
    try:
        jobs.execute(prep, lambda h, b: None)
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("the Ctrl-C was swallowed")
    try:
        assert eventually(lambda: not job_pids(p), 10), "the jobs run on after the Ctrl-C"
    finally:
        import subprocess

        from clusterddp import plan
        subprocess.run(["bash", "-c", "; ".join(plan.teardown_command(n, 1) for n in p.nodes)])
    rec = store.load(p.run_id)
    assert rec.status is RunStatus.STOPPED and [n.state for n in rec.nodes] == [NodeState.STOPPED] * 2


def test_logs_follow_ends_every_nodes_stream_once_its_output_pipe_closes(tmp_path):
    # `logs --follow | head -1` on a run of several nodes: once nobody reads, every node's stream ends at
    # once (its connection closed), not when that node's job ends: here, never (issue 40)
    from clusterddp import plan as ssh_plan
    from clusterddp.backends.ssh import control
    from clusterddp.errors import StdoutClosed
    p = make_plan(tmp_path, {"a": "hang", "b": "hang"})
    store = RunStore(tmp_path / "runs")
    prep = jobs.Prepared(p, store, tmp_path)
    store.create(jobs.new_record(prep, str(tmp_path / "inv.yaml")))
    jobs.execute(prep, lambda h, b: None, detach=True)
    got: dict[str, object] = {}

    def closed_pipe(host: str, data: bytes) -> None:
        if host == "a":
            raise StdoutClosed  # what the CLI's printer raises once a write finds the reader gone

    def follow() -> None:
        try:
            control.follow(store, p.run_id, closed_pipe, None, {})
        except BaseException as e:  # noqa: BLE001 - the way it ended is the assertion's
            got["ended"] = e
    t = threading.Thread(target=follow, daemon=True)
    try:
        t.start()
        t.join(60)  # both nodes' jobs run for 300 s: the follow ends only if it ends every stream itself
        assert not t.is_alive(), "the other node's stream went on after the pipe closed"
        assert isinstance(got.get("ended"), StdoutClosed), got
    finally:
        subprocess.run(["bash", "-c", "; ".join(ssh_plan.teardown_command(n, 1) for n in p.nodes)])
