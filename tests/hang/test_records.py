"""A failed run's diagnosis reads each node's hang record and idle record in ONE command a node
(clusterddp.hang.records_command), on SSH (hang.explain) and on Slurm (diagnose): the commands are
counted, with each record present and with neither; and the combined answer's reader never raises."""

from __future__ import annotations

import json
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from clusterddp import hang as hang_module
from clusterddp import postmortem
from clusterddp.backends.slurm import job as slurm
from clusterddp.backends.slurm.login import LocalLogin
from clusterddp.fleet import Fleet
from clusterddp.inventory import local
from clusterddp.plan import NodeLaunch
from clusterddp.record import RunStatus
from clusterddp.runspec import RunSpec
from clusterddp.store import RunStore
from clusterddp.transport.local import LocalTransport
from helpers import make_record, resolved
from test_slurm_watch import inv

IDLE = {"schema": 1, "host": "a", "time": 1.0, "below": 5, "seconds": 1800.0, "stop": True, "nnodes": 2,
        "decided_by": "a"}
HANG = {"schema": 1, "time": 1.7e9, "timeout": 20.0, "silent_s": 20.4, "decided_by": "a", "stacks": "no stacks"}


def _counting(monkeypatch) -> list[str]:
    """Every command a LocalTransport runs, kept in order."""
    seen: list[str] = []
    real = LocalTransport.run

    def run(self, command, **kw):
        seen.append(command)
        return real(self, command, **kw)
    monkeypatch.setattr(LocalTransport, "run", run)
    return seen


def _nodes(tmp_path) -> list[NodeLaunch]:
    here = local().hosts[0]
    out = []
    for i, h in enumerate(("a", "b")):
        ctl = tmp_path / "w" / h / ".clusterddp"
        ctl.mkdir(parents=True)
        out.append(NodeLaunch(replace(here, name=h), i, 1, str(tmp_path / "w" / h), str(ctl), "", (), (), ""))
    return out


def test_the_ssh_diagnosis_reads_hang_and_idle_records_in_one_command_a_node(tmp_path, monkeypatch):
    nodes = _nodes(tmp_path)
    rec = make_record("r", hosts=("a", "b"))
    store = RunStore(tmp_path / "runs")
    store.create(rec)
    for n in nodes:
        (tmp_path / n.control_dir / "idle.json").write_text(json.dumps({**IDLE, "host": n.host.name}))
    seen = _counting(monkeypatch)
    with Fleet([n.host for n in nodes]) as fleet:
        f = hang_module.explain(fleet, nodes, rec, store)
    assert (f.kind, f.host) == ("idle", "a")
    assert len(seen) == 2 and all("idle.json" in c and "hang.json" in c for c in seen)
    # a hang, with an idle record beside it: the hang is the failure, still one command a node
    (tmp_path / nodes[1].control_dir / "hang.json").write_text(json.dumps(HANG))
    seen.clear()
    with Fleet([n.host for n in nodes]) as fleet:
        f = hang_module.explain(fleet, nodes, rec, store)
    assert f.kind == "hang" and len(seen) == 2


def test_without_either_record_the_ordinary_diagnosis_follows_one_records_command_a_node(tmp_path, monkeypatch):
    nodes = _nodes(tmp_path)
    rec = make_record("r", hosts=("a", "b"))
    store = RunStore(tmp_path / "runs")
    store.create(rec)
    seen = _counting(monkeypatch)
    called = []
    monkeypatch.setattr(postmortem, "explain", lambda *a: called.append(a) or "ordinary")
    with Fleet([n.host for n in nodes]) as fleet:
        assert hang_module.explain(fleet, nodes, rec, store) == "ordinary"
    assert len(called) == 1 and len(seen) == 2 and len([c for c in seen if "idle.json" in c]) == 2


def test_the_slurm_diagnosis_reads_both_records_in_one_command_a_node(tmp_path, monkeypatch):
    (tmp_path / "t.py").write_text("pass\n")
    i = inv(tmp_path)
    prep = slurm.prepare(i, resolved(RunSpec("t.py", ()), i), str(tmp_path / "runs"), tmp_path / "t.py")
    store = RunStore(str(tmp_path / "runs"))
    rec = slurm.new_record(prep, "c.yaml")
    rec = replace(slurm.allocated(rec, slurm.JobInfo("7", "FAILED", "None", "main", ("n1", "n2"))),
                  status=RunStatus.FAILED)
    store.create(rec)
    for host in ("n1", "n2"):
        ctl = tmp_path / "shared" / "runs" / rec.run_id / ".clusterddp" / "nodes" / host
        ctl.mkdir(parents=True)
        (ctl / "idle.json").write_text(json.dumps({**IDLE, "host": host, "decided_by": "n2"}))
    seen = _counting(monkeypatch)
    f = slurm.diagnose(LocalLogin(), store, rec)
    assert (f.kind, f.host) == ("idle", "n2")
    records = [c for c in seen if "idle.json" in c or "hang.json" in c]
    assert len(records) == 2 and all("idle.json" in c and "hang.json" in c for c in records)


def test_the_records_answer_splits_into_each_record():
    idle = json.dumps(IDLE).encode()
    hang = json.dumps(HANG).encode() + b"\n" + hang_module.SEPARATOR.encode() + b"\n"
    end = b"\n" + hang_module.IDLE_END.encode() + b"\n"
    both = hang_module.parse_records("a", idle + end + hang)
    assert both.idle is not None and both.idle.stop and both.hang is not None and both.hang.timeout == 20.0
    assert hang_module.parse_records("a", end) == hang_module.NodeRecords(None, None)
    only = hang_module.parse_records("a", end + hang)
    assert only.idle is None and only.hang is not None
    assert hang_module.parse_records("a", idle + end).hang is None


def test_the_records_command_answers_in_the_form_its_reader_reads(tmp_path):
    node = _nodes(tmp_path)[0]
    t = LocalTransport("a")
    assert hang_module.read_one(t, "a", node) == hang_module.NodeRecords(None, None)
    (tmp_path / node.control_dir / "idle.json").write_text(json.dumps(IDLE))
    got = hang_module.read_one(t, "a", node)
    assert got.hang is None and got.idle is not None and got.idle.below == 5
    (tmp_path / node.control_dir / "hang.json").write_text(json.dumps(HANG))
    got = hang_module.read_one(t, "a", node)
    assert got.idle is not None and got.hang is not None and got.hang.silent_s == 20.4
    missing = replace(node, control_dir=str(tmp_path / "nowhere"))
    assert hang_module.read_one(t, "a", missing) == hang_module.NodeRecords(None, None)


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=2000), st.binary(max_size=2000))
def test_any_records_answer_is_read_without_raising(head, rest):
    for data in (head + b"\n" + hang_module.IDLE_END.encode() + b"\n" + rest, head):
        got = hang_module.parse_records("a", data)
        assert got.hang is None or len(got.hang.stacks) <= hang_module.STACKS_MOST
