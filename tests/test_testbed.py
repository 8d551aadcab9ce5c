"""Integration tests of the SSH test bed itself (tests/testbed.py)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import paramiko
import pytest
import yaml

from testbed import LOGIN_RC, Node, TestBed

pytestmark = pytest.mark.integration


def connect(bed: TestBed, node: Node, timeout: float = 10.0) -> paramiko.SSHClient:
    """SSH to `node` trusting only the bed's known_hosts and key (strict checking)."""
    client = paramiko.SSHClient()
    client.load_host_keys(str(bed.known_hosts))  # and no ~/.ssh/known_hosts
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(
            node.address,
            port=22,
            username="root",
            key_filename=str(bed.identity_file),
            look_for_keys=False,
            allow_agent=False,
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
        )
    except BaseException:
        client.close()
        raise
    return client


def run(client: paramiko.SSHClient, command: str) -> tuple[int, str]:
    """Run `command`; return (exit status, stdout + stderr)."""
    _, stdout, stderr = client.exec_command(command, timeout=30)
    out = stdout.read().decode() + stderr.read().decode()
    return stdout.channel.recv_exit_status(), out


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll `predicate` until it is true; False if `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_each_node_reachable_with_strict_host_keys(bed: TestBed) -> None:
    assert [n.name for n in bed.nodes] == ["node1", "node2"]
    for node in bed.nodes:
        with connect(bed, node) as c:
            assert run(c, "hostname") == (0, f"{node.name}\n")


def test_nodes_reach_each_other_over_eth0(bed: TestBed) -> None:
    node1, node2 = bed.nodes
    with connect(bed, node1) as c:
        status, out = run(c, f"ip route get {node2.address}")
    assert status == 0 and "dev eth0" in out, out


def test_node_hostnames_do_not_resolve(bed: TestBed) -> None:
    with connect(bed, bed.nodes[1]) as c:
        start = time.monotonic()
        status, out = run(c, "getent hosts node1")
    assert status != 0, out
    assert time.monotonic() - start < 5, "lookup should fail at once, not time out"


def test_node_shells_read_the_beds_login_rc_not_this_machines_bashrc(bed: TestBed) -> None:
    # The bed's LOGIN_RC (empty) is the ~/.bashrc every SSH command's shell reads, whatever this
    # machine's user keeps in theirs (pyenv init: a dozen forks per command); this machine's file is untouched.
    mine = Path.home() / ".bashrc"
    before = mine.read_bytes() if mine.exists() else None
    for node in bed.nodes:
        with connect(bed, node) as c:
            assert run(c, "cat ~/.bashrc; echo \"[$PYENV_SHELL]\"") == (0, f"{LOGIN_RC}[]\n")
    assert (mine.read_bytes() if mine.exists() else None) == before


def test_ns_pids_sees_processes_started_over_ssh(bed: TestBed) -> None:
    node, other = bed.nodes
    with connect(bed, node) as c:
        status, out = run(c, "nohup sleep 300 >/dev/null 2>&1 </dev/null & echo $!")
        assert status == 0, out
        pid = int(out)
        assert pid in bed.ns_pids(node)
        assert pid not in bed.ns_pids(other)
        assert run(c, f"kill {pid}")[0] == 0
        assert wait_until(lambda: pid not in bed.ns_pids(node))
    # Once the session is closed, only the (excluded) sshd listener is left.
    assert wait_until(lambda: bed.ns_pids(node) == []), bed.ns_pids(node)


def test_write_inventory(bed: TestBed, tmp_path) -> None:
    path = bed.write_inventory(
        tmp_path / "inv.yaml",
        bed.nodes[:1],
        defaults_extra={"gpus": 1},
        extra={"collect": ["*.log"]},
    )
    doc = yaml.safe_load(path.read_text())
    assert doc["defaults"]["known_hosts"] == str(bed.known_hosts)
    assert doc["defaults"]["host_key_policy"] == "strict"
    assert doc["defaults"]["gpus"] == 1
    assert doc["collect"] == ["*.log"]
    node = bed.nodes[0]
    assert doc["hosts"] == [{"name": node.name, "address": node.address, "workdir": node.workdir}]


def test_regenerated_host_key_is_rejected(make_bed) -> None:
    b = make_bed(1)
    node = b.nodes[0]
    connect(b, node).close()
    b.regenerate_host_key(node)
    with pytest.raises(paramiko.BadHostKeyException):
        connect(b, node).close()


def test_cut_link_makes_connect_fail(make_bed) -> None:
    b = make_bed(2)
    node = b.nodes[0]
    subprocess.run(["ip", "link", "set", node.veth, "down"], check=True)
    start = time.monotonic()
    with pytest.raises((OSError, paramiko.SSHException)):
        connect(b, node, timeout=3).close()
    assert time.monotonic() - start < 10
    # The other node is unaffected, and restoring the link restores the node.
    connect(b, b.nodes[1]).close()
    subprocess.run(["ip", "link", "set", node.veth, "up"], check=True)
    connect(b, node).close()
