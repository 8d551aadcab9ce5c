"""What a schedule's firing came to, told apart: the lock held (exit 3) and the GPU slots taken (`up`'s
exit 75) are two skips with their own words and exit codes; every firing is recorded, with the run it
started only when that run was recorded; `schedule list` shows the last one; `schedule add` makes
its runs folder (and any above it) 0700.

No crontab is touched: lines run through a real /bin/sh as cron would (as tests/schedule/test_schedule.py
does), with a stand-in clusterddp that exits as it is told; the crontab's text is the test's own.
"""

from __future__ import annotations

import os
import re
import sqlite3
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from clusterddp import notify as notifier
from clusterddp import schedule as schedules
from clusterddp.cli.app import app
from clusterddp.errors import LeaseBusy
from clusterddp.record import RunStatus
from clusterddp.runspec import RunSpec
from clusterddp.schedule import crontab as crontab_mod
from clusterddp.store import RunStore, when_of
from helpers import make_record

AT = "2026-12-06T02:00:00.000+00:00"


def _spec(tmp_path: Path, wait: bool = False, exe: Path | None = None) -> schedules.ScheduleSpec:
    exe = exe or Path("/venv/bin/clusterddp")
    return schedules.ScheduleSpec(
        name="nightly",
        cron="0 2 * * *",
        launch_dir=str(tmp_path),
        runs_dir=str(tmp_path / "runs"),
        executable=(str(exe),),
        bin_dir=str(exe.parent),
        inventory="local",
        run=RunSpec(script=str(tmp_path / "t.py")),
        wait=wait,
    )


def _fake(tmp_path: Path) -> Path:
    """A stand-in clusterddp: `schedule fire` goes to the real one; `up` says so and exits $FAKE_RC."""
    import sys
    exe = tmp_path / "bin" / "clusterddp"
    exe.parent.mkdir(exist_ok=True)
    exe.write_text(f"#!{sys.executable}\n"
                   "import os, sys\n"
                   "args = sys.argv[1:]\n"
                   "if args[:2] == ['schedule', 'fire']:\n"
                   f"    os.execv({sys.executable!r}, [{sys.executable!r}, '-m', 'clusterddp', *args])\n"
                   "print('fake up', flush=True)\n"
                   "sys.exit(int(os.environ.get('FAKE_RC', '0')))\n")
    exe.chmod(0o755)
    return exe


