"""`clusterddp check --collective` for real: all_reduce over sshd hosts in network namespaces.

A rate-limited veth (tc tbf) must make its node slow, and only it; a node whose namespace drops
its traffic to the master port must be named as never joined, within the join bound.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from helpers import cddp, eventually

pytestmark = pytest.mark.integration


def collective(inv, *args: str, rc: int, timeout: float = 180) -> tuple[dict | str, float]:
    t0 = time.monotonic()
    r = cddp("check", str(inv), "--collective", *args, check_rc=rc, timeout=timeout)
    took = time.monotonic() - t0
    print(f"check --collective {' '.join(args)}: {took:.1f}s")
    return (json.loads(r.stdout) if "--json" in args else r.stdout), took


def by_host(rep: dict) -> dict[str, dict]:
    return {h["host"]: h for h in rep["hosts"]}


def no_leftovers(b) -> None:
    assert eventually(lambda: not any(b.ns_pids(n) for n in b.nodes), 20), "the test left processes on a node"


def test_rate_limited_node_is_flagged_slow_and_only_it(make_bed, tmp_path):
    b = make_bed(3)
    inv = b.write_inventory(tmp_path / "inv.yaml")

    out, _ = collective(inv, rc=0)
    assert "PASS: all 3 host(s) joined and ran all_reduce; none slow" in out, out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("node")}
    assert set(rows) == {"node1", "node2", "node3"} and all(r[-1] == "OK" and r[2] == "eth0" for r in rows.values())
    assert "rule: a host is slow when its bus bandwidth is under 1/5 of the median host's" in out

    # node3's veth (the bridge side: all traffic to node3) at 8 Mbit/s; the bed's links are >100x faster
    subprocess.run(["tc", "qdisc", "add", "dev", b.nodes[2].veth, "root", "tbf", "rate", "8mbit", "burst", "16kb",
                    "latency", "400ms"], check=True)
    rep, _ = collective(inv, "--json", rc=1)
    hosts = by_host(rep)
    shown = json.dumps(rep, indent=1)
    assert rep["ok"] is False and rep["backend"] == "gloo", shown
    assert hosts["node3"]["status"] == "slow", shown
    assert hosts["node3"]["problem"].startswith("bus bandwidth") and "the median" in hosts["node3"]["problem"], shown
    assert hosts["node1"]["status"] == hosts["node2"]["status"] == "ok", shown
    # 8 Mbit/s = 1 MB/s; a small operation passes within the tbf burst, so its best figure may be a little above
    assert hosts["node1"]["busbw_bytes_per_s"] > 30 * hosts["node3"]["busbw_bytes_per_s"], shown
    assert all(h["facts"]["hostname"] == h["host"] for h in rep["hosts"]), shown  # each really ran on its node
    assert [f["size"] for f in rep["world"]][0] == 1024 and "median" in rep["rule"], shown
    # the slow node's pairs stop at a small size: a slow link shortens the test
    assert hosts["node3"]["busbw_size"] <= 1 << 20, shown
    no_leftovers(b)


def test_node_blocked_from_the_master_port_is_named_never_joined_within_the_bound(make_bed, tmp_path):
    b = make_bed(3)
    inv = b.write_inventory(tmp_path / "inv.yaml")
    master = b.nodes[0].address
    subprocess.run(["ip", "netns", "exec", b.nodes[1].ns, "iptables", "-A", "OUTPUT", "-p", "tcp", "-d", master,
                    "--dport", "29500", "-j", "DROP"], check=True)
    join = 15
    out, took = collective(inv, "--join-timeout", str(join), rc=1)
    assert f"FAIL node2: never joined within {join}s: master port unreachable: cannot reach the master port " \
           f"{master}:29500" in out, out
    assert "fix: let node2 reach" in out and "FAIL: 1 host(s) not in the job: node2" in out
    assert "FAIL node1" not in out and "FAIL node3" not in out
    # the bound: the join timeout after the master is up, plus torch's import and SSH on a loaded machine
    assert took < join + 45, f"took {took:.0f}s with a {join}s join bound"
    no_leftovers(b)
