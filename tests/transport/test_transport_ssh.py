"""The SSH transport on real sshd hosts."""

from __future__ import annotations

import hashlib
import os
import re
import socket
import subprocess
import sys
from dataclasses import replace

import paramiko
import pytest
import yaml

from clusterddp import inventory
from clusterddp.errors import HostError, HostErrorKind
from clusterddp.transport import connect, ssh

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
        # set on this connection only: other paramiko users in the process keep paramiko's default
        assert t._transport.packetizer.REKEY_BYTES > 1 << 40
        assert paramiko.packet.Packetizer.REKEY_BYTES == 1 << 29
    finally:
        t.close()


def test_run_and_stream_read_stdout_and_stderr_together(bed, tmp_path):
    """Over 4 MiB (the channel's window) of stderr while stdout is still open must not stall either."""
    host = inventory.load(bed.write_inventory(tmp_path / "inv.yaml")).hosts[0]
    t = connect(host)
    try:
        r = t.run("head -c 8M /dev/zero >&2; echo done", timeout=20)
        assert (r.exit_code, r.text, len(r.stderr)) == (0, "done\n", 8 << 20)
        r = t.run("head -c 8M /dev/zero; echo done >&2", timeout=20)
        assert (r.exit_code, len(r.stdout), r.stderr) == (0, 8 << 20, b"done\n")
        out, err = bytearray(), bytearray()
        assert t.stream("head -c 8M /dev/zero >&2; echo done; exit 3", out.extend, stderr_to=err, timeout=20) == 3
        assert (bytes(out), len(err)) == (b"done\n", 8 << 20)
    finally:
        t.close()
    with pytest.raises(HostError, match="connection lost") as e:
        t.run("true")
    assert e.value.kind is HostErrorKind.CONNECTION_LOST


def nodelay(sock) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_what_the_node_sends_is_acknowledged_at_once_not_after_the_delayed_ack(bed, tmp_path):
    """TCP_QUICKACK after every read. sshd leaves Nagle on for a session without a terminal and sends
    two packets in a row after authentication, so its answer to the first channel open waited for our
    delayed ACK (40 ms on Linux): 43 ms of every connection's first command. The kernel drops quick-ACK
    mode once a connection goes back and forth, as every SSH one does; the socket re-arms it."""
    host = inventory.load(bed.write_inventory(tmp_path / "inv.yaml")).hosts[0]
    t = connect(host)
    try:
        sock = t._transport.sock
        assert isinstance(sock, ssh._QuickAck) and nodelay(sock) != 0
        assert sock.gettimeout() == 0.1  # paramiko's own read timeout, kept across the change of socket
        assert t.run("cat", stdin=b"in").text == "in"
    finally:
        t.close()


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as ls:
        client = socket.create_connection(ls.getsockname())
        server, _ = ls.accept()
    return client, server


@pytest.mark.parametrize("tuned", [False, True])
def test_a_read_leaves_the_socket_acknowledging_at_once_after_a_back_and_forth(tuned):
    """The kernel's side of the test above: five exchanges put a plain socket in delayed-ACK
    (interactive) mode; a tuned socket's read puts it back in quick-ACK mode, its timeout unchanged."""
    client, server = _tcp_pair()
    client.settimeout(5.0)
    sock = ssh._tcp_tuned(client) if tuned else client
    try:
        for _ in range(5):
            sock.sendall(b"x")
            server.recv(1)
            server.sendall(b"y")
            assert sock.recv(1) == b"y"
        quick = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK)
        assert (quick, sock.gettimeout()) == ((1, 5.0) if tuned else (0, 5.0))
    finally:
        sock.close()
        server.close()


def test_a_socket_that_is_no_tcp_connection_is_left_as_it_is():
    """A ProxyCommand's pipe or a jump host's channel reaches the factory too: nothing to tune."""
    a, b = socket.socketpair()
    try:
        assert ssh._tcp_tuned(a) is a and type(a) is socket.socket
    finally:
        a.close()
        b.close()


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
    with pytest.raises(HostError, match=re.escape(f"no SSH key to log in to root@{bed.nodes[0].address}:22")) as e:
        connect(bare_host(bed, tmp_path, "gpu-a"))
    assert e.value.kind is HostErrorKind.AUTH_REFUSED


def accepted_from(bed, node) -> set[str]:
    """The client addresses node's sshd has accepted a login from."""
    log = (bed.root / node.name / "sshd.log").read_text()
    return set(re.findall(r"Accepted publickey for \S+ from (\S+) port", log))


