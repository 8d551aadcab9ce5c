"""A backend's own part of run.json (record.BackendPart): the record keeps it opaque, frames it
(name, version, sane values), and reads records written before the backend owned its part (a Slurm
run's `slurm` object alone, tests/fixtures/run-v1-slurm-*.json, written by that code) as version 1."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterddp import backends
from clusterddp.backends.slurm.jobpart import VERSION, SlurmJob, job_of, with_job
from clusterddp.errors import UsageError
from clusterddp.record import BackendPart, RecordError, RunRecord
from clusterddp.store import RunStore
from helpers import make_record

FIXTURES = Path(__file__).parent.parent / "fixtures"
V1_SUCCEEDED = FIXTURES / "run-v1-slurm-succeeded.json"
V1_PENDING = FIXTURES / "run-v1-slurm-pending.json"


def _stored(tmp_path: Path, fixture: Path) -> tuple[RunStore, str]:
    run_id = json.loads(fixture.read_text())["run_id"]
    (tmp_path / "runs" / run_id).mkdir(parents=True)
    shutil.copy(fixture, tmp_path / "runs" / run_id / "run.json")
    return RunStore(str(tmp_path / "runs")), run_id


def test_a_slurm_record_written_before_the_backend_owned_its_part_still_reads(tmp_path):
    store, run_id = _stored(tmp_path, V1_SUCCEEDED)
    rec = store.load(run_id)
    assert rec.backend is not None and (rec.backend.name, rec.backend.version) == ("slurm", 1)
    assert rec.backend_name == "slurm" and backends.for_record(rec).name == "slurm"
    job = job_of(rec)
    assert (job.job_id, job.partition, job.hosts, job.nproc) == ("4242", "gpu", ("node07", "node08"), 4)
    assert job.run_dir == "/shared/me/clusterddp/runs/20261206-071500-abcd"
    assert job.login is not None and (job.login.name, job.login.address, job.login.user) == (
        "login1", "login1.example.org", "me")
    assert job.node is not None and (job.node.python, job.node.setup, job.node.shared_dir, job.node.gpus) == (
        "/shared/me/venv/bin/python", ("module load cuda",), "/shared/me/clusterddp", 4)
    assert [n.host for n in rec.nodes] == ["node07", "node08"] and rec.status.value == "succeeded"
    # written again untouched (a `status` that changed nothing of the job), the part is kept as read: its
    # version says its shape; once the backend writes its job (with_job), it is version 2, same `slurm` key
    old = json.loads(V1_SUCCEEDED.read_text())["slurm"]
    data = rec.to_json()
    assert data["backend"] == {"name": "slurm", "version": 1} and data["slurm"] == old
    assert job_of(RunRecord.from_json(json.loads(json.dumps(data)), "run.json")) == job
    data = with_job(rec, job).to_json()
    assert data["backend"] == {"name": "slurm", "version": VERSION} and data["slurm"]["job_id"] == "4242"
    assert data["slurm"]["node"] == {"python": "/shared/me/venv/bin/python", "setup": ["module load cuda"],
                                     "env": {"WANDB_API_KEY": "not-a-real-key", "NCCL_DEBUG": "WARN"},
                                     "shared_dir": "/shared/me/clusterddp", "gpus": 4}
    assert job_of(RunRecord.from_json(json.loads(json.dumps(data)), "run.json")) == job


def test_a_pending_slurm_record_of_before_reads_with_a_local_login_and_no_nodes(tmp_path):
    store, run_id = _stored(tmp_path, V1_PENDING)
    rec = store.load(run_id)
    job = job_of(rec)
    assert rec.nodes == () and job.job_id == "4243" and job.login is None and job.hosts == ()
    assert backends.for_record(rec).name == "slurm"


def test_an_ssh_record_has_no_part_and_run_json_keeps_its_keys():
    rec = make_record("r1")
    assert rec.backend is None and rec.backend_name == "ssh" and backends.for_record(rec).name == "ssh"
    assert "backend" not in rec.to_json() and "slurm" not in rec.to_json()


def test_the_record_refuses_a_part_named_as_one_of_its_own_keys_and_every_own_key_is_known():
    from clusterddp.record import _RECORD_KEYS
    from test_record import full_record
    own = set(full_record().to_json())
    assert own <= _RECORD_KEYS, own - _RECORD_KEYS  # a new key of the record is added there too
    data = {**make_record("r1").to_json(), "backend": {"name": "nodes", "version": 1}}
    with pytest.raises(RecordError, match="backend.name: 'nodes' is one of the record's own keys"):
        RunRecord.from_json(data, "run.json")


@pytest.mark.parametrize(("frame", "part", "field"), [
    ({"name": "Slurm!", "version": 1}, {}, "backend.name"),
    ({"name": "slurm", "version": 0}, {}, "backend.version"),
    ({"name": "slurm", "version": "2"}, {}, "backend.version"),
    ({"name": "slurm", "version": 2}, None, "slurm"),          # the part itself is missing
    ({"name": "slurm", "version": 2}, [1], "slurm"),           # not an object
    ({"name": "slurm", "version": 2}, {"run_dir": "a\x00b"}, "slurm.run_dir"),  # NUL in a value
])
def test_a_bad_frame_or_part_is_a_located_record_error(frame, part, field):
    data = {**make_record("r1").to_json(), "backend": frame}
    if part is not None:
        data["slurm"] = part
    with pytest.raises(RecordError) as e:
        RunRecord.from_json(data, "/runs/r1/run.json")
    assert e.value.field == field, e.value


def test_the_slurm_part_is_read_back_as_untrusted_and_a_newer_version_says_to_upgrade():
    good = SlurmJob(run_dir="/s/runs/r", job_id="7").part()
    with pytest.raises(RecordError) as e:
        SlurmJob.from_part(replace(good, data={**good.data, "nproc": 0}))
    assert e.value.field == "slurm.nproc"
    with pytest.raises(RecordError) as e:
        SlurmJob.from_part(replace(good, data={**good.data, "node": {"python": "p", "shared_dir": "/s", "gpus": 0}}))
    assert e.value.field == "slurm.node.gpus"
    with pytest.raises(RecordError) as e:
        SlurmJob.from_part(replace(good, data={**good.data, "node": {"python": "p", "shared_dir": "/s",
                                                                     "env": {"1X": "v"}}}))
    assert e.value.field == "slurm.node.env"
    with pytest.raises(RecordError, match="newer than this clusterddp reads") as e:
        SlurmJob.from_part(replace(good, version=VERSION + 1))
    assert "upgrade clusterddp" in (e.value.hint or "")


def test_a_run_of_a_backend_this_clusterddp_lacks_is_refused_with_what_to_do():
    rec = make_record("r1", backend=BackendPart("pbs", 1, {"job": "1.server"}))
    data = RunRecord.from_json(rec.to_json(), "run.json")
    assert data.backend == rec.backend  # read and kept, opaque
    with pytest.raises(UsageError, match="run r1 was run by the backend 'pbs', which this clusterddp does not have"):
        backends.for_record(data)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(version=st.sampled_from([1, 2]), key=st.sampled_from(["run_dir", "job_id", "partition", "hosts", "nproc",
                                                             "login", "node", "extra"]),
       value=JSON, inner=st.sampled_from([None, "python", "setup", "env", "gpus", "port", "transport"]))
def test_any_value_in_the_slurm_part_is_read_or_refused_at_its_field(version, key, value, inner):
    """The part read back as untrusted (a parser of bytes from outside): a SlurmJob, or a RecordError
    located in the `slurm` object, whatever a field holds; never another exception."""
    data = json.loads(V1_SUCCEEDED.read_text())
    if version == 2:
        data = with_job(RunRecord.from_json(data, "run.json"), job_of(RunRecord.from_json(data, "run.json"))).to_json()
    part = data["slurm"]
    if inner is not None and isinstance(part.get(key), dict):
        part[key][inner] = value
    else:
        part[key] = value
    try:
        job_of(RunRecord.from_json(data, "/r/run.json"))
    except RecordError as e:
        assert e.path == "/r/run.json" and (e.field or "").startswith("slurm"), e


# ---- a Slurm run's nodes: Nodes, not SSH host entries (issue 41: no fake Host(transport="slurm")) ----

def test_a_slurm_nodes_record_reads_back_as_a_node_and_an_older_host_entry_migrates(tmp_path):
    from clusterddp.backends.slurm.jobpart import NodeSettings
    from clusterddp.inventory import Host, Node
    store, run_id = _stored(tmp_path, V1_SUCCEEDED)
    old = store.load(run_id).nodes[0].settings  # written as a host entry of transport "slurm"
    assert isinstance(old, Node) and not isinstance(old, Host)
    assert (old.name, old.address, old.python, old.workdir, old.setup, old.gpus) == (
        "node07", "node07", "/shared/me/venv/bin/python", "/shared/me/clusterddp", ("module load cuda",), 4)
    assert dict(old.env) == {"WANDB_API_KEY": "not-a-real-key", "NCCL_DEBUG": "WARN"}
    node = NodeSettings("/opt/py", ("module load x",), (("A", "1"),), "/shared", 2).node("n1")
    rec = make_record("r1")
    rec = replace(rec, nodes=(replace(rec.nodes[0], host="n1", settings=node),))
    data = json.loads(json.dumps(rec.to_json()))
    assert data["nodes"][0]["settings"] == {"kind": "node", "name": "n1", "address": "n1", "python": "/opt/py",
                                            "workdir": "/shared", "env": {"A": "1"}, "setup": ["module load x"],
                                            "gpus": 2, "connect_timeout": node.connect_timeout, "env_id": None,
                                            "lock_sha256": None}
    assert "transport" not in data["nodes"][0]["settings"] and "known_hosts" not in data["nodes"][0]["settings"]
    assert RunRecord.from_json(data, "run.json").nodes[0].settings == node


@pytest.mark.parametrize("change,field", [
    ({"kind": "pod"}, "nodes[0].settings.kind"),
    ({"port": 22}, "nodes[0].settings.port"),              # an SSH setting is none of a node's
    ({"gpus": 0}, "nodes[0].settings.gpus"),
    ({"connect_timeout": 0}, "nodes[0].settings.connect_timeout"),
    ({"env": {"1X": "a"}}, "nodes[0].settings.env"),
    ({"name": "n 1"}, "nodes[0].settings.name"),
])
def test_a_bad_node_setting_is_a_record_error_naming_it(change, field):
    from clusterddp.backends.slurm.jobpart import NodeSettings
    rec = make_record("r1")
    rec = replace(rec, nodes=(replace(rec.nodes[0], host="n1", settings=NodeSettings("py").node("n1")),))
    data = json.loads(json.dumps(rec.to_json()))
    data["nodes"][0]["settings"].update(change)
    with pytest.raises(RecordError) as e:
        RunRecord.from_json(data, "run.json")
    assert e.value.field == field, e.value
