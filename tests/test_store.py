"""The run store on real SQLite and real files, including two writers at once."""

from __future__ import annotations

import json
import multiprocessing as mp
import re
from datetime import datetime, timezone

import pytest

from clusterddp.errors import RunNotFound
from clusterddp.store import RunStore, new_run_id


def rec(run_id: str, **kw) -> dict:
    return {"run_id": run_id, "name": None, "status": "running", "started_at": "2026-11-29T10:00:00+00:00",
            "nodes": [{"host": "a"}, {"host": "b"}], **kw}


def test_run_ids_sort_by_time_and_are_folder_safe():
    a = new_run_id(datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc), "ffff")
    b = new_run_id(datetime(2026, 1, 2, 3, 4, 6, tzinfo=timezone.utc), "0000")
    assert a == "20260102-030405-ffff" and a < b
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{4}", new_run_id())


def test_create_update_list_and_resolve(tmp_path):
    s = RunStore(tmp_path)
    s.create(rec("20261129-100000-aaaa"))
    s.create(rec("20261129-110000-bbbb", started_at="2026-11-29T11:00:00+00:00"))
    s.update("20261129-100000-aaaa", status="failed", failed_host="b", nodes={"b": {"exit_code": 3}})
    on_disk = json.loads((tmp_path / "20261129-100000-aaaa" / "run.json").read_text())
    assert on_disk["status"] == "failed" and on_disk["nodes"][1]["exit_code"] == 3
    rows = s.list()
    assert [r["run_id"] for r in rows] == ["20261129-110000-bbbb", "20261129-100000-aaaa"]
    assert rows[1]["status"] == "failed" and rows[1]["hosts"] == "a,b"
    assert s.resolve("20261129-11") == "20261129-110000-bbbb"
    with pytest.raises(RunNotFound, match="matches 2 runs"):
        s.resolve("20261129-1")
    with pytest.raises(RunNotFound):
        s.resolve("2025")


def test_artifact_paths_cannot_escape_the_run_folder(tmp_path):
    s = RunStore(tmp_path)
    with pytest.raises(ValueError):
        s.artifact_path("r", "a", "../../etc/passwd")
    assert s.artifact_path("r", "a", "checkpoints/x.pt").parts[-4:] == ("artifacts", "a", "checkpoints", "x.pt")


def _writer(root: str, tag: str, n: int) -> None:
    s = RunStore(root)
    for i in range(n):
        rid = f"20261129-1200{i:02d}-{tag}"
        s.create(rec(rid))
        s.update(rid, status="succeeded", exit_code=0)


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
    for i in range(n):
        s.update(run_id, nodes={host: {f"k{i}": i}})  # a lost update would drop a key for good


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
    nodes = RunStore(tmp_path).load("20261129-130000-cccc")["nodes"]
    for n in nodes:
        assert sum(k.startswith("k") for k in n) == 150, f"{n['host']} lost updates"
