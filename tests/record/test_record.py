"""The typed run record: JSON round trip, records written by the previous version, damaged records,
the one state vocabulary, and the inventory's fanout reaching every command that reads a record."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from clusterddp.backends.base import RunOutcome
from clusterddp.backends.ssh import control
from clusterddp.backends.ssh import launch as jobs
from clusterddp.errors import NodeOutcome, UsageError
from clusterddp.inventory import Host
from clusterddp.node.reply import STATUS_MARK
from clusterddp.nodeops import parse_status
from clusterddp.record import NodeState, RecordError, RunRecord, RunStatus, from_report
from clusterddp.runspec import RunSpec
from clusterddp.store import RunStore
from clusterddp.transport import CommandResult
from helpers import make_record, resolved

FIXTURES = Path(__file__).parent.parent / "fixtures"
V0_SSH = FIXTURES / "run-v0-ssh-status.json"
V0_LOCAL = FIXTURES / "run-v0-local-succeeded.json"


def full_record() -> RunRecord:
    """A record with every field set away from its default, and every kind of Host value."""
    rec = make_record("20261129-181500-3f9a", ("gpu-01", "gpu-02"), name="nightly", args=("--lr", "0.1 x"),
                      status=RunStatus.FAILED, failed_host="gpu-02", schedule="nightly", local=False,
                      ended_at="2026-11-29T18:20:00+00:00", collect=("checkpoints/**", "*.log"), fanout=7)
    a, b = rec.nodes
    a = replace(a, state=NodeState.STOPPED, exit_code=143, settings=replace(
        a.settings, user=None, port=2222, identity_file="~/.ssh/id_ed25519", host_key_policy="accept-new",
        gpus="auto", env=(("NCCL_DEBUG", "WARN"), ("A", "x y ü")), setup=("source ~/venv/bin/activate",),
        connect_timeout=3.5, keepalive=0.0), nproc="auto")
    b = replace(b, state=NodeState.FAILED, exit_code=3, error="boom",
                settings=replace(b.settings, gpus=2, slots=(0, 3), lease_dir="/var/lib/leases"))
    return replace(rec, nodes=(a, b))


def test_a_full_record_round_trips_through_json_and_keeps_run_json_keys():
    rec = full_record()
    text = json.dumps(rec.to_json())
    back = RunRecord.from_json(json.loads(text), "run.json")
    assert back == rec
    assert back.nodes[0].settings.env == (("NCCL_DEBUG", "WARN"), ("A", "x y ü"))
    # The keys people and scripts read (tests/helpers.record, jq on run.json) are today's plus schema and fanout.
    old = json.loads(V0_SSH.read_text())
    new = rec.to_json()
    assert set(new) == set(old) | {"schema", "fanout", "updated_at"} and new["schema"] == 1 and new["fanout"] == 7
    assert set(new["nodes"][0]) == set(old["nodes"][0])
    assert set(new["nodes"][0]["settings"]) == set(old["nodes"][0]["settings"])
    assert list(new["nodes"][1]["settings"]["slots"]) == [0, 3]
    assert new["status"] == "failed" and new["exit_code"] == 1 and new["nodes"][1]["exit_code"] == 3


def test_a_record_written_by_the_previous_version_still_reads(tmp_path):
    rec = RunRecord.from_json(json.loads(V0_SSH.read_text()), str(V0_SSH))
    assert rec.status is RunStatus.RUNNING and rec.fanout == 32 and rec.schema == 1  # no fanout then: the default
    # `status` wrote exited/missing/unreachable; they mean failed (exit 1), lost, unreachable now
    assert [(n.state, n.exit_code) for n in rec.nodes] == [
        (NodeState.FAILED, 1), (NodeState.LOST, None), (NodeState.UNREACHABLE, None)]
    assert rec.nodes[1].error == "no run folder on the node"
    assert rec.nodes[2].error == "gpu-03: cannot connect to 10.0.0.13:22: timed out"
    s = rec.nodes[1].settings
    assert s == Host(name="gpu-02", address="10.0.0.12", user="ubuntu", port=None,
                     identity_file="~/.ssh/id_ed25519", known_hosts="~/.ssh/known_hosts", host_key_policy="strict",
                     gpus=4, python="python3", workdir="~/clusterddp", env=(("NCCL_DEBUG", "WARN"), ("A", "x y")),
                     setup=("source ~/venv/bin/activate",), connect_timeout=10.0, transport="ssh", keepalive=5.0)
    assert (rec.master_addr, rec.master_port, rec.collect, rec.args) == (
        "10.0.0.11", 29511, ("checkpoints/**",), ("--epochs", "3"))
    local = RunRecord.from_json(json.loads(V0_LOCAL.read_text()), str(V0_LOCAL))
    assert local.status is RunStatus.SUCCEEDED and local.nodes[0].state is NodeState.SUCCEEDED
    assert local.nodes[0].settings.transport == "local" and local.local
    # Through the store: an update rewrites it in today's format, everything else kept.
    store = RunStore(tmp_path)
    (tmp_path / rec.run_id).mkdir()
    shutil.copy(V0_SSH, tmp_path / rec.run_id / "run.json")
    store.update(rec.run_id, lambda r: r)
    on_disk = json.loads((tmp_path / rec.run_id / "run.json").read_text())
    old = json.loads(V0_SSH.read_text())
    assert on_disk["schema"] == 1 and on_disk["fanout"] == 32 and on_disk["updated_at"]  # stamped by the write
    assert {k: v for k, v in on_disk.items() if k not in ("schema", "fanout", "updated_at", "nodes")} == \
        {k: v for k, v in old.items() if k != "nodes"}
    assert [n["state"] for n in on_disk["nodes"]] == ["failed", "lost", "unreachable"]
    assert [n["settings"] for n in on_disk["nodes"]] == [n["settings"] for n in old["nodes"]]


def _damage(data: dict, how: str) -> dict:
    if how == "missing":
        del data["nodes"][1]["exit_code"]
    elif how == "wrong type":
        data["nodes"][0]["settings"]["port"] = "22"
    elif how == "bool for int":
        data["master"]["port"] = True
    elif how == "bad status":
        data["status"] = "exploded"
    elif how == "bad state":
        data["nodes"][2]["state"] = "napping"
    elif how == "env not strings":
        data["nodes"][0]["settings"]["env"] = {"A": 1}
    elif how == "unknown setting":
        data["nodes"][0]["settings"]["colour"] = "red"
    elif how == "newer schema":
        data["schema"] = 99
    elif how == "nodes not a list":
        data["nodes"] = {"gpu-01": {}}
    elif how == "node not an object":
        data["nodes"][1] = "gpu-02"
    return data


@pytest.mark.parametrize("how, where", [
    ("missing", "nodes[1].exit_code: required, but missing"),
    ("wrong type", "nodes[0].settings.port: must be an integer or null, not a string '22'"),
    ("bool for int", "master.port: must be an integer, not a boolean True"),
    ("bad status", "status: 'exploded' is not one of running, succeeded, failed, stopped"),
    ("bad state", "nodes[2].state: 'napping' is not one of pending, starting, running"),
    ("env not strings", "nodes[0].settings.env: must be an object of strings"),
    ("unknown setting", "nodes[0].settings.colour: not a host setting this clusterddp knows"),
    ("newer schema", "schema: version 99, newer than this clusterddp reads (1)"),
    ("nodes not a list", "nodes: must be a list, not an object"),
    ("node not an object", "nodes[1]: must be a JSON object, not a string"),
])
def test_a_damaged_record_is_a_located_usage_error(tmp_path, how, where):
    store = RunStore(tmp_path)
    run_id = "20261129-181500-3f9a"
    (tmp_path / run_id).mkdir()
    path = tmp_path / run_id / "run.json"
    path.write_text(json.dumps(_damage(json.loads(V0_SSH.read_text()), how)))
    with pytest.raises(UsageError) as e:
        store.load(run_id)
    assert isinstance(e.value, RecordError) and e.value.exit_code == 2
    assert str(e.value).startswith(f"{path}: {where}"), str(e.value)
    assert "hint:" in str(e.value)


@pytest.mark.parametrize("text, words", [
    ("{\"run_id\": ", "run.json: not valid JSON (line 1 column 12"),
    ("[1, 2]", "run.json: must be a JSON object, not a list"),
    ("", "run.json: not valid JSON"),
])
def test_garbage_is_a_located_usage_error(tmp_path, text, words):
    (tmp_path / "r1").mkdir()
    (tmp_path / "r1" / "run.json").write_text(text)
    with pytest.raises(RecordError, match="hint") as e:
        RunStore(tmp_path).load("r1")
    assert words in str(e.value) and str(tmp_path / "r1" / "run.json") in str(e.value)


def test_one_exit_code_mapping():
    assert {s.value: s.exit_code for s in RunStatus} == {"running": None, "succeeded": 0, "failed": 1, "stopped": 130}
    assert [s.is_terminal() for s in RunStatus] == [False, True, True, True]
    outcome = RunOutcome(RunStatus.STOPPED, (NodeOutcome("a", 0, 143),))
    assert outcome.exit_code == 130
    for s in RunStatus:  # what run.json (and so runs.db and `runs --json`) says follows the status
        assert make_record("r", status=s).to_json()["exit_code"] == s.exit_code
    assert f"{RunStatus.FAILED}|{NodeState.LOST:>5}" == "failed| lost"  # the words print as words


@pytest.mark.parametrize("report, state, code, why", [
    ("running\n", NodeState.RUNNING, None, None),
    ("exit 0\n", NodeState.SUCCEEDED, 0, None),
    ("exit 143", NodeState.FAILED, 143, None),
    ("exit x", NodeState.LOST, None, "the exit code file is unreadable"),
    ("lost", NodeState.LOST, None, "no process and no exit code"),
    ("missing", NodeState.LOST, None, "no run folder on the node"),
    # a reply that is none of the words: nodeops.status shows it escaped; from_report names it
    ("garbage", NodeState.LOST, None, "unexpected status report 'garbled'"),
])
def test_a_status_report_maps_onto_the_one_vocabulary(report, state, code, why):
    kind, exit_code = parse_status(STATUS_MARK + report)
    assert exit_code == code and from_report(kind, exit_code) == (state, why)


def test_what_is_seen_of_a_node_is_recorded_by_one_rule():
    n = make_record("r").nodes[0]
    assert n.state is NodeState.PENDING
    running = n.seen(NodeState.RUNNING)
    assert running.state is NodeState.RUNNING
    assert running.seen(NodeState.FAILED, 3, "x") == replace(running, state=NodeState.FAILED, exit_code=3, error="x")
    # stopped stays stopped once it ended: SIGTERM's exit code is recorded, not read as a failure
    stopped = running.seen(NodeState.STOPPED)
    assert stopped.seen(NodeState.FAILED, 143) == replace(stopped, exit_code=143)
    assert stopped.seen(NodeState.LOST) == stopped
    assert stopped.seen(NodeState.RUNNING).state is NodeState.RUNNING  # it runs after all: say so
    # an outcome is kept when the node can no longer be seen (folder cleaned, host down)
    done = running.seen(NodeState.SUCCEEDED, 0)
    assert done.seen(NodeState.LOST, None, "no run folder on the node") == done
    assert done.seen(NodeState.UNREACHABLE, None, "timed out") == done
    assert running.seen(NodeState.UNREACHABLE, None, "timed out").state is NodeState.UNREACHABLE
    assert [s for s in NodeState if s.is_terminal()] == [
        NodeState.SUCCEEDED, NodeState.FAILED, NodeState.LOST, NodeState.STOPPED]


def test_the_inventorys_fanout_is_recorded_and_bounds_every_control_command(tmp_path, monkeypatch):
    (tmp_path / "t.py").write_text("print('hi')\n")
    (tmp_path / "inv.yaml").write_text("fanout: 3\nhosts:\n" + "".join(
        f"  - {{name: n{i}, address: n{i}.invalid}}\n" for i in range(5)))
    spec = resolved(RunSpec(str(tmp_path / "t.py")), tmp_path / "inv.yaml")
    prep = jobs.prepare(str(tmp_path / "inv.yaml"), spec, str(tmp_path / "runs"))
    rec = jobs.new_record(prep, str(tmp_path / "inv.yaml"))
    prep.store.create(rec)
    assert prep.store.load(rec.run_id).fanout == 3

    limits: list[int] = []
    import clusterddp.fleet
    real = clusterddp.fleet.fan_out

    def recording(items, fn, limit=None, **kw):
        limits.append(limit)
        return real(items, fn, 32 if limit is None else limit, **kw)
    monkeypatch.setattr(clusterddp.fleet, "fan_out", recording)  # the one parallel layer, under every Fleet

    class Node:
        def __init__(self, host: Host) -> None:
            self.name = host.name

        def run(self, command: str, **kw) -> CommandResult:
            return CommandResult(0, STATUS_MARK.encode() + b"running\n", b"")

        def stream(self, command, on_data, **kw) -> int:
            return 1

        def close(self) -> None:
            pass
    control.status(prep.store, rec.run_id, connect=Node)
    control.collect(prep.store, rec.run_id, connect=Node)
    control.node_logs(prep.store, rec.run_id, None, lambda h, source, f: None, connect=Node)
    control.follow(prep.store, rec.run_id, lambda h, b: None, None, {}, connect=Node)
    control.stop(prep.store, rec.run_id, grace=0, connect=Node)
    assert len(limits) >= 7 and all(limit == 3 for limit in limits), limits  # collect also fetches the samples


def test_the_clusterddp_version_that_started_a_run_is_recorded_and_read_back(tmp_path):
    import clusterddp
    from clusterddp.backends.base import new_record
    spec = RunSpec(script="t.py", script_args=())
    rec = new_record("local", spec, "r1", schedule=None, local=True, master_addr="127.0.0.1", master_port=29500,
                     collect=())
    assert rec.version == clusterddp.__version__
    data = rec.to_json()
    assert data["clusterddp_version"] == clusterddp.__version__
    assert RunRecord.from_json(data, "run.json").version == clusterddp.__version__
    # a record from before the field reads as "not known"; a damaged one is a located error
    old = json.loads(V0_SSH.read_text())
    assert "clusterddp_version" not in old and RunRecord.from_json(old, "old.json").version is None
    for bad in ("", "1.0 ; rm -rf", "\x1b[2J", "9" * 65):
        with pytest.raises(RecordError, match="clusterddp_version"):
            RunRecord.from_json({**data, "clusterddp_version": bad}, "run.json")
