"""The run store on real SQLite and real files, including two writers at once."""

from __future__ import annotations

import json
import multiprocessing as mp
import re
from dataclasses import replace
from datetime import datetime, timezone

import pytest

from clusterddp.errors import RunNotFound
from clusterddp.record import NodeState, RunStatus
from clusterddp.store import RunStore, new_run_id
from helpers import make_record as rec


def test_run_ids_sort_by_time_and_are_folder_safe():
    a = new_run_id(datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc), "ffff")
    b = new_run_id(datetime(2026, 1, 2, 3, 4, 6, tzinfo=timezone.utc), "0000")
    assert a == "20260102-030405-ffff" and a < b
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{4}", new_run_id())


def test_runs_started_in_one_second_are_listed_in_the_order_they_started(tmp_path):
    """keep_runs and prune keep the newest runs: two runs of one second must not be ordered by their
    ids' random ends (a long run started just before a short one was taken for the newer)."""
    from clusterddp.backends.base import new_record
    from clusterddp.runspec import RunSpec
    s = RunStore(tmp_path)
    first = new_record("inv.yaml", RunSpec("t.py"), "20261204-035057-ffff", schedule=None, local=False,
                       master_addr="a", master_port=1, collect=())
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", first.started_at)
    s.create(replace(first, started_at="2026-12-04T03:50:57.100+00:00"))
    s.create(rec("20261204-035057-0000", started_at="2026-12-04T03:50:57.900+00:00"))  # started after it
    s.create(rec("20261204-035056-aaaa", started_at="2026-12-04T03:50:56+00:00"))  # an older record: seconds
    assert [r["run_id"] for r in s.list()] == ["20261204-035057-0000", "20261204-035057-ffff",
                                               "20261204-035056-aaaa"]

def test_create_update_list_and_resolve(tmp_path):
    s = RunStore(tmp_path)
    s.create(rec("20261129-100000-aaaa"))
    s.create(rec("20261129-110000-bbbb", started_at="2026-11-29T11:00:00+00:00"))
    s.update("20261129-100000-aaaa", lambda r: replace(r.seen({"b": (NodeState.FAILED, 3, None)}),
                                                        status=RunStatus.FAILED, failed_host="b"))
    on_disk = json.loads((tmp_path / "20261129-100000-aaaa" / "run.json").read_text())
    assert on_disk["status"] == "failed" and on_disk["nodes"][1]["exit_code"] == 3 and on_disk["exit_code"] == 1
    rows = s.list()
    assert [r["run_id"] for r in rows] == ["20261129-110000-bbbb", "20261129-100000-aaaa"]
    assert rows[1]["status"] == "failed" and rows[1]["hosts"] == "a,b"
    assert s.resolve("20261129-11") == "20261129-110000-bbbb"
    with pytest.raises(RunNotFound, match="matches 2 runs"):
        s.resolve("20261129-1")
    with pytest.raises(RunNotFound):
        s.resolve("2025")


def test_a_run_is_named_by_a_unique_suffix_too(tmp_path):
    # every id starts with its date: the random part at its end is the short way to name a run
    s = RunStore(tmp_path)
    for rid in ("20261129-100000-3f9a", "20261129-110000-bbbb", "20261130-090000-0bbb"):
        s.create(rec(rid))
    assert s.resolve("3f9a") == s.resolve("f9a") == s.resolve("0-3f9a") == "20261129-100000-3f9a"
    assert s.resolve("20261130") == "20261130-090000-0bbb"  # prefixes as before
    with pytest.raises(RunNotFound) as e:  # a suffix of two runs: both named, exit 2
        s.resolve("bbb")
    assert "'bbb' matches 2 runs: 20261129-110000-bbbb, 20261130-090000-0bbb" in str(e.value)
    assert e.value.exit_code == 2
    with pytest.raises(RunNotFound, match="matches 4 runs"):  # prefixes of some, the suffix of one: all count
        s.create(rec("20261201-120000-2026"))
        s.resolve("2026")
    (tmp_path / ".20261129-100000-3f9a.removing-c0de").mkdir()  # a run being removed is never named
    (tmp_path / ".20261129-100000-3f9a.removing-c0de" / "run.json").write_text("{}")
    assert s.resolve("3f9a") == "20261129-100000-3f9a"
    with pytest.raises(RunNotFound, match="no run matches 'c0de'"):
        s.resolve("c0de")


