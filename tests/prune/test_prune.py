"""`clusterddp prune` without a test bed: which runs it chooses, the node command on real folders
(run by bash, as on a node), the refusal of paths a damaged record could hold, and store removal."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from clusterddp import prune as pruning
from clusterddp.errors import RunNotFound, UsageError
from clusterddp.nodescript import MARKER
from clusterddp.prune import prune_command, prune_target_problem
from clusterddp.record import RunStatus
from clusterddp.store import RunStore
from helpers import cddp, cddp_popen, eventually, run_id_of, wait_for_line
from helpers import make_record as rec

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


def _at(days_ago: float) -> str:
    return (NOW - timedelta(days=days_ago)).isoformat(timespec="seconds")


def _store_with(tmp_path, runs: list[tuple[str, float, RunStatus]], **fields) -> RunStore:
    store = RunStore(tmp_path / "runs")
    for run_id, days_ago, status in runs:
        store.create(rec(run_id, status=status, started_at=_at(days_ago), ended_at=None if status is RunStatus.RUNNING
                         else _at(days_ago), **fields))
    return store


def test_select_keeps_the_newest_n_and_younger_runs_and_never_chooses_a_running_one(tmp_path):
    store = _store_with(tmp_path, [("r1", 10, RunStatus.SUCCEEDED), ("r2", 8, RunStatus.RUNNING),
                                   ("r3", 6, RunStatus.FAILED), ("r4", 2, RunStatus.STOPPED),
                                   ("r5", 1, RunStatus.SUCCEEDED)])
    ids = lambda sel: [r.run_id for r in sel.remove]  # noqa: E731
    sel = pruning.select(store, pruning.Policy(keep=2), NOW)
    assert (ids(sel), sel.running, sel.kept) == (["r1", "r3"], ("r2",), 2)  # oldest first
    sel = pruning.select(store, pruning.Policy(older_than=5 * 86400), NOW)
    assert (ids(sel), sel.running, sel.kept) == (["r1", "r3"], ("r2",), 2)
    # both rules: a run goes only when neither keeps it
    sel = pruning.select(store, pruning.Policy(keep=1, older_than=7 * 86400), NOW)
    assert (ids(sel), sel.running) == (["r1"], ("r2",))
    assert ids(pruning.select(store, pruning.Policy(keep=0), NOW)) == ["r1", "r3", "r4", "r5"]
    assert ids(pruning.select(store, pruning.Policy(keep=0, inventory="/other/inv.yaml"), NOW)) == []
    assert ids(pruning.select(store, pruning.Policy(keep=4, inventory="/w/inv.yaml"), NOW)) == ["r1"]


@pytest.mark.parametrize("text, seconds", [("30m", 1800), ("12h", 43200), ("7d", 604800), ("2w", 1209600),
                                           ("1d12h", 129600), ("90s", 90)])
def test_ages(text, seconds):
    assert pruning.parse_age(text) == seconds


@pytest.mark.parametrize("text", ["", "7", "7 days", "d7", "-1d", "1d junk"])
def test_an_age_that_is_not_one_is_bad_input(text):
    with pytest.raises(UsageError, match="not an age"):
        pruning.parse_age(text)


GOOD = ("20261130-120000-ab12", "~/clusterddp", "~/clusterddp/runs/20261130-120000-ab12",
        "~/clusterddp/runs/20261130-120000-ab12/.clusterddp")


@pytest.mark.parametrize("run_id, workdir, run_dir, control_dir", [
    GOOD, ("r1", "/srv/w", "/srv/w/runs/r1", "/srv/w/runs/r1/.clusterddp"),
    ("r1", "w", "w/runs/r1", "w/runs/r1/.clusterddp/node-1"),
])
def test_a_run_folder_of_the_planned_shape_may_be_pruned(run_id, workdir, run_dir, control_dir):
    assert prune_target_problem(run_id, workdir, run_dir, control_dir) is None


@pytest.mark.parametrize("run_id, workdir, run_dir, control_dir", [
    ("r1", "/w", "/", "/.clusterddp"),                                 # the node's root
    ("r1", "/w", "/home/me", "/home/me/.clusterddp"),                  # not <workdir>/runs/<id>
    ("r1", "/w/../..", "/w/../../runs/r1", "/w/../../runs/r1/.clusterddp"),  # climbs out
    ("r1", "/w/./x", "/w/./x/runs/r1", "/w/./x/runs/r1/.clusterddp"),
    ("r1", "//", "//runs/r1", "//runs/r1/.clusterddp"),
    ("..", "/w", "/w/runs/..", "/w/runs/../.clusterddp"),              # the run id climbs
    ("r1/x", "/w", "/w/runs/r1/x", "/w/runs/r1/x/.clusterddp"),
    ("r1", "/w", "/w/runs/r1", "/elsewhere/.clusterddp"),              # control folder outside
    ("r1", "/w", "/w/runs/r1", "/w/runs/r1"),
    ("r1", "/w\n", "/w\n/runs/r1", "/w\n/runs/r1/.clusterddp"),
])
def test_a_damaged_record_cannot_point_prune_outside_a_run_folder(run_id, workdir, run_dir, control_dir):
    assert prune_target_problem(run_id, workdir, run_dir, control_dir)


def _bash(cmd: str) -> str:
    return subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, check=True, timeout=60).stdout


def test_the_node_command_removes_only_run_folders_whose_job_has_ended(tmp_path):
    """bash runs the rendered command on real folders, as a node's shell would."""
    runs = tmp_path / "work" / "runs"
    names = ["done", "it's $(touch pwned) two", "link", "no-control", "running", "absent"]
    for name in ("done", names[1], "running", "no-control"):
        (runs / name).mkdir(parents=True)
        (runs / name / "ckpt.pt").write_bytes(b"x" * 100_000)
        if name != "no-control":
            (runs / name / ".clusterddp").mkdir()
    outside = tmp_path / "precious"
    (outside / ".clusterddp").mkdir(parents=True)
    (runs / "link").symlink_to(outside)
    marker = f"prune-test-{os.getpid()}/node"
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                           env={**os.environ, MARKER: marker})
    try:
        targets = [(str(runs / n), marker if n == "running" else f"{n}/node") for n in names]
        dry = pruning.parse_reply(_bash(prune_command(targets, dry_run=True)), len(names))
        assert [w for w, _ in dry.values()] == ["would", "would", "refused", "refused", "running", "missing"]
        assert dry[0][1] and dry[0][1] >= 90  # KiB, as du counts them
        assert all((runs / n).exists() for n in names[:5])  # a dry run removes nothing
        done = pruning.parse_reply(_bash(prune_command(targets)), len(names))
        assert [w for w, _ in done.values()] == ["removed", "removed", "refused", "refused", "running", "missing"]
        assert sorted(p.name for p in runs.iterdir()) == ["link", "no-control", "running"]
        assert (outside / ".clusterddp").is_dir() and not (tmp_path / "pwned").exists()
    finally:
        job.kill()
        job.wait()
    # the same folder, once its job has ended
    assert pruning.parse_reply(_bash(prune_command([(str(runs / "running"), marker)])), 1)[0][0] == "removed"
    assert not (runs / "running").exists()


