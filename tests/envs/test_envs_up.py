"""`up` with `packages:`, launcher side: a lock that is not one stops `prepare` (no network), and once every
node's environment is ready the run is planned, probed and recorded with each environment's python."""

from __future__ import annotations

import pytest

from clusterddp.backends import base
from clusterddp.backends.ssh import launch as L
from clusterddp.envs import nodes as E
from clusterddp.errors import LockFileError
from clusterddp.fleet import Fleet
from clusterddp.runspec import RunSpec


def _inventory(tmp_path, lock: str = "torch==2.13.0\n"):
    (tmp_path / "t.py").write_text("print('hi')\n")
    (tmp_path / "req.txt").write_text(lock)
    (tmp_path / "inv.yaml").write_text("defaults: {packages: req.txt, python: /opt/base/bin/python}\n"
                                       "hosts: [{name: a, address: 10.0.0.1}, {name: b, address: 10.0.0.2}]\n")


def test_a_lock_that_is_not_one_stops_prepare(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _inventory(tmp_path, "torch>=2\n")
    with pytest.raises(LockFileError, match=r"req.txt:1: 'torch>=2' is not pinned"):
        L.prepare("inv.yaml", RunSpec("t.py"), str(tmp_path / "runs"))


class Said(base.Events):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def say(self, line: str) -> None:
        self.lines.append(line)

    def warn(self, line: str) -> None:
        self.lines.append(line)


def test_the_run_is_planned_probed_and_recorded_with_each_environments_python(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _inventory(tmp_path)
    prep = L.prepare("inv.yaml", RunSpec("t.py"), str(tmp_path / "runs"))
    assert prep.locks is not None and set(prep.locks) == {"a", "b"}
    assert [n.host.python for n in prep.plan.nodes] == ["/opt/base/bin/python"] * 2
    lk = prep.locks["a"]

    def survey(fleet, hosts, by_host, cache=None):
        assert [h.python for h in hosts] == ["/opt/base/bin/python"] * 2 and set(by_host) == {"a", "b"}
        return {h.name: E.Plan(h, lk, f"id{h.name}" * 4, f"/w/{h.name}/envs", f"/w/{h.name}/envs/id/bin/python",
                               h.name == "a") for h in hosts}

    def ready(fleet, plans, cache=None, on_wait=None):
        return {n: E.Made(n, p.env_id, p.python, lk.sha256, 0 if p.ready else 123, not p.ready)
                for n, p in plans.items()}
    monkeypatch.setattr(E, "survey", survey)
    monkeypatch.setattr(E, "ready", ready)
    said = Said()
    fleet = Fleet(prep.plan.inventory.hosts)
    got = L._environments(prep, fleet, said)
    assert [n.host.python for n in got.plan.nodes] == ["/w/a/envs/id/bin/python", "/w/b/envs/id/bin/python"]
    assert [h.python for h in got.plan.inventory.hosts] == [n.host.python for n in got.plan.nodes]
    assert [h.python for h in fleet.hosts] == [n.host.python for n in got.plan.nodes]  # what the preflight probes
    records = L.node_records(got.plan)
    assert [(r.settings.env_id, r.settings.lock_sha256) for r in records] == [("ida" * 4, lk.sha256),
                                                                               ("idb" * 4, lk.sha256)]
    assert "[clusterddp] b: environment idbidbidbidb will be built (0 B of wheels to send)" in said.lines
    assert said.lines[-1] == ("[clusterddp] environment idaidaidaida, idbidbidbidb: built on b, ready on the other 1; "
                              "sent 123 B")


def test_run_json_keeps_each_nodes_environment_and_an_older_record_reads_without_one(tmp_path, monkeypatch):
    from dataclasses import replace

    from clusterddp.record import NodeRecord
    monkeypatch.chdir(tmp_path)
    _inventory(tmp_path)
    prep = L.prepare("inv.yaml", RunSpec("t.py"), str(tmp_path / "runs"))
    [a, _] = L.node_records(prep.plan)
    a = replace(a, settings=replace(a.settings, env_id="e" * 24, lock_sha256="f" * 64, python="/w/envs/e/bin/python"))
    data = a.to_json()
    assert data["settings"]["env_id"] == "e" * 24 and data["settings"]["lock_sha256"] == "f" * 64
    assert NodeRecord.from_json(data, "run.json", "nodes[0]") == a
    for key in ("env_id", "lock_sha256", "packages"):
        data["settings"].pop(key)
    old = NodeRecord.from_json(data, "run.json", "nodes[0]")
    assert old.settings.env_id is None and old.settings.lock_sha256 is None and old.settings.packages is None


def test_runs_json_names_each_nodes_environment(tmp_path):
    import json
    from dataclasses import replace

    from clusterddp.record import RunStatus
    from clusterddp.store import RunStore
    from helpers import cddp, make_record
    rec = make_record("20261206-070000-e1e1", status=RunStatus.SUCCEEDED, ended_at="2026-11-29T10:01:00+00:00")
    rec = replace(rec, nodes=tuple(replace(n, settings=replace(n.settings, env_id="e" * 24, lock_sha256="f" * 64))
                                   for n in rec.nodes))
    store = RunStore(tmp_path / "runs")
    store.create(rec)
    store.create(make_record("20261206-060000-0000", status=RunStatus.SUCCEEDED, ended_at="2026-11-29T10:01:00+00:00"))
    rows = {r["run_id"]: r for r in json.loads(cddp("runs", "--runs-dir", str(tmp_path / "runs"), "--json",
                                                    check_rc=0).stdout)}
    assert rows["20261206-070000-e1e1"]["environments"] == {h: {"env_id": "e" * 24, "lock_sha256": "f" * 64}
                                                            for h in ("a", "b")}
    assert rows["20261206-060000-0000"]["environments"] is None
