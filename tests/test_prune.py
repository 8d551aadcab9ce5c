"""`clusterddp prune` without a test bed: which runs it chooses, the node command on real folders
(run by bash, as on a node), the refusal of paths a damaged record could hold, and store removal."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from clusterddp import plan as P
from clusterddp import prune as pr
from clusterddp.errors import RunNotFound, UsageError
from clusterddp.record import RunStatus
from clusterddp.store import RunStore
from helpers import cddp, eventually
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
    sel = pr.select(store, pr.Policy(keep=2), NOW)
    assert (ids(sel), sel.running, sel.kept) == (["r1", "r3"], ("r2",), 2)  # oldest first
    sel = pr.select(store, pr.Policy(older_than=5 * 86400), NOW)
    assert (ids(sel), sel.running, sel.kept) == (["r1", "r3"], ("r2",), 2)
    # both rules: a run goes only when neither keeps it
    sel = pr.select(store, pr.Policy(keep=1, older_than=7 * 86400), NOW)
    assert (ids(sel), sel.running) == (["r1"], ("r2",))
    assert ids(pr.select(store, pr.Policy(keep=0), NOW)) == ["r1", "r3", "r4", "r5"]
    assert ids(pr.select(store, pr.Policy(keep=0, inventory="/other/inv.yaml"), NOW)) == []
    assert ids(pr.select(store, pr.Policy(keep=4, inventory="/w/inv.yaml"), NOW)) == ["r1"]


@pytest.mark.parametrize("text, seconds", [("30m", 1800), ("12h", 43200), ("7d", 604800), ("2w", 1209600),
                                           ("1d12h", 129600), ("90s", 90)])
def test_ages(text, seconds):
    assert pr.parse_age(text) == seconds


@pytest.mark.parametrize("text", ["", "7", "7 days", "d7", "-1d", "1d junk"])
def test_an_age_that_is_not_one_is_bad_input(text):
    with pytest.raises(UsageError, match="not an age"):
        pr.parse_age(text)


GOOD = ("20261130-120000-ab12", "~/clusterddp", "~/clusterddp/runs/20261130-120000-ab12",
        "~/clusterddp/runs/20261130-120000-ab12/.clusterddp")


@pytest.mark.parametrize("run_id, workdir, run_dir, control_dir", [
    GOOD, ("r1", "/srv/w", "/srv/w/runs/r1", "/srv/w/runs/r1/.clusterddp"),
    ("r1", "w", "w/runs/r1", "w/runs/r1/.clusterddp/node-1"),
])
def test_a_run_folder_of_the_planned_shape_may_be_pruned(run_id, workdir, run_dir, control_dir):
    assert P.prune_target_problem(run_id, workdir, run_dir, control_dir) is None


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
    assert P.prune_target_problem(run_id, workdir, run_dir, control_dir)


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
                           env={**os.environ, P.MARKER: marker})
    try:
        targets = [(str(runs / n), marker if n == "running" else f"{n}/node") for n in names]
        dry = pr.parse_reply(_bash(P.prune_command(targets, dry_run=True)), len(names))
        assert [w for w, _ in dry.values()] == ["would", "would", "refused", "refused", "running", "missing"]
        assert dry[0][1] and dry[0][1] >= 90  # KiB, as du counts them
        assert all((runs / n).exists() for n in names[:5])  # a dry run removes nothing
        done = pr.parse_reply(_bash(P.prune_command(targets)), len(names))
        assert [w for w, _ in done.values()] == ["removed", "removed", "refused", "refused", "running", "missing"]
        assert sorted(p.name for p in runs.iterdir()) == ["link", "no-control", "running"]
        assert (outside / ".clusterddp").is_dir() and not (tmp_path / "pwned").exists()
    finally:
        job.kill()
        job.wait()
    # the same folder, once its job has ended
    assert pr.parse_reply(_bash(P.prune_command([(str(runs / "running"), marker)])), 1)[0][0] == "removed"
    assert not (runs / "running").exists()


def test_local_runs_lose_their_folder_and_index_row_never_the_launch_directory(tmp_path):
    launch = tmp_path / "proj"
    launch.mkdir()
    (launch / "train.py").write_text("pass\n")
    store = _store_with(tmp_path, [("old", 3, RunStatus.SUCCEEDED), ("new", 1, RunStatus.FAILED)],
                        local=True, launch_dir=str(launch), inventory="local")
    (store.run_dir("old") / "logs" / "local.log").write_bytes(b"y" * 50_000)
    sel = pr.select(store, pr.Policy(keep=1), NOW)
    dry = pr.prune(store, sel, dry_run=True)
    assert [(r.run_id, r.removed) for r in dry] == [("old", True)] and dry[0].local_bytes >= 50_000
    assert store.load("old")  # nothing removed by a dry run
    done = pr.prune(store, sel)
    assert [(r.run_id, r.removed) for r in done] == [("old", True)]
    with pytest.raises(RunNotFound):
        store.load("old")
    assert [r["run_id"] for r in store.list()] == ["new"]
    assert sorted(p.name for p in store.root.iterdir() if not p.name.startswith("runs.db")) == ["new"]
    assert (launch / "train.py").exists()


def test_a_run_recorded_running_meanwhile_is_not_removed(tmp_path):
    store = _store_with(tmp_path, [("r1", 3, RunStatus.SUCCEEDED)], local=True)
    sel = pr.select(store, pr.Policy(keep=0), NOW)
    store.update("r1", lambda r: replace(r, status=RunStatus.RUNNING, ended_at=None))  # between select and prune
    [res] = pr.prune(store, sel)
    assert not res.removed and "running" in (res.why_kept or "")
    assert store.load("r1").status is RunStatus.RUNNING


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
    golden("prune_command.txt", P.prune_command([("~/clusterddp/runs/r1", "r1/gpu-01"),
                                                 ("/scratch/it's here/runs/r2", "r2/gpu-01")], dry_run=True))