def test_local_runs_lose_their_folder_and_index_row_never_the_launch_directory(tmp_path):
    launch = tmp_path / "proj"
    launch.mkdir()
    (launch / "train.py").write_text("pass\n")
    store = _store_with(tmp_path, [("old", 3, RunStatus.SUCCEEDED), ("new", 1, RunStatus.FAILED)],
                        local=True, launch_dir=str(launch), inventory="local")
    (store.run_dir("old") / "logs" / "local.log").write_bytes(b"y" * 50_000)
    sel = pruning.select(store, pruning.Policy(keep=1), NOW)
    dry = pruning.prune(store, sel, dry_run=True)
    assert [(r.run_id, r.removed) for r in dry] == [("old", True)] and dry[0].local_bytes >= 50_000
    assert store.load("old")  # nothing removed by a dry run
    done = pruning.prune(store, sel)
    assert [(r.run_id, r.removed) for r in done] == [("old", True)]
    with pytest.raises(RunNotFound):
        store.load("old")
    assert [r["run_id"] for r in store.list()] == ["new"]
    assert sorted(p.name for p in store.root.iterdir() if not p.name.startswith("runs.db")) == ["new"]
    assert (launch / "train.py").exists()


def test_a_run_recorded_running_meanwhile_is_not_removed(tmp_path):
    store = _store_with(tmp_path, [("r1", 3, RunStatus.SUCCEEDED)], local=True)
    sel = pruning.select(store, pruning.Policy(keep=0), NOW)
    store.update("r1", lambda r: replace(r, status=RunStatus.RUNNING, ended_at=None))  # between select and prune
    [res] = pruning.prune(store, sel)
    assert not res.removed and "running" in (res.why_kept or "")
    assert store.load("r1").status is RunStatus.RUNNING


