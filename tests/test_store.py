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
