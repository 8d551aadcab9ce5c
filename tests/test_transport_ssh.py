"""The SSH transport on real sshd hosts."""

from __future__ import annotations

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