def test_a_run_in_use_is_left_whole_and_pruned_once_let_go(tmp_path):
    store = _store_with(tmp_path, [("r1", 3, RunStatus.SUCCEEDED), ("r2", 2, RunStatus.SUCCEEDED)], local=True)
    store = _store_with(tmp_path, [("r3", 1, RunStatus.FAILED)])  # on a host: its node folder is not asked for
    sel = pruning.select(store, pruning.Policy(keep=0), NOW)
    asked: list[str] = []

    def connect(host):
        asked.append(host.name)
        raise AssertionError("a run in use is not reached")
    collecting, ending = store.hold("r2"), store.hold("r3")  # a `collect` of r2; the `up` of r3, not exited
    assert collecting is not None and ending is not None
    try:
        results = {r.run_id: r for r in pruning.prune(store, sel, connect=connect)}
    finally:
        collecting.close()
        ending.close()
    assert results["r1"].removed and not results["r2"].removed and not results["r3"].removed
    assert results["r2"].why_kept == results["r3"].why_kept == pruning.IN_USE_WHY
    assert asked == [] and store.load("r2") and store.load("r3")
    again = {r.run_id: r for r in pruning.prune(store, pruning.select(store, pruning.Policy(keep=1), NOW))}
    assert again["r2"].removed and "r3" not in again


def test_a_run_being_pruned_is_not_collected_and_one_being_collected_is_not_pruned(tmp_path):
    store = _store_with(tmp_path, [("r1", 3, RunStatus.SUCCEEDED)], local=True)
    pruning_it = store.hold("r1", exclusive=True)
    assert pruning_it is not None and store.hold("r1") is None  # exclusive: no one else
    r = cddp("collect", "r1", "--runs-dir", str(store.root), check_rc=2)
    assert "run r1 is being pruned by another clusterddp command" in r.stderr and "Traceback" not in r.stderr
    pruning_it.close()
    one, two = store.hold("r1"), store.hold("r1")  # shared: two collects at once
    assert one is not None and two is not None and store.hold("r1", exclusive=True) is None
    one.close()
    two.close()
    assert store.hold("r1", exclusive=True) is not None


WAITS = """import os, time
print("ready", flush=True)
while not os.path.exists("go"):
    time.sleep(0.05)
"""


def test_an_up_holds_its_run_from_its_record_until_it_exits(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "waits.py").write_text(WAITS)
    p = cddp_popen("up", "local", "waits.py", "--gpus", "1", cwd=work)
    try:
        lines = wait_for_line(p, "ready")
        run_id = run_id_of("".join(lines))
        store = RunStore(work / "runs")
        assert store.hold(run_id, exclusive=True) is None  # a prune now leaves it whole
        (work / "go").write_text("")
        assert p.wait(timeout=120) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    held = store.hold(run_id, exclusive=True)  # let go at its exit
    assert held is not None
    held.close()


def test_the_command_says_what_to_give_and_a_dry_run_removes_nothing(tmp_path):
    store = _store_with(tmp_path, [("r1", 3, RunStatus.SUCCEEDED), ("r2", 2, RunStatus.SUCCEEDED)], local=True)
    r = cddp("prune", "--runs-dir", str(store.root), check_rc=2)
    assert "--keep N and/or --older-than AGE" in r.stderr and "Traceback" not in r.stderr
    r = cddp("prune", "--older-than", "soon", "--runs-dir", str(store.root), check_rc=2)
    assert "not an age" in r.stderr
    r = cddp("prune", "--keep", "1", "--dry-run", "--runs-dir", str(store.root), check_rc=0)
    assert r.stdout.startswith("would remove r1 (succeeded, ") and "nothing was removed" in r.stdout, r.stdout
    assert store.load("r1")
    r = cddp("prune", "--keep", "1", "--runs-dir", str(store.root), check_rc=0)
    assert r.stdout.startswith("removed r1 ") and "removed 1 run(s)" in r.stdout, r.stdout
    assert eventually(lambda: [x["run_id"] for x in store.list()] == ["r2"])


