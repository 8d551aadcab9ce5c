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


def _look_answer(lock_sha: str, host: str, ready: bool) -> tuple[bytes, str]:
    facts = {"python": "3.11.2", "impl": "cpython", "tag": "cp311", "exe": "/usr/bin/python3.11",
             "platform": "manylinux_2_36_x86_64", "root": f"/w/{host}/envs", "wheels": []}
    eid = env_nodes.env_id(lock_sha, facts)
    facts["envs"] = [eid] if ready else []
    return (b"login banner\n" + (env_nodes.MARK + __import__("json").dumps(facts)).encode()
            + b"\nCLUSTERDDP_PROBE {}\n"), eid


def test_a_second_up_looks_at_environments_ready_last_time_in_the_preflights_own_command(tmp_path, monkeypatch):
    """The environments this machine found or made ready before: no look before the preflight; its probe
    (one command per node, beside the lease) looks at them first, and the run takes their pythons."""
    monkeypatch.setenv("CLUSTERDDP_CACHE", str(tmp_path / "cache"))
    prep = _prepare(tmp_path, monkeypatch)
    lk = prep.locks["a"]
    assert ssh_launch._folded(prep, skip_check=False) is None  # never seen ready from here: looked at first
    env_nodes.remember(prep.plan.inventory.hosts[0], lk.sha256)
    assert ssh_launch._folded(prep, skip_check=False) is None  # b was not
    env_nodes.remember(prep.plan.inventory.hosts[1], lk.sha256)
    looks = ssh_launch._folded(prep, skip_check=False)
    assert looks == {h: env_nodes.look_args(prep.plan.inventory.hosts[i], lk) for i, h in enumerate("ab")}
    assert ssh_launch._folded(prep, skip_check=True) is None  # no preflight to look in

    asked: list = []

    class Report:
        ok = True

    def run_checks(inv, **kw):
        asked.append(kw["env_looks"])
        for h in "ab":
            kw["on_stdout"](h, _look_answer(lk.sha256, h, True)[0])
        return Report()
    import clusterddp.check
    monkeypatch.setattr(clusterddp.check, "run_checks", run_checks)
    monkeypatch.setattr(env_nodes, "survey", lambda *a, **k: pytest.fail("a look of its own"))
    fleet = Fleet(prep.plan.inventory.hosts)
    outs: dict[str, bytes] = {}
    assert ssh_launch.preflight(prep.plan, fleet=fleet, env_looks=looks, outs=outs) is fleet
    assert asked == [looks] and set(outs) == {"a", "b"}
    said = Said()
    got = ssh_launch._environments_found(prep, fleet, said, looks, outs, None)
    eid = _look_answer(lk.sha256, "a", True)[1]
    assert [n.host.python for n in got.plan.nodes] == [f"/w/{h}/envs/{eid}/bin/python" for h in "ab"]
    assert [r.settings.env_id for r in ssh_launch.node_records(got.plan)] == [eid] * 2
    assert said.lines == [f"[clusterddp] environment {eid}: ready on 2 node(s); nothing sent"]


def test_an_environment_gone_since_is_made_ready_and_the_preflight_runs_again_on_the_leases_slots(tmp_path,
                                                                                                    monkeypatch):
    prep = _prepare(tmp_path, monkeypatch)
    lk = prep.locks["a"]
    looks = {h.name: env_nodes.look_args(h, lk) for h in prep.plan.inventory.hosts}
    outs = {"a": _look_answer(lk.sha256, "a", True)[0], "b": _look_answer(lk.sha256, "b", False)[0]}

    class Report:
        ok = False  # b's probe ran with the base python: no torch

    import clusterddp.check
    monkeypatch.setattr(clusterddp.check, "run_checks", lambda inv, **kw: Report())
    fleet = Fleet(prep.plan.inventory.hosts)
    assert ssh_launch.preflight(prep.plan, fleet=fleet, env_looks=looks, outs=dict(outs)) is fleet  # its verdict waits

    def survey(fleet, hosts, by_host, cache=None):
        return {h.name: env_nodes.Plan(h, lk, "e" * 24, f"/w/{h.name}/envs", f"/w/{h.name}/envs/e/bin/python",
                                       h.name == "a") for h in hosts}

    def ready(fleet, plans, cache=None, on_wait=None):
        return {n: env_nodes.Made(n, p.env_id, p.python, lk.sha256, 0 if p.ready else 5, not p.ready)
                for n, p in plans.items()}
    checked: list = []
    monkeypatch.setattr(env_nodes, "survey", survey)
    monkeypatch.setattr(env_nodes, "ready", ready)
    monkeypatch.setattr(ssh_launch, "preflight", lambda plan, fleet=None: checked.append(plan))

    class Lease:
        grants = {"a": (1,), "b": (0,)}
    got = ssh_launch._environments_found(prep, fleet, Said(), looks, outs, Lease())  # type: ignore[arg-type]
    assert [n.host.python for n in got.plan.nodes] == ["/w/a/envs/e/bin/python", "/w/b/envs/e/bin/python"]
    assert checked == [got.plan]  # checked again, on the environments' pythons
    assert [dict(n.env).get("CUDA_VISIBLE_DEVICES") for n in got.plan.nodes] == ["1", "0"]