def test_artifact_paths_cannot_escape_the_run_folder(tmp_path):
    s = RunStore(tmp_path)
    with pytest.raises(ValueError):
        s.artifact_path("r", "a", "../../etc/passwd")
    assert s.artifact_path("r", "a", "checkpoints/x.pt").parts[-4:] == ("artifacts", "a", "checkpoints", "x.pt")
    dest = s.artifact_paths("r", "a")  # one host's resolver (a collect's): the same rule
    with pytest.raises(ValueError):
        dest("../../etc/passwd")
    with pytest.raises(ValueError):
        dest("../b/x.pt")  # another host's folder
    assert dest("checkpoints/x.pt") == s.artifact_path("r", "a", "checkpoints/x.pt")


def _writer(root: str, tag: str, n: int) -> None:
    s = RunStore(root)
    for i in range(n):
        rid = f"20261129-1200{i:02d}-{tag}"
        s.create(rec(rid))
        s.update(rid, lambda r: replace(r, status=RunStatus.SUCCEEDED))


def test_two_launchers_writing_at_once_lose_nothing(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), tag, 40)) for tag in ("aaaa", "bbbb")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    rows = RunStore(tmp_path).list()
    assert len(rows) == 80 and {r["status"] for r in rows} == {"succeeded"}
    for r in rows:
        assert json.loads((tmp_path / r["run_id"] / "run.json").read_text())["status"] == "succeeded"


def _patcher(root: str, run_id: str, host: str, n: int, start_at: float) -> None:
    import time
    s = RunStore(root)
    time.sleep(max(0.0, start_at - time.time()))  # both processes start writing together
    def bump(r):  # a counter in the node's exit code: a lost update leaves it short for good
        return replace(r, nodes=tuple(replace(x, exit_code=(x.exit_code or 0) + 1) if x.host == host else x
                                      for x in r.nodes))
    for _ in range(n):
        s.update(run_id, bump)


