"""`clusterddp check` and `up`'s preflight for real, on sshd hosts in network namespaces."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from helpers import cddp, eventually, job_script

pytestmark = pytest.mark.integration

PY = ".".join(map(str, sys.version_info[:3]))


def check_json(inv: Path, *args: str, rc: int) -> dict:
    r = cddp("check", str(inv), "--json", *args, check_rc=rc, timeout=120)
    return json.loads(r.stdout)


def host(report: dict, name: str) -> dict:
    h = next(h for h in report["hosts"] if h["host"] == name)
    h["by"] = {c["check"]: c for c in h["checks"]}
    return h


def with_host_settings(path: Path, name: str, **settings) -> Path:
    doc = yaml.safe_load(path.read_text())
    next(h for h in doc["hosts"] if h["name"] == name).update(settings)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture
def script(tmp_path) -> Path:
    return job_script(tmp_path, "train.py",
                      "import torch.distributed as dist\ndist.init_process_group('gloo')\ndist.barrier()\n"
                      "dist.destroy_process_group()\n")  # gloo's threads end here, not at exit (test_ci_gloo_exit)


def test_healthy_cluster_passes_every_check(bed, tmp_path):
    inv = bed.write_inventory(tmp_path / "inv.yaml")
    r = cddp("check", str(inv), check_rc=0, timeout=120)
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if line.startswith("node")}
    assert set(rows) == {"node1", "node2"}
    assert all(row.rstrip().endswith("PASS") for row in rows.values()), r.stdout
    assert "29500 free" in rows["node1"] and "eth0" in rows["node2"]
    assert re.search(r"^PASS: all 2 host\(s\) ready", r.stdout, re.M), r.stdout

    rep = check_json(inv, rc=0)
    assert rep["ok"] is True
    from importlib.metadata import version
    for name in ("node1", "node2"):
        h = host(rep, name)
        assert h["status"] == "ok" and h["facts"]["hostname"] == name  # really answered from that node
        assert h["facts"]["python"] == PY and h["facts"]["torch"] == version("torch")
        assert h["by"]["iface"]["value"] == "eth0" and abs(h["facts"]["time"] - time.time()) < 60
    assert host(rep, "node1")["by"]["port"]["value"] == "29500 free" and "port" not in host(rep, "node2")["by"]


def test_cut_link_is_reported_within_the_timeout_and_hides_no_one(make_bed, tmp_path, script):
    b = make_bed(3)
    inv = b.write_inventory(tmp_path / "inv.yaml", defaults_extra={"connect_timeout": 3})
    subprocess.run(["ip", "link", "set", b.nodes[2].veth, "down"], check=True)

    t0 = time.monotonic()
    rep = check_json(inv, rc=1)
    took = time.monotonic() - t0
    dead = host(rep, "node3")
    assert dead["status"] == "fail" and dead["by"]["ssh"]["status"] == "fail"
    assert dead["by"]["ssh"]["value"] in ("timeout", "unreachable")
    assert b.nodes[2].address in dead["by"]["ssh"]["problem"]
    assert host(rep, "node1")["status"] == host(rep, "node2")["status"] == "ok"  # the others still answer
    assert took < 3 + 20, f"check took {took:.0f}s with a 3s connect timeout"

    r = cddp("exec", str(inv), "--", "echo", "alive", "$(hostname)", check_rc=1, timeout=60)
    assert "[node1] alive node1" in r.stdout and "[node2] alive node2" in r.stdout
    assert "exec: 1 of 3 host(s) failed:" in r.stderr and "node3: " in r.stderr

    t0 = time.monotonic()
    r = cddp("up", str(inv), str(script), "--runs-dir", str(tmp_path / "runs"), check_rc=1, timeout=60)
    assert time.monotonic() - t0 < 3 + 15
    assert "preflight check failed on node3; the job was not started" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "runs").exists()  # nothing started, nothing recorded


def test_changed_host_key_is_refused_and_named(make_bed, tmp_path):
    b = make_bed(2)
    inv = b.write_inventory(tmp_path / "inv.yaml")
    known = b.known_hosts.read_text()
    b.regenerate_host_key(b.nodes[1])
    r = cddp("check", str(inv), check_rc=1, timeout=120)
    addr = b.nodes[1].address
    assert f"FAIL node2 ssh: host key for {addr} has CHANGED (refused)" in r.stdout, r.stdout
    assert f"ssh-keygen -R {addr}" in r.stdout
    assert "FAIL: 1 of 2 host(s) not ready: node2" in r.stdout and "FAIL node1" not in r.stdout
    assert b.known_hosts.read_text() == known  # strict never rewrites known_hosts


@pytest.fixture
def other_python(tmp_path) -> tuple[str, str]:
    """A "second Python": this interpreter behind a wrapper whose sitecustomize reports another micro version.

    Nodes share this filesystem, so the wrapper works as a node's `python`; everything but the
    reported version (torch included) is this interpreter's, so a job started anyway still runs.
    The check's probe sees the fake only while it runs `python -c` without -I or -S.
    """
    version = ".".join(map(str, (*sys.version_info[:2], sys.version_info.micro + 50)))
    site = tmp_path / "fake-version"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import collections, sys\n"
        "sys.version_info = collections.namedtuple('version_info', 'major minor micro releaselevel serial')(\n"
        f"    *sys.version_info[:2], {sys.version_info.micro + 50}, *sys.version_info[3:])\n"
        f"sys.version = {version!r} + sys.version[len({PY!r}):]  # platform.python_version() reads this\n")
    wrapper = tmp_path / "python-other"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={site}${{PYTHONPATH:+:$PYTHONPATH}} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    # what the check's probe will see (it runs the interpreter with -c, like this)
    seen = subprocess.run([str(wrapper), "-c", "import platform, sys\n"
                           "print('%d.%d.%d' % sys.version_info[:3], platform.python_version())"],
                          capture_output=True, text=True, check=True).stdout.split()
    assert seen == [version, version] and version != PY
    return str(wrapper), version


def test_version_mismatch_fails_check_and_up_refuses(bed, tmp_path, script, other_python):
    python, version = other_python
    inv = with_host_settings(bed.write_inventory(tmp_path / "inv.yaml"), "node2", python=python)
    r = cddp("check", str(inv), check_rc=1, timeout=120)
    assert f"FAIL node2 python: python {version} differs from {PY} on node1" in r.stdout, r.stdout
    assert f"point `python` for node2 at a Python {PY} interpreter (now {python})" in r.stdout
    assert "FAIL node1" not in r.stdout

    runs = tmp_path / "runs"
    r = cddp("up", str(inv), str(script), "--runs-dir", str(runs), check_rc=1, timeout=60)
    assert "preflight check failed on node2" in r.stderr and f"python {version} differs" in r.stderr
    assert "--skip-check" in r.stderr and not runs.exists()
    # --skip-check starts it anyway; this "other" Python only reports another version, so the job runs
    r = cddp("up", str(inv), str(script), "--runs-dir", str(runs), "--skip-check", "--gpus", "1", check_rc=0,
             timeout=120)
    assert "preflight" not in r.stderr and runs.exists()


def test_busy_master_port_fails_check_and_up_refuses(bed, tmp_path, script):
    inv = bed.write_inventory(tmp_path / "inv.yaml")
    node = bed.nodes[0]
    listener = subprocess.Popen(
        ["ip", "netns", "exec", node.ns, sys.executable, "-c",
         # SO_REUSEADDR: an earlier test's TIME_WAIT connection to 29500 must not stop this bind
         "import socket, sys, time\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
         "s.bind(('0.0.0.0', 29500)); s.listen()\n"
         "print('listening', flush=True); time.sleep(300)"], stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout.readline().strip() == "listening"
        # the port pinned: check fails on the master, as up would
        rep = check_json(inv, "--master-port", "29500", rc=1)
        port = host(rep, "node1")["by"]["port"]
        assert port["status"] == "fail" and port["value"] == "29500 busy" and "in use" in port["problem"]
        assert host(rep, "node2")["status"] == "ok"
        # not pinned: up leases the next free port, so check only warns
        port = host(check_json(inv, rc=0), "node1")["by"]["port"]
        assert port["status"] == "warn" and port["value"] == "29500 busy" and "next free one" in port["problem"]
        r = cddp("up", str(inv), str(script), "--runs-dir", str(tmp_path / "runs"), "--master-port", "29500",
                 check_rc=1, timeout=60)
        assert "node1: the master port 29500 cannot be bound" in r.stderr and "--master-port" in r.stderr
        # another port is free: check agrees (and up would start)
        assert host(check_json(inv, "--master-port", "29511", rc=0), "node1")["by"]["port"]["value"] == "29511 free"
        # with no port given, up chooses a free one on the master (its lease): the busy one is skipped
        r = cddp("up", str(inv), str(script), "--runs-dir", str(tmp_path / "runs"), "--gpus", "1", check_rc=0,
                 timeout=120)
        assert "leased: " in r.stdout and "; master port 29500" not in r.stdout, r.stdout
    finally:
        listener.kill()
        listener.wait()
    assert eventually(lambda: not bed.ns_pids(node), 10)
