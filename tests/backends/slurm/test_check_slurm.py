"""`clusterddp check` on a `slurm:` inventory, against the real Slurm test bed."""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from helpers import cddp

pytestmark = [pytest.mark.integration]


def inv(tmp_path, **extra):
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"slurm": {"partition": "main", "nodes": 2, "gpus_per_node": 2,
                                              "request_gpus": False, "shared_dir": str(tmp_path / "shared"),
                                              "python": sys.executable, **extra}}))
    return path


def test_check_passes_on_the_bed_and_names_what_is_missing(slurm, tmp_path):
    r = cddp("check", str(inv(tmp_path)), "--json", env=slurm.env(), check_rc=0)
    rep = json.loads(r.stdout)
    login, node = rep["hosts"]
    assert {c["check"]: c["status"] for c in login["checks"]} == {
        "slurm": "ok", "partition": "ok", "nodes": "ok", "gpus": "ok"}
    # the probe job ran on a compute node: it read a token written here, and found python and torch
    assert node["host"] in ("node-1", "node-2")
    found = {c["check"]: c for c in node["checks"]}
    assert found["shared_dir"]["value"] == "shared" and found["torch"]["status"] == "ok"
    assert found["python"]["value"] == ".".join(map(str, sys.version_info[:3]))
    # too many nodes, GPUs that the CPU nodes do not have, and a partition that is not there: each named
    r = cddp("check", str(inv(tmp_path, nodes=3, request_gpus=True)), env=slurm.env(), check_rc=1)
    assert "FAIL slurm nodes: the job needs 3 node(s); main has 2 up" in r.stdout
    assert "FAIL slurm gpus: gpus_per_node is 2; nodes of main offer 0" in r.stdout
    r = cddp("check", str(inv(tmp_path, partition="nope")), env=slurm.env(), check_rc=1)
    assert "FAIL slurm partition: no partition nope" in r.stdout


def test_check_fails_on_a_partition_that_is_down(slurm, tmp_path):
    slurm.drain()
    try:
        r = cddp("check", str(inv(tmp_path)), env=slurm.env(), check_rc=1)
    finally:
        slurm.undrain()
    assert "FAIL slurm partition: partition main is not up" in r.stdout


def test_check_through_a_remote_login_passes_and_a_login_host_it_cannot_reach_is_named(slurm, tmp_path):
    from test_up_slurm_login import login_entry, no_local_slurm
    env, tried = no_local_slurm(tmp_path)
    r = cddp("check", str(inv(tmp_path, login=login_entry(slurm))), "--json", env=env, check_rc=0)
    login, node = json.loads(r.stdout)["hosts"]
    assert login["host"] == "login1" and {c["check"]: c["status"] for c in login["checks"]} == {
        "slurm": "ok", "partition": "ok", "nodes": "ok", "gpus": "ok"}, login
    found = {c["check"]: c for c in node["checks"]}
    assert node["host"] in ("node-1", "node-2") and found["shared_dir"]["value"] == "shared", node
    assert found["torch"]["status"] == "ok"
    assert not list((tmp_path / "shared" / ".clusterddp-check").iterdir()), "the probe folder was left behind"
    assert not tried.exists(), f"a local Slurm command was run: {tried.read_text()}"
    # nothing listens on port 2 of the login host: check names it and fails; up stops before recording a run
    bad = inv(tmp_path, login=login_entry(slurm, port=2))
    r = cddp("check", str(bad), env=env, check_rc=1, timeout=60)
    assert "login1" in r.stdout and "FAIL" in r.stdout and "cannot connect" in r.stdout, r.stdout
    (tmp_path / "t.py").write_text("")
    r = cddp("up", str(bad), str(tmp_path / "t.py"), "--runs-dir", str(tmp_path / "runs"), env=env, check_rc=1,
             timeout=60)
    assert r.stderr.startswith("error: login1: cannot connect to") and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").glob("2*"))
    # a login host whose key is not in known_hosts is refused (strict), named, never a traceback
    (tmp_path / "empty_known_hosts").write_text("")
    r = cddp("up", str(inv(tmp_path, login=login_entry(slurm, known_hosts=str(tmp_path / "empty_known_hosts")))),
             str(tmp_path / "t.py"), "--runs-dir", str(tmp_path / "runs"), env=env, check_rc=1, timeout=60)
    assert "login1: host key of" in r.stderr and "is unknown" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_check_probes_a_ready_environment_with_its_python_and_the_base_one_otherwise(monkeypatch):
    """`packages:`: the probe job looks at the environment's python once the environment is ready (what the
    job will run), at slurm.python before (the environment is built by the job)."""
    from clusterddp.backends.slurm import check as slurm_check
    from clusterddp.backends.slurm import envs as slurm_envs
    from clusterddp.backends.slurm.plan import EnvStep
    from helpers import parse_inventory
    s = slurm_check.settings_of(parse_inventory("slurm: {python: /base/python, shared_dir: /s}\n", "c.yaml"))

    class Login:
        name = "slurm"

        def shared_dir(self, s):
            return "/s"

    for ready in (True, False):
        plan = type("P", (), {"ready": ready, "to_send": 0 if ready else 2048})()
        env = slurm_envs.SlurmEnv(EnvStep("ab" * 12, "/s/envs", "/s/envs/abab/bin/python", "f" * 64, "{}"),
                                  plan, True)  # type: ignore[arg-type]
        monkeypatch.setattr(slurm_envs, "prepare", lambda *a, env=env, **k: env)
        finding, probed = slurm_check._environment(Login(), s, None)  # type: ignore[arg-type]
        assert finding.status == "ok" and finding.note == env.says()
        assert probed.python == ("/s/envs/abab/bin/python" if ready else "/base/python")
        assert finding.value == ("abababababab ready" if ready else "abababababab to build (2.0 KiB to send)")