def test_the_node_command_matches_its_golden_file():
    from test_plan import golden
    golden("prune_command.txt", prune_command([("~/clusterddp/runs/r1", "r1/gpu-01", "gpu-01", ("gpu-02",)),
                                                 ("/scratch/it's here/runs/r2", "r2/gpu-01")], dry_run=True))


# ---- one shared workdir (an NFS home): a host never removes the folder another host may still use ----

def _shared_record(tmp_path, run_id: str, hosts=("a", "b"), **fields):
    """A finished run of ``hosts`` whose workdirs are one folder: one run folder, a control folder
    each (as build_plan lays them out), each host reached with bash on this machine."""
    work = str(tmp_path / "home")
    base = rec(run_id, hosts=hosts, status=RunStatus.FAILED, ended_at="2026-11-29T10:05:00+00:00", **fields)
    nodes = []
    for n in base.nodes:
        run_dir = f"{work}/runs/{run_id}"
        nodes.append(replace(n, run_dir=run_dir, control_dir=f"{run_dir}/.clusterddp/{n.host}",
                             settings=replace(n.settings, workdir=work, transport="local")))
    for n in nodes:
        os.makedirs(os.path.join(n.control_dir, "errors"), exist_ok=True)
    (Path(nodes[0].run_dir) / "ckpt.pt").write_bytes(b"c" * 200_000)
    return replace(base, nodes=tuple(nodes))


def _local_connect(host):
    from clusterddp.transport.local import LocalTransport
    return LocalTransport(host.name)


def _marked_job(marker: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                            env={**os.environ, MARKER: marker})


def test_the_node_command_lets_go_of_a_shared_folder_another_host_of_the_run_still_holds(tmp_path):
    r = _shared_record(tmp_path, "r1")
    a, b = r.nodes
    run = Path(a.run_dir)
    # a's job has ended; b's control folder is there: b (whose processes a cannot see) may still use it
    said = _bash(prune_command([(a.run_dir, a.marker, "a", ("b",))], dry_run=True))
    assert pruning.parse_reply(said, 1)[0][0] == "shared" and (run / ".clusterddp" / "a").is_dir()
    said = _bash(prune_command([(a.run_dir, a.marker, "a", ("b",))]))
    assert pruning.parse_reply(said, 1)[0][0] == "shared", said
    assert (run / "ckpt.pt").is_file() and (run / ".clusterddp" / "b").is_dir()
    assert not (run / ".clusterddp" / "a").exists()  # a let go of its own part
    # b, once its job has ended, is the last: it removes the folder
    said = _bash(prune_command([(b.run_dir, b.marker, "b", ("a",))]))
    assert pruning.parse_reply(said, 1)[0][0] == "removed" and not run.exists()


def test_prune_never_removes_a_shared_run_folder_while_another_host_runs_its_job_there(tmp_path, capsys):
    """Node b's link died, so its record says lost, its job goes on: pruning must keep the folder
    (today node a, which cannot see b's processes, removed it and prune said "removed 0 run(s)")."""
    store = RunStore(tmp_path / "runs")
    r = _shared_record(tmp_path, "r1")
    store.create(r)
    run = Path(r.nodes[0].run_dir)
    job = _marked_job(r.nodes[1].marker)  # b's job, still running
    try:
        sel = pruning.select(store, pruning.Policy(keep=0), NOW)
        [res] = pruning.prune(store, sel, connect=_local_connect)
        assert not res.removed
        assert {n.host: n.word for n in res.nodes} == {"a": "shared", "b": "running"}
        assert (run / "ckpt.pt").read_bytes() == b"c" * 200_000 and (run / ".clusterddp" / "b").is_dir()
        assert store.load("r1")  # the record, the only pointer to the folder, stays
        from clusterddp.cli.prune import report
        assert report([res], sel, dry_run=False) == 1
        out = capsys.readouterr()
        assert "not removed r1" in out.err and "b running" in out.err and "removed 0 run(s)" in out.out
    finally:
        job.kill()
        job.wait()
    # once b's job has ended, the next prune takes all of it (both hosts let go at once: one removes it)
    [res] = pruning.prune(store, pruning.select(store, pruning.Policy(keep=0), NOW), connect=_local_connect)
    assert res.removed, res.why_kept
    assert "removed" in {n.word for n in res.nodes} <= {"missing", "removed"} and not run.exists()
    assert res.freed >= 200_000