def test_proxyjump_chains_go_through_every_hop_with_host_keys_checked_on_each(make_bed, tmp_path, monkeypatch):
    """node3 by way of node1 then node2, where only node1 is reachable from here.

    Two spellings of that route: node3's ProxyJump names node2, whose own ssh_config entry jumps
    through node1; and a ProxyJump list `node1,node2`, which OpenSSH walks in that order.
    """
    bed = make_bed(3)
    n1, n2, n3 = bed.nodes
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        f"Host via-n1\n  HostName {n2.address}\n  ProxyJump root@{n1.address}\n"
        f"Host nested\n  HostName {n3.address}\n  ProxyJump via-n1\n"
        f"Host listed\n  HostName {n3.address}\n  ProxyJump root@{n1.address},root@{n2.address}\n"
        f"Host only-n2\n  HostName {n3.address}\n  ProxyJump root@{n2.address}\n"
        f"Host *\n  User root\n  IdentityFile {bed.identity_file}\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    where = "echo $(hostname) ${SSH_CONNECTION%% *}"
    blackholed = [n2.address, n3.address]
    for addr in blackholed:
        subprocess.run(["ip", "route", "add", "blackhole", f"{addr}/32"], check=True)
    try:
        for addr, via in ((n2.address, "via n1"), (n3.address, "via n2, itself not reachable from here")):
            with pytest.raises(HostError, match="cannot connect to") as e:  # no direct way to node2 or node3
                connect(replace(bare_host(bed, tmp_path, addr if via == "via n1" else "only-n2"),
                                connect_timeout=2))
            assert e.value.kind is HostErrorKind.UNREACHABLE, via
        t = connect(bare_host(bed, tmp_path, "via-n1"))
        try:
            assert t.run(where).text == f"node2 {n1.address}\n"
            assert nodelay(t._conn.gateway.transport.sock) != 0  # the TCP connection, to the jump host
        finally:
            t.close()
        for alias in ("nested", "listed"):
            t = connect(bare_host(bed, tmp_path, alias))
            try:
                assert t.run(where).text == f"node3 {n2.address}\n", alias  # node3 was reached from node2
            finally:
                t.close()
        assert accepted_from(bed, n2) == {n1.address} and accepted_from(bed, n3) == {n2.address}

        # Host keys are the inventory's rules on the jump hosts too, not Fabric's accept-anything.
        lines = {n: host_key_line(bed, n) + "\n" for n in bed.nodes}
        known = tmp_path / "known_hosts"
        known.write_text(lines[n1] + lines[n3])
        strict = replace(bare_host(bed, tmp_path, "nested"), known_hosts=str(known))
        with pytest.raises(HostError, match=re.escape(f"host key of {n2.address} is unknown")) as e:
            connect(strict)
        assert e.value.kind is HostErrorKind.HOST_KEY_UNKNOWN
        known.write_text(lines[n1] + f"{n2.address} {lines[n3].split(' ', 1)[1]}" + lines[n3])
        with pytest.raises(HostError, match=re.escape(f"host key for {n2.address} has CHANGED")) as e:
            connect(strict)
        assert e.value.kind is HostErrorKind.HOST_KEY_CHANGED
        known.write_text("")
        connect(replace(strict, host_key_policy="accept-new")).close()
        assert sorted(known.read_text().splitlines(True)) == sorted(lines.values())  # every hop recorded
    finally:
        for addr in blackholed:
            subprocess.run(["ip", "route", "del", "blackhole", f"{addr}/32"], check=True)


def host_key_line(bed, node) -> str:
    keytype, blob = (bed.root / node.name / "ssh_host_ed25519_key.pub").read_text().split()[:2]
    return f"{node.address} {keytype} {blob}"


def test_ssh_config_match_exec_runs_its_command_and_applies_the_block_on_exit_0(bed, tmp_path):
    """As OpenSSH: the command runs here with %h expanded; exit 0 applies the block, non-zero skips it."""
    n1, n2 = bed.nodes
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        f'Match exec "test %h = {n2.address}"\n  User no-such-user\n'
        f'Match exec "touch {tmp_path}/ran-for-%h"\n  User root\n  IdentityFile {bed.identity_file}\n')
    inv = tmp_path / "inv.yaml"
    doc = yaml.safe_load(bed.write_inventory(inv).read_text())
    del doc["defaults"]["user"], doc["defaults"]["identity_file"]  # left to ssh_config
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = {**{k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}, "HOME": str(home)}
    r = subprocess.run([sys.executable, "-m", "clusterddp", "exec", str(inv), "--", "id", "-un"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 1 and r.stdout == "[node1] root\n", r
    assert f"node2: authentication failed for no-such-user@{n2.address}:22" in r.stderr, r
    assert "Traceback" not in r.stderr
    assert (tmp_path / f"ran-for-{n1.address}").exists() and (tmp_path / f"ran-for-{n2.address}").exists()