def test_two_processes_updating_one_run_lose_no_update(tmp_path):
    RunStore(tmp_path).create(rec("20261129-130000-cccc"))
    ctx = mp.get_context("spawn")
    import time
    start_at = time.time() + 3
    procs = [ctx.Process(target=_patcher, args=(str(tmp_path), "20261129-130000-cccc", h, 150, start_at))
             for h in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    for n in RunStore(tmp_path).load("20261129-130000-cccc").nodes:
        assert n.exit_code == 150, f"{n.host} lost updates"


# ---- damage, atomic steps, concurrency and modes ----

def _payload(tag: str, i: int) -> bytes:
    return f"{tag} write {i:03d}\n".encode() * 4000  # ~70 KB: long enough for writers to overlap


def _log_writer(root: str, tag: str, n: int, start_at: float) -> None:
    import time
    s = RunStore(root)
    time.sleep(max(0.0, start_at - time.time()))  # every writer starts together
    for i in range(n):
        with s.log_writer("20261129-140000-dddd", "a") as f:  # as artifacts writes a node's copy
            f.write(_payload(tag, i))


def test_log_copies_written_at_once_by_threads_and_processes_are_each_whole(tmp_path):
    import threading
    import time
    RunStore(tmp_path).create(rec("20261129-140000-dddd"))
    start_at = time.time() + 3
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_log_writer, args=(str(tmp_path), f"p{k}", 60, start_at)) for k in range(2)]
    for p in procs:
        p.start()
    errors: list[BaseException] = []

    def thread(tag: str) -> None:
        try:
            _log_writer(str(tmp_path), tag, 60, start_at)
        except BaseException as e:
            errors.append(e)
    threads = [threading.Thread(target=thread, args=(f"t{k}",)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert not errors, errors[:3]
    logs = tmp_path / "20261129-140000-dddd" / "logs"
    data = (logs / "a.log").read_bytes()
    first = data.split(b"\n", 1)[0]
    assert re.fullmatch(rb"[pt]\d write \d{3}", first) and data == (first + b"\n") * 4000  # one writer's whole copy
    assert sorted(p.name for p in logs.iterdir()) == ["a.log"]  # no temp file left behind


def test_an_update_waits_for_the_run_lock_only_until_its_deadline(tmp_path, monkeypatch):
    import fcntl
    import time

    from clusterddp import store as store_mod
    from clusterddp.store import StoreError
    monkeypatch.setattr(store_mod, "LOCK_TIMEOUT", 1.5)
    s = RunStore(tmp_path)
    s.create(rec("20261129-150000-eeee"))
    lock = tmp_path / "20261129-150000-eeee" / ".run.json.lock"
    with open(lock, "a") as held:  # another process mid-update, stuck
        fcntl.flock(held, fcntl.LOCK_EX)
        t0 = time.monotonic()
        with pytest.raises(StoreError) as e:
            s.update("20261129-150000-eeee", lambda r: replace(r, status=RunStatus.SUCCEEDED))
        took = time.monotonic() - t0
    assert 1.5 <= took < 30, took  # it waited, then gave up (without a deadline: forever)
    assert str(lock) in str(e.value) and "locked by another process" in str(e.value) and e.value.exit_code == 2
    assert s.load("20261129-150000-eeee").status is RunStatus.RUNNING
    s.update("20261129-150000-eeee", lambda r: replace(r, status=RunStatus.SUCCEEDED))  # released: it goes through
    assert s.load("20261129-150000-eeee").status is RunStatus.SUCCEEDED


def test_a_run_is_created_whole_or_not_at_all_and_an_update_the_index_refuses_changes_nothing(tmp_path):
    import sqlite3

    from clusterddp.store import StoreError
    s = RunStore(tmp_path)
    s.create(rec("20261129-100000-aaaa"))
    con = sqlite3.connect(tmp_path / "runs.db")  # the index starts refusing writes (a real SQLite failure)
    con.execute("CREATE TRIGGER full BEFORE INSERT ON runs BEGIN SELECT RAISE(ABORT, 'disk full'); END")
    con.commit()
    con.close()
    with pytest.raises(StoreError, match="disk full") as e:
        s.create(rec("20261129-110000-bbbb"))
    assert str(tmp_path / "runs.db") in str(e.value)
    assert not (tmp_path / "20261129-110000-bbbb").exists()  # no run.json saying "running" for a run that never ran
    before = (tmp_path / "20261129-100000-aaaa" / "run.json").read_bytes()
    with pytest.raises(StoreError, match="disk full"):
        s.update("20261129-100000-aaaa", lambda r: replace(r, status=RunStatus.SUCCEEDED))
    assert (tmp_path / "20261129-100000-aaaa" / "run.json").read_bytes() == before  # file and index still agree
    assert [p.name for p in (tmp_path / "20261129-100000-aaaa").iterdir() if p.suffix == ".tmp"] == []


def test_without_runs_db_runs_are_listed_from_their_folders_and_the_index_is_rebuilt(tmp_path, caplog):
    s = RunStore(tmp_path)
    s.create(rec("20261129-100000-aaaa"))
    s.create(rec("20261129-110000-bbbb", started_at="2026-11-29T11:00:00+00:00"))
    (tmp_path / "20261129-110000-bbbb" / "run.json").write_text("{\"run_id\": ")
    for side in ("", "-wal", "-shm"):  # moved aside, as the message for a damaged one says
        (tmp_path / f"runs.db{side}").unlink(missing_ok=True)
    rows = RunStore(tmp_path).list()
    assert [r["run_id"] for r in rows] == ["20261129-100000-aaaa"] and rows[0]["hosts"] == "a,b"
    assert "20261129-110000-bbbb/run.json: not valid JSON" in caplog.text
    assert not (tmp_path / "runs.db").exists()  # a listing writes nothing
    s = RunStore(tmp_path)
    s.create(rec("20261129-120000-cccc", started_at="2026-11-29T12:00:00+00:00"))
    assert [r["run_id"] for r in s.list()] == ["20261129-120000-cccc", "20261129-100000-aaaa"]
    assert (tmp_path / "runs.db").exists()


def test_a_runs_db_from_the_first_release_is_read_and_brought_up_to_date(tmp_path):
    import sqlite3
    con = sqlite3.connect(tmp_path / "runs.db")  # the first release's table: no schedule column
    con.execute("CREATE TABLE runs (run_id TEXT PRIMARY KEY, name TEXT, inventory TEXT, script TEXT, hosts TEXT, "
                "status TEXT NOT NULL, exit_code INTEGER, started_at TEXT, ended_at TEXT, failed_host TEXT)")
    con.execute("INSERT INTO runs VALUES ('20261001-100000-0000', NULL, '/i.yaml', 't.py', 'a', 'succeeded', 0, "
                "'2026-10-01T10:00:00+00:00', '2026-10-01T10:05:00+00:00', NULL)")
    con.commit()
    con.close()
    (tmp_path / "20261001-100000-0000").mkdir()  # its run folder (a row whose folder is gone is not listed)
    (tmp_path / "20261001-100000-0000" / "run.json").write_text(json.dumps(rec("20261001-100000-0000").to_json()))
    s = RunStore(tmp_path)
    assert [(r["run_id"], r["schedule"]) for r in s.list()] == [("20261001-100000-0000", None)]
    s.create(rec("20261129-100000-aaaa", schedule="nightly"))
    assert s.last_run("nightly")["run_id"] == "20261129-100000-aaaa" and len(s.list()) == 2


def _mode(p) -> int:
    import os
    import stat
    return stat.S_IMODE(os.stat(p).st_mode)


def test_everything_the_store_writes_is_private_whatever_the_umask(tmp_path):
    import os
    import sqlite3
    old = os.umask(0o000)  # the most permissive umask: every mode below is the store's own doing
    try:
        s = RunStore(tmp_path / "runs")
        s.create(rec("20261129-100000-aaaa"))
        s.update("20261129-100000-aaaa", lambda r: r)
        s.append_log("20261129-100000-aaaa", "a", b"token=s3cret\n")
        s.close_logs()
        with s.log_writer("20261129-100000-aaaa", "b") as f:
            f.write(b"token=s3cret\n")
        s.record_firing("nightly", "skipped: lock held", reason="still running")
        con = sqlite3.connect(tmp_path / "runs" / "runs.db")  # an open reader keeps -wal and -shm there
        con.execute("SELECT count(*) FROM runs").fetchall()
        s.update("20261129-100000-aaaa", lambda r: replace(r, status=RunStatus.SUCCEEDED))
        held = s.hold("20261129-100000-aaaa")  # the in-use lock (an up, a collect)
        assert held is not None
        held.close()
        run = tmp_path / "runs" / "20261129-100000-aaaa"
        files = {p: _mode(p) for p in [tmp_path / "runs" / f"runs.db{x}" for x in ("", "-wal", "-shm")]
                 + [run / "run.json", run / ".run.json.lock", run / ".in-use.lock", run / "logs" / "a.log",
                    run / "logs" / "b.log"]}
        con.close()
        assert files == {p: 0o600 for p in files}, {str(p): oct(m) for p, m in files.items()}
        dirs = {p: _mode(p) for p in (tmp_path / "runs", run, run / "logs")}
        assert dirs == {p: 0o700 for p in dirs}, {str(p): oct(m) for p, m in dirs.items()}
    finally:
        os.umask(old)


def test_a_runs_folder_others_can_read_is_made_private_on_the_next_write(tmp_path, caplog):
    import os
    old = os.umask(0o000)
    try:
        (tmp_path / "runs" / "20261001-100000-0000").mkdir(mode=0o755, parents=True)  # as an older clusterddp
        os.chmod(tmp_path / "runs", 0o755)                                             # left it
        old_record = tmp_path / "runs" / "20261001-100000-0000" / "run.json"
        old_record.write_text(json.dumps(rec("20261001-100000-0000").to_json()))
        os.chmod(old_record, 0o644)
        assert len(RunStore(tmp_path / "runs").list()) == 1
        assert _mode(tmp_path / "runs") == 0o755  # reading changes nothing
        RunStore(tmp_path / "runs").create(rec("20261129-100000-aaaa"))
    finally:
        os.umask(old)
    assert _mode(tmp_path / "runs") == 0o700
    assert f"{tmp_path / 'runs'} was open to other users (mode 0755); made it 0700" in caplog.text
    assert [r["run_id"] for r in RunStore(tmp_path / "runs").list()] == ["20261129-100000-aaaa", "20261001-100000-0000"]
    RunStore(tmp_path / "runs").update("20261001-100000-0000", lambda r: r)
    assert _mode(old_record) == 0o600


def _open_fresh(root: str, go) -> None:
    go.wait()
    RunStore(root)._write_db().close()


def test_launchers_opening_a_fresh_runs_folder_at_once_all_get_the_index(tmp_path):
    # the first open turns runs.db into WAL; SQLite refused the others at once ("database is
    # locked", no busy wait): about 1 round in 6 lost a launcher before the fix
    ctx = mp.get_context("fork")
    for i in range(40):
        root, go = tmp_path / str(i), ctx.Event()
        procs = [ctx.Process(target=_open_fresh, args=(str(root), go)) for _ in range(3)]
        for p in procs:
            p.start()
        go.set()
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0, 0, 0], f"round {i}"