def test_a_dry_run_of_a_shared_folder_says_it_would_go_and_counts_its_size_once(tmp_path):
    store = RunStore(tmp_path / "runs")
    store.create(_shared_record(tmp_path, "r1"))
    [res] = pruning.prune(
        store, pruning.select(store, pruning.Policy(keep=0), NOW), dry_run=True, connect=_local_connect
    )
    assert res.removed and [n.word for n in res.nodes] == ["shared", "shared"]
    assert 200_000 <= sum((n.kib or 0) * 1024 for n in res.nodes) < 400_000
    assert (Path(res.record.nodes[0].run_dir) / ".clusterddp" / "a").is_dir()  # nothing touched


def test_prune_reports_a_node_folder_it_removed_of_a_run_it_kept(tmp_path, capsys):
    """Two hosts with their own workdirs: a's folder goes, b's job still runs; the summary counts a's bytes."""
    store = RunStore(tmp_path / "runs")
    r = _shared_record(tmp_path, "r1")
    b = r.nodes[1]
    b_run = f"{tmp_path}/home-b/runs/r1"
    os.makedirs(f"{b_run}/.clusterddp/b")
    r = replace(r, nodes=(r.nodes[0], replace(b, run_dir=b_run, control_dir=f"{b_run}/.clusterddp/b",
                                             settings=replace(b.settings, workdir=f"{tmp_path}/home-b"))))
    import shutil
    shutil.rmtree(f"{tmp_path}/home/runs/r1/.clusterddp/b")
    store.create(r)
    job = _marked_job(b.marker)
    try:
        sel = pruning.select(store, pruning.Policy(keep=0), NOW)
        results = pruning.prune(store, sel, connect=_local_connect)
    finally:
        job.kill()
        job.wait()
    assert [n.word for n in results[0].nodes] == ["removed", "running"] and results[0].freed >= 200_000
    from clusterddp.cli.prune import report
    report(results, sel, dry_run=False)
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert summary.startswith("removed 0 run(s) and node folders of 1 more, ") and " 0 B" not in summary, summary


def test_prune_of_more_runs_than_one_node_command_holds_is_sent_in_batches(tmp_path):
    """One command per host for all its folders: 1,100 runs were over the 128 KiB a single argument
    may have (long run ids here, so that fewer runs make as long a command)."""
    store = RunStore(tmp_path / "runs")
    work = tmp_path / "w"
    count = 300
    for i in range(count):
        run_id = f"20261101-000000-{i:05d}-" + "n" * 180
        r = rec(run_id, hosts=("a",), status=RunStatus.SUCCEEDED, ended_at="2026-11-29T10:05:00+00:00")
        run_dir = f"{work}/runs/{run_id}"
        n = r.nodes[0]
        store.create(replace(r, nodes=(replace(n, run_dir=run_dir, control_dir=f"{run_dir}/.clusterddp/a",
                                               settings=replace(n.settings, workdir=str(work), transport="local")),)))
        os.makedirs(f"{run_dir}/.clusterddp/a")
    sel = pruning.select(store, pruning.Policy(keep=0), NOW)
    assert len(prune_command([(n.run_dir, n.marker, "a", ()) for r in sel.remove for n in r.nodes])) > 128 * 1024
    results = pruning.prune(store, sel, connect=_local_connect)
    assert sum(r.removed for r in results) == count, {r.why_kept for r in results if not r.removed}
    assert os.listdir(work / "runs") == []
