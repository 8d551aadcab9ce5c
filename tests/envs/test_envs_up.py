"""`up` with `packages:`, launcher side: a lock that is not one stops `prepare` (no network), and once every
node's environment is ready the run is planned, probed and recorded with each environment's python."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from clusterddp import plan as ssh_plan
from clusterddp.backends import base
from clusterddp.backends.ssh import launch as ssh_launch
from clusterddp.envs import nodes as env_nodes
from clusterddp.errors import HostError, LockFileError
from clusterddp.fleet import Fleet
from clusterddp.runspec import RunSpec
from helpers import resolved


def _prepare(tmp_path, monkeypatch, lock: str = "torch==2.13.0\n", spares: bool = False) -> ssh_launch.Prepared:
    """`up`'s planning (no network) of hosts a and b (and, with ``spares``, spares s1 and s2) whose
    `packages:` is ``lock``, from ``tmp_path``."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("print('hi')\n")
    (tmp_path / "req.txt").write_text(lock)
    (tmp_path / "inv.yaml").write_text(
        "defaults: {packages: req.txt, python: /opt/base/bin/python}\n"
        "hosts: [{name: a, address: 10.0.0.1}, {name: b, address: 10.0.0.2}]\n"
        + ("spares: [{name: s1, address: 10.0.0.3}, {name: s2, address: 10.0.0.4}]\n" if spares else ""))
    return ssh_launch.prepare("inv.yaml", resolved(RunSpec("t.py"), "inv.yaml"), str(tmp_path / "runs"))


def _spare_fleet(succeeded: tuple[str, ...], failed: dict, hosts: list[str] | None = None) -> type:
    """A Fleet for the spares' environments whose open() answers from ``succeeded`` and ``failed``
    (host -> error); with ``hosts``, it checks it was made for those."""
    class SpareFleet:
        def __init__(self, given, fanout=None):
            assert hosts is None or [h.name for h in given] == hosts

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return None

        def open(self):
            return SimpleNamespace(succeeded={h: object() for h in succeeded}, failed=failed)
    return SpareFleet


def test_a_lock_that_is_not_one_stops_prepare(tmp_path, monkeypatch):
    with pytest.raises(LockFileError, match=r"req.txt:1: 'torch>=2' is not pinned"):
        _prepare(tmp_path, monkeypatch, "torch>=2\n")


class Said(base.Events):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def say(self, line: str) -> None:
        self.lines.append(line)

    def warn(self, line: str) -> None:
        self.lines.append(line)


def test_the_run_is_planned_probed_and_recorded_with_each_environments_python(tmp_path, monkeypatch):
    prep = _prepare(tmp_path, monkeypatch)
    assert prep.locks is not None and set(prep.locks) == {"a", "b"}
    assert [n.host.python for n in prep.plan.nodes] == ["/opt/base/bin/python"] * 2
    lk = prep.locks["a"]

    def survey(fleet, hosts, by_host, cache=None):
        assert [h.python for h in hosts] == ["/opt/base/bin/python"] * 2 and set(by_host) == {"a", "b"}
        return {h.name: env_nodes.Plan(h, lk, f"id{h.name}" * 4, f"/w/{h.name}/envs", f"/w/{h.name}/envs/id/bin/python",
                               h.name == "a") for h in hosts}

    def ready(fleet, plans, cache=None, on_wait=None):
        return {n: env_nodes.Made(n, p.env_id, p.python, lk.sha256, 0 if p.ready else 123, not p.ready)
                for n, p in plans.items()}
    monkeypatch.setattr(env_nodes, "survey", survey)
    monkeypatch.setattr(env_nodes, "ready", ready)
    said = Said()
    fleet = Fleet(prep.plan.inventory.hosts)
    got = ssh_launch._environments(prep, fleet, said)
    assert [n.host.python for n in got.plan.nodes] == ["/w/a/envs/id/bin/python", "/w/b/envs/id/bin/python"]
    assert [h.python for h in got.plan.inventory.hosts] == [n.host.python for n in got.plan.nodes]
    assert [h.python for h in fleet.hosts] == [n.host.python for n in got.plan.nodes]  # what the preflight probes
    records = ssh_launch.node_records(got.plan)
    assert [(r.settings.env_id, r.settings.lock_sha256) for r in records] == [("ida" * 4, lk.sha256),
                                                                               ("idb" * 4, lk.sha256)]
    assert "[clusterddp] b: environment idbidbidbidb will be built (0 B of wheels to send)" in said.lines
    assert said.lines[-1] == ("[clusterddp] environment idaidaidaida, idbidbidbidb: built on b, ready on the other 1; "
                              "sent 123 B")


