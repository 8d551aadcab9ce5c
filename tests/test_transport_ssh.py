"""The SSH transport on real sshd hosts."""

from __future__ import annotations

import hashlib
import re
import subprocess
from dataclasses import replace

import pytest

from clusterddp import inventory
from clusterddp.errors import HostError
from clusterddp.transport import connect
from helpers import cddp

pytestmark = pytest.mark.integration


def test_a_stream_past_paramikos_rekey_point_completes(bed, tmp_path):
    """Regression: paramiko's own re-key at 512 MiB deadlocked when the channel closed (issue #822)."""
    host = inventory.load(bed.write_inventory(tmp_path / "inv.yaml")).hosts[0]
    t = connect(host)
    try:
        total = 0

        def count(b: bytes) -> None:
            nonlocal total
            total += len(b)
        for _ in range(2):  # 2 x 320 MiB on one connection: past 512 MiB, then a channel close
            assert t.stream("head -c 335544320 /dev/zero", count, stderr_to=bytearray()) == 0
        assert total == 2 * 335544320
        assert t.run("echo still usable").text == "still usable\n"
    finally:
        t.close()


def test_aes_gcm_is_preferred_and_a_server_without_it_still_connects(make_bed, tmp_path):
    """GCM moves bulk data far cheaper through paramiko than its default aes128-ctr + HMAC."""
    bed = make_bed(1)
    host = inventory.load(bed.write_inventory(tmp_path / "inv.yaml")).hosts[0]
    t = connect(host)
    try:
        assert t._transport.remote_cipher == "aes128-gcm@openssh.com"
    finally:
        t.close()
    bed.restart_sshd(bed.nodes[0], "Ciphers aes256-ctr\n")
    t = connect(host)
    try:
        assert t._transport.remote_cipher == "aes256-ctr"
        assert t.run("echo ok").text == "ok\n"
    finally:
        t.close()


def test_stdin_reaches_a_streamed_command(bed, tmp_path):
    host = inventory.load(bed.write_inventory(tmp_path / "inv.yaml")).hosts[0]
    t = connect(host)
    try:
        data = bytes(range(256)) * 4096  # 1 MiB, more than one SSH window adjust
        out = bytearray()
        assert t.stream("sha256sum", out.extend, stderr_to=bytearray(), stdin=data) == 0
        assert out.decode().split()[0] == hashlib.sha256(data).hexdigest()
    finally:
        t.close()


def bare_host(bed, tmp_path, address: str) -> inventory.Host:
    """A host entry that names only an ssh_config alias: user, port and key must come from ssh_config."""
    h = inventory.load(bed.write_inventory(tmp_path / "inv.yaml")).hosts[0]
    return replace(h, address=address, user=None, port=None, identity_file=None)


def test_ssh_config_supplies_hostname_user_port_and_key(bed, tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        f"Host gpu-a\n  HostName {bed.nodes[0].address}\n  User root\n  Port 22\n"
        f"  IdentityFile {bed.identity_file}\n")
    monkeypatch.setenv("HOME", str(home))  # no default keys there: only the config's IdentityFile can log in
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    t = connect(bare_host(bed, tmp_path, "gpu-a"))
    try:
        assert t.run("hostname").text == "node1\n"
    finally:
        t.close()
    (home / ".ssh" / "config").write_text(f"Host gpu-a\n  HostName {bed.nodes[0].address}\n")
    with pytest.raises(HostError, match=re.escape(f"no SSH key to log in to root@{bed.nodes[0].address}:22")):
        connect(bare_host(bed, tmp_path, "gpu-a"))


def test_proxyjump_reaches_a_node_this_machine_cannot(make_bed, tmp_path, monkeypatch):
    bed = make_bed(2)
    jump, target = bed.nodes
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        f"Host inner\n  HostName {target.address}\n  ProxyJump root@{jump.address}\n"
        f"Host *\n  User root\n  IdentityFile {bed.identity_file}\n")
    monkeypatch.setenv("HOME", str(home))
    subprocess.run(["ip", "route", "add", "blackhole", f"{target.address}/32"], check=True)
    try:
        with pytest.raises(HostError, match="cannot connect to"):  # no direct way from here
            connect(replace(bare_host(bed, tmp_path, target.address), connect_timeout=2))
        t = connect(bare_host(bed, tmp_path, "inner"))
        try:
            assert t.run("hostname").text == "node2\n"
        finally:
            t.close()
    finally:
        subprocess.run(["ip", "route", "del", "blackhole", f"{target.address}/32"], check=True)


def test_an_ssh_config_it_cannot_evaluate_is_a_host_error_with_the_fix(bed, tmp_path):
    """The CLI keeps invoke (paramiko's only use: Match exec) unloaded; such a block is reported, not run."""
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text(f'Match exec "touch {tmp_path}/ran"\n  User bob\n')
    inv = bed.write_inventory(tmp_path / "inv.yaml", hosts=bed.nodes[:1])
    r = cddp("exec", str(inv), "--", "true", env={"HOME": str(tmp_path)})
    assert r.returncode == 1 and "node1: clusterddp does not run ssh_config `Match exec` blocks" in r.stderr, r
    assert "move that block out of ~/.ssh/config" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "ran").exists()