@pytest.fixture
def cron(tmp_path, monkeypatch):
    """A schedule saved with the fake clusterddp, its line in a crontab held in memory."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    spec = _spec(tmp_path, exe=_fake(tmp_path))
    schedules.save_spec(spec)
    tab = {"text": f"MAILTO=\"\"\n{schedules.render_line(spec)}\n"}
    for module in (crontab_mod, schedules):
        monkeypatch.setattr(module, "read_crontab", lambda: tab["text"])
        monkeypatch.setattr(module, "write_crontab", lambda text: tab.update(text=text))
    return spec, tab


def _run(tab: dict, rc: int) -> object:
    """`schedule run nightly` with the fake `up` exiting ``rc`` (set as cron would: a NAME=value line)."""
    tab["text"] = re.sub(r"^FAKE_RC=.*\n", "", tab["text"], flags=re.M)
    tab["text"] = f"FAKE_RC={rc}\n" + tab["text"]
    return CliRunner().invoke(app, ["schedule", "run", "nightly"])


# ---- the two skips, told apart ----

def test_slots_taken_and_lock_held_are_two_skips_with_their_own_exit_codes_and_words(cron):
    spec, tab = cron
    store = RunStore(spec.runs_dir)
    r = _run(tab, 75)  # `up` found the GPU slots taken
    assert r.exit_code == schedules.BUSY_EXIT == 75, r.output
    assert "skipped, the GPU slots it needs are taken (nothing started)" in r.output, r.output
    assert "lock held" not in r.output and "holds the schedule's lock" not in r.output, r.output
    (busy,) = store.firings("nightly")
    assert (busy["outcome"], busy["run_id"], busy["holder"]) == ("skipped: slots busy", None, None)
    assert "--wait" in busy["reason"] and f"schedule add {spec.name} ... --replace --wait" in busy["reason"]
    assert f"schedule nightly: skipped: slots busy: {busy['reason']}" in Path(spec.log_path).read_text()

    with open(spec.lock_path, "w") as held:
        import fcntl
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        r = _run(tab, 0)
    assert r.exit_code == schedules.LOCK_HELD_EXIT == 3, r.output
    assert "skipped, its previous run still holds the schedule's lock" in r.output and "GPU" not in r.output
    lock, busy_again = store.firings("nightly")
    assert lock["outcome"] == "skipped: lock held" and busy_again == busy
    assert len(store.skips("nightly")) == 2 and schedules.LOCK_HELD_EXIT != schedules.BUSY_EXIT


def test_a_firing_that_failed_before_its_run_was_recorded_names_no_run(cron):
    spec, tab = cron
    r = _run(tab, 2)  # bad input, say
    assert r.exit_code == 2 and "skipped" not in r.output, r.output
    (failed,) = RunStore(spec.runs_dir).firings("nightly")
    assert (failed["outcome"], failed["run_id"]) == ("failed", None)
    assert RunStore(spec.runs_dir).skips("nightly") == []


def test_ended_takes_the_recorded_run_first_then_the_exit_code(tmp_path):
    spec, waits = _spec(tmp_path), _spec(tmp_path, wait=True)
    run = {"run_id": "20261206-020000-ab12", "status": "failed"}
    assert schedules.ended(spec, AT, 1, run) == schedules.Firing("failed", AT, run_id="20261206-020000-ab12")
    assert (
        schedules.ended(spec, AT, 75, run).outcome == "failed"
    )  # a run recorded, then ended by taken slots: its status
    assert schedules.ended(spec, AT, 0, None) == schedules.Firing("succeeded", AT)
    busy = schedules.ended(spec, AT, 75, None)
    assert (busy.outcome, busy.run_id) == (schedules.SLOTS_BUSY, None) and "--wait" in busy.reason
    assert "--wait" not in schedules.ended(waits, AT, 75, None).reason  # it waits already: a quarantined host, then
    assert schedules.ended(spec, AT, 130, None).outcome == "stopped"
    assert schedules.ended(spec, AT, 1, None).outcome == "failed" and schedules.ended(spec, AT, 1, None).run_id is None
    assert (
        schedules.ended(spec, AT, 1, None)
        .says()
        .startswith("failed: `clusterddp up` exited 1 before its run was recorded")
    )
    assert schedules.Firing("succeeded", AT, run_id="r1").says() == "succeeded (run r1)"


def test_the_firings_run_is_one_of_its_schedule_recorded_since_it_fired(tmp_path):
    store = RunStore(tmp_path / "runs")
    store.create(make_record("old", (), status=RunStatus.SUCCEEDED, started_at="2026-12-06T01:59:59.999+00:00",
                             schedule="nightly"))
    assert schedules.run_since(str(store.root), "nightly", AT) is None  # the previous firing's
    store.create(make_record("other", (), started_at="2026-12-06T02:00:01.000+00:00", schedule="weekly"))
    assert schedules.run_since(str(store.root), "nightly", AT) is None  # another schedule's
    store.create(make_record("new", (), started_at="2026-12-06T02:00:00.000+00:00", schedule="nightly"))
    assert schedules.run_since(str(store.root), "nightly", AT)["run_id"] == "new"


# ---- schedule list ----

def _list_row(tmp_path) -> list[str]:
    r = CliRunner().invoke(app, ["schedule", "list"])
    assert r.exit_code == 0, r.output
    head, row = r.output.splitlines()
    assert re.match(r"NAME +CRON +NEXT RUNS \(\w+\) +LAST FIRED +OUTCOME +RUN +SKIPS$", head), head
    return row.split()


def test_list_shows_the_last_firing_its_outcome_and_a_run_id_that_runs_lists(cron, tmp_path):
    spec, tab = cron
    store = RunStore(spec.runs_dir)
    assert _list_row(tmp_path)[-4:] == ["-", "-", "-", "0"]  # never fired

    _run(tab, 75)
    row = _list_row(tmp_path)  # refused for its slots: no run to name
    assert row[-5:] == ["skipped:", "slots", "busy", "-", "1"], row

    rid = "20261206-020000-ab12"
    store.create(make_record(rid, (), status=RunStatus.RUNNING, started_at="2999-01-01T00:00:00.000+00:00",
                             schedule="nightly"))
    row = _list_row(tmp_path)  # a firing still running (recorded by its run, not yet by its end)
    assert row[-3:] == ["running", rid, "1"], row

    store.record_firing("nightly", "skipped: lock held", "2999-01-01T00:00:05+00:00", holder=rid,
                        reason=f"the previous run {rid} still holds its lock")
    row = _list_row(tmp_path)  # the holder is named: a run that `clusterddp runs` lists
    assert row[-5:] == ["skipped:", "lock", "held", rid, "2"], row
    assert rid in [r["run_id"] for r in store.list()]


def test_last_firing_prefers_the_run_status_now_and_a_newer_run(tmp_path):
    store = RunStore(tmp_path / "runs")
    assert schedules.last_firing(store, "n") is None
    store.record_firing("n", "skipped: slots busy", "2026-12-06T02:00:00+00:00", reason="busy")
    assert schedules.last_firing(store, "n")["outcome"] == "skipped: slots busy"
    store.create(make_record("r1", (), status=RunStatus.RUNNING, started_at="2026-12-06T03:00:00.100+00:00",
                             schedule="n"))
    newer = schedules.last_firing(store, "n")
    assert (newer["outcome"], newer["run_id"], newer["at"]) == ("running", "r1", "2026-12-06T03:00:00.100+00:00")
    store.record_firing("n", "running", "2026-12-06T03:00:00+00:00", run_id="r1")  # recorded as up left it
    import dataclasses
    store.update("r1", lambda rec: dataclasses.replace(rec, status=RunStatus.SUCCEEDED))  # `status` looked since
    now = schedules.last_firing(store, "n")
    assert (now["outcome"], now["run_id"], now["at"]) == ("succeeded", "r1", "2026-12-06T03:00:00+00:00")
    store.record_firing("n", "skipped: lock held", "2026-12-06T04:00:00+00:00", holder="r1", reason="held")
    assert schedules.last_firing(store, "n")["outcome"] == "skipped: lock held"  # r1 started before this skip


def test_skips_an_older_clusterddp_recorded_are_read_as_lock_held(tmp_path):
    runs = tmp_path / "runs"
    RunStore(runs).create(make_record("r0", (), schedule="n"))
    con = sqlite3.connect(runs / "runs.db")  # as an older clusterddp left it: its skips there, no firings table
    with con:
        con.execute("DROP TABLE firings")
        con.execute("INSERT INTO skips VALUES ('n', '2026-12-01T02:00:00+00:00', 'r0', 'held')")
    con.close()
    store = RunStore(runs)
    (old,) = store.firings("n")
    assert (old["outcome"], old["holder"], old["run_id"]) == ("skipped: lock held", "r0", None)
    store.record_firing("n", "skipped: slots busy", "2026-12-02T02:00:00+00:00", reason="busy")
    assert [f["outcome"] for f in store.skips("n")] == ["skipped: slots busy", "skipped: lock held"]


@given(st.one_of(st.text(max_size=40), st.none(), st.integers(), st.binary(max_size=10)))
def test_a_stored_time_is_compared_whatever_it_holds(stamp):
    t = when_of(stamp)  # an index edited by hand: never a traceback in `schedule list`
    assert t.tzinfo is not None


# ---- the notification of a run refused before it was recorded ----

def test_a_run_refused_before_it_was_recorded_is_told_without_a_run_id():
    ev = notifier.run_event(None, error=LeaseBusy("the run does not fit: slots 0,1 held by run r9 (running)"),
                     run_id="20261206-020000-ab12", schedule="nightly")
    assert ev["run_id"] is None and "20261206-020000-ab12" not in ev["text"]
    assert ev["text"] == ("clusterddp: a run of schedule nightly failed before it started: the run does not fit: "
                          "slots 0,1 held by run r9 (running)")


# ---- the runs folder schedule add makes ----

def test_schedule_add_makes_the_runs_folder_and_those_above_it_0700_whatever_the_umask(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    tab = {"text": ""}
    monkeypatch.setattr(crontab_mod, "read_crontab", lambda: tab["text"])
    monkeypatch.setattr(crontab_mod, "write_crontab", lambda text: tab.update(text=text))
    (tmp_path / "t.py").write_text("print('hi')\n")
    (tmp_path / "shared").mkdir(mode=0o755)
    os.chmod(tmp_path / "shared", 0o755)
    old = os.umask(0o022)
    try:
        r = CliRunner().invoke(app, ["schedule", "add", "nightly", "local", "t.py", "--cron", "@daily",
                                     "--runs-dir", "shared/new/deeper/runs"])
    finally:
        os.umask(old)
    assert r.exit_code == 0, r.output
    for folder in ("new", "new/deeper", "new/deeper/runs", "new/deeper/runs/schedules"):
        assert oct(stat.S_IMODE((tmp_path / "shared" / folder).stat().st_mode)) == "0o700", folder
    assert stat.S_IMODE((tmp_path / "shared").stat().st_mode) == 0o755  # a folder that was there is left as it is


def test_schedule_add_says_what_a_firing_does_when_its_slots_are_taken(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    tab = {"text": ""}
    monkeypatch.setattr(crontab_mod, "read_crontab", lambda: tab["text"])
    monkeypatch.setattr(crontab_mod, "write_crontab", lambda text: tab.update(text=text))
    (tmp_path / "t.py").write_text("print('hi')\n")
    (tmp_path / "inv.yaml").write_text("hosts:\n  - {name: gpu-01, address: gpu-01.invalid, identity_file: k}\n")
    add = ["schedule", "add", "n", "inv.yaml", "t.py", "--cron", "@daily", "--runs-dir", "runs", "--replace"]
    r = CliRunner().invoke(app, add)
    assert r.exit_code == 0 and "  slots: taken by another run: the firing is skipped (add --wait" in r.output, r.output
    r = CliRunner().invoke(app, [*add, "--wait"])
    assert r.exit_code == 0 and "  slots: taken by another run: it waits in the queue (--wait)\n" in r.output, r.output
    assert schedules.load_spec(str(tmp_path / "runs" / "schedules" / "n.json")).wait is True
    r = CliRunner().invoke(app, ["schedule", "add", "l", "local", "t.py", "--cron", "@daily", "--runs-dir", "runs"])
    assert r.exit_code == 0 and "slots:" not in r.output, r.output  # a local run takes no slots