def test_run_json_keeps_each_nodes_environment_and_an_older_record_reads_without_one(tmp_path, monkeypatch):
    from dataclasses import replace

    from clusterddp.record import NodeRecord
    prep = _prepare(tmp_path, monkeypatch)
    [a, _] = ssh_launch.node_records(prep.plan)
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


def test_a_run_that_lists_spares_builds_their_environments_as_it_starts(tmp_path, monkeypatch):
    """A spare a later attempt brings in runs with its environment's python, built at the start (so that
    attempt never waits for a build); a spare whose environment cannot be made is left out, said."""
    prep = _prepare(tmp_path, monkeypatch, spares=True)
    lk = prep.locks["a"]

    def survey(fleet, hosts, by_host, cache=None):
        if [h.name for h in hosts] == ["s2"]:
            raise HostError("s2", "environment build: no room")
        return {h.name: env_nodes.Plan(h, lk, "e" * 24, f"/w/{h.name}/envs", f"/w/{h.name}/envs/e/bin/python", False)
                for h in hosts}

    def ready(fleet, plans, cache=None, on_wait=None):
        return {n: env_nodes.Made(n, p.env_id, p.python, lk.sha256, 1, True) for n, p in plans.items()}

    monkeypatch.setattr(env_nodes, "survey", survey)
    monkeypatch.setattr(env_nodes, "ready", ready)
    monkeypatch.setattr(env_nodes, "Fleet", _spare_fleet(("s1", "s2"), {}, ["s1", "s2"]))
    said = Said()
    got = ssh_launch._environments(prep, Fleet(prep.plan.inventory.hosts), said)
    spares = got.plan.inventory.spares
    assert [(s.name, s.python, s.env_id) for s in spares] == [("s1", "/w/s1/envs/e/bin/python", "e" * 24)]
    assert "[clusterddp] spare s2 is not used: its environment: s2: environment build: no room" in said.lines, \
        said.lines
    assert "[clusterddp] spare s1: environment eeeeeeeeeeeeeeeeeeeeeeee will be built (0 B of wheels to send)" \
        in said.lines
    # the attempt that brings s1 in for a lost host plans it with its environment's python, recorded
    inv = got.plan.inventory
    nxt = ssh_plan.build_plan(inv.in_use((inv.hosts[0], spares[0])), prep.plan.spec, prep.plan.run_id)
    assert [(n.host.name, n.host.python) for n in nxt.nodes] == [("a", "/w/a/envs/e/bin/python"),
                                                                  ("s1", "/w/s1/envs/e/bin/python")]
    assert [r.settings.env_id for r in ssh_launch.node_records(nxt)] == ["e" * 24] * 2


def test_a_spare_that_does_not_answer_as_the_run_starts_is_left_out_said(tmp_path, monkeypatch):
    prep = _prepare(tmp_path, monkeypatch, spares=True)
    monkeypatch.setattr(env_nodes, "Fleet", _spare_fleet((), {"s1": OSError("connection refused"),
                                                              "s2": OSError("no route to host")}))
    said: list[str] = []
    got = env_nodes.spares_ready(prep.plan.inventory.spares, 4, said.append)
    assert got == ()
    assert said == ["[clusterddp] spare s1 is not used: its environment cannot be built (connection refused)",
                    "[clusterddp] spare s2 is not used: its environment cannot be built (no route to host)"]