def test_a_made_ready_environment_is_remembered_for_the_next_up(tmp_path):
    from clusterddp.inventory.loader import local
    host = local().hosts[0]
    assert not env_nodes.likely_ready([host], {host.name: _lock()}, tmp_path)
    plan = env_nodes.Plan(host, _lock(), "e" * 24, "/w/envs", "/w/envs/e/bin/python", True)

    class NoFleet:
        def each(self, fn, hosts):
            class Done:
                succeeded = {h.name: fn(h, None) for h in hosts}
                failed: dict = {}
            return Done()
    env_nodes.ready(NoFleet(), {host.name: plan}, tmp_path)  # type: ignore[arg-type]
    assert env_nodes.likely_ready([host], {host.name: _lock()}, tmp_path)
    other = __import__("dataclasses").replace(host, python="/opt/other/python")
    assert not env_nodes.likely_ready([other], {host.name: _lock()}, tmp_path)


def _lock():
    from clusterddp.envs.lock import parse
    return parse(b"cddptiny==1.0\n", "req.txt")


def test_check_looks_at_each_environment_in_its_probes_own_command_and_builds_nothing(tmp_path, monkeypatch, capsys):
    from clusterddp import backends
    from clusterddp.cli import check as check_cli
    from clusterddp.inventory import load
    _prepare(tmp_path, monkeypatch)
    inv = load("inv.yaml")
    lk = env_nodes.locks(inv)["a"]
    asked: list = []

    def run_checks(inv, **kw):
        asked.append(sorted(kw["env_looks"]))
        for h in "ab":
            kw["on_stdout"](h, _look_answer(lk.sha256, h, h == "a")[0])
        return "the report"
    import clusterddp.check
    monkeypatch.setattr(clusterddp.check, "run_checks", run_checks)
    monkeypatch.setattr(env_nodes, "_look", lambda *a, **k: pytest.fail("a look of its own"))
    monkeypatch.setattr(env_nodes, "ready", lambda *a, **k: pytest.fail("built"))
    monkeypatch.setattr(env_nodes.wheels_module, "fetch", lambda lock, target, cache=None, hosts=(): ())
    monkeypatch.setattr(env_nodes.wheels_module, "installer", lambda target, cache=None: env_nodes.wheels_module.Wheel(
        "f" * 64, "uv-0.13.9-py3-none-any.whl", 1000))
    report, envs = check_cli._checked(inv, backends.for_inventory(inv), None, False)
    eid = _look_answer(lk.sha256, "a", True)[1]
    assert report == "the report" and asked == [["a", "b"]]
    out = capsys.readouterr().out
    assert f"env  a environment {eid} ready" in out
    other = _look_answer(lk.sha256, "b", False)[1]
    assert f"env  b environment {other} will be built (1000 B of wheels to send)" in out
    assert envs["a"]["state"] == "ready" and envs["b"]["state"] == "will be built" and envs["b"]["to_send"] == 1000


def test_run_json_never_keeps_the_index_urls_credentials_and_reads_back_the_wheels_mode(tmp_path, monkeypatch):
    from clusterddp.record import NodeRecord
    _prepare(tmp_path, monkeypatch)
    (tmp_path / "inv.yaml").write_text(
        "defaults: {packages: {file: req.txt, wheels: index, index_url: 'https://ci:s3cret@idx.example/simple'},"
        " python: /opt/base/bin/python}\nhosts: [{name: a, address: 10.0.0.1}]\n")
    prep = ssh_launch.prepare("inv.yaml", resolved(RunSpec("t.py"), "inv.yaml"), str(tmp_path / "runs"))
    [node] = ssh_launch.node_records(prep.plan)
    assert node.settings.index_url is not None  # the run has it, to send the node on stdin
    data = node.to_json()
    assert "s3cret" not in __import__("json").dumps(data) and data["settings"]["wheels"] == "index"
    back = NodeRecord.from_json(data, "run.json", "nodes[0]")
    assert back.settings.wheels == "index" and back.settings.index_url is None
