"""The SSH transport on real sshd hosts."""

from __future__ import annotations

import hashlib

import pytest

from clusterddp import inventory
from clusterddp.transport import connect

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
        assert t._conn.transport.remote_cipher == "aes128-gcm@openssh.com"
    finally:
        t.close()
    bed.restart_sshd(bed.nodes[0], "Ciphers aes256-ctr\n")
    t = connect(host)
    try:
        assert t._conn.transport.remote_cipher == "aes256-ctr"
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
