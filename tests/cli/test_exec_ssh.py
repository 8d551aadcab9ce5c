"""`clusterddp exec` for real: output by host, exit codes aggregated, the fan-out bound kept."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from helpers import cddp, cddp_popen, eventually, wait_for_line

pytestmark = pytest.mark.integration


def test_output_is_prefixed_and_exit_codes_aggregate(bed, tmp_path):
    inv = bed.write_inventory(tmp_path / "inv.yaml", defaults_extra={
        "env": {"GREETING": "hi 'there' $HOME"}, "setup": ["export FROM_SETUP=yes", "echo setup chatter"]})
    r = cddp("exec", str(inv), "--", 'echo "$GREETING $FROM_SETUP $CLUSTERDDP_HOST on $(hostname)"', check_rc=0)
    assert sorted(r.stdout.splitlines()) == ["[node1] hi 'there' $HOME yes node1 on node1",
                                             "[node2] hi 'there' $HOME yes node2 on node2"]
    assert r.stderr == ""

    r = cddp("exec", str(inv), "--", "echo out; echo err >&2; case $(hostname) in node2) exit 3;; esac",
             check_rc=1)
    lines = r.stdout.splitlines()
    assert {"[node1] out", "[node1] err", "[node2] out", "[node2] err"} == set(lines)
    assert r.stderr == "exec: 1 of 2 host(s) failed:\n  node2: exit 3\n"

    r = cddp("exec", str(inv), "--hosts", "node2", "--", "hostname", check_rc=0)
    assert r.stdout == "[node2] node2\n"


@pytest.mark.parametrize("args, words", [
    (["--"], "no command given"),
    (["--hosts", "node9", "--", "true"], "--hosts names node9"),
    (["--fanout", "0", "--", "true"], "--fanout"),
])
def test_bad_input_exits_2(bed, tmp_path, args, words):
    inv = bed.write_inventory(tmp_path / "inv.yaml")
    r = cddp("exec", str(inv), *args)
    assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr


def peak_concurrency(log: Path) -> int:
    events = sorted((float(t), int(d)) for t, d in (line.split() for line in log.read_text().splitlines()))
    now = peak = 0
    for _, d in events:
        now += d
        peak = max(peak, now)
    return peak


def test_fanout_bound_is_honoured(make_bed, tmp_path):
    b = make_bed(3)
    inv = b.write_inventory(tmp_path / "inv.yaml")
    # every node shares this filesystem: each appends when its command starts and when it ends
    cmd = "echo $(date +%s.%N) 1 >> {log}; sleep 1; echo $(date +%s.%N) -1 >> {log}"

    def peak(*args: str, inventory: Path = inv) -> int:
        log = tmp_path / f"log{len(list(tmp_path.glob('log*')))}"
        cddp("exec", str(inventory), *args, "--", cmd.format(log=log), check_rc=0)
        return peak_concurrency(log)
    assert peak("--fanout", "2") == 2

    doc = yaml.safe_load(inv.read_text())
    doc["fanout"] = 1
    one = tmp_path / "one.yaml"
    one.write_text(yaml.safe_dump(doc))
    assert peak(inventory=one) == 1  # the inventory's fanout: one host after another
    assert peak("--fanout", "3", inventory=one) >= 2  # the flag wins over the inventory


def test_timeout_reports_the_slow_host_ends_its_command_and_keeps_the_others(bed, tmp_path):
    inv = bed.write_inventory(tmp_path / "inv.yaml")
    naptime = f"30.{os.getpid()}{secrets.randbelow(10**6)}"  # names this test's sleep among the machine's processes
    t0 = time.monotonic()
    # --timeout counts from the connection, login shell included: 5 s leaves room for a loaded machine
    r = cddp("exec", str(inv), "--timeout", "5", "--",
             f"echo hi; case $(hostname) in node2) sleep {naptime} | cat;; esac", check_rc=1, timeout=60)
    took = time.monotonic() - t0
    assert took < 15, f"exec took {took:.1f}s with --timeout 5 and a 30 s sleep"
    assert set(r.stdout.splitlines()) == {"[node1] hi", "[node2] hi"}
    assert r.stderr == ("exec: 1 of 2 host(s) failed:\n  node2: timed out after 5s (the command is ended on the node; "
                        "its connection was closed)\n")
    # Closing the connection alone leaves a command without a terminal running: the node's timer ends it.
    assert eventually(lambda: subprocess.run(["pgrep", "-f", f"sleep {naptime}"]).returncode == 1, timeout=15), \
        f"node2's `sleep {naptime}` still runs after exec --timeout 5 returned"
    r = cddp("exec", str(inv), "--timeout", "0", "--", "true")
    assert r.returncode == 2 and "--timeout" in r.stderr and "Traceback" not in r.stderr


def test_a_link_dying_mid_command_is_reported_within_the_timeout(make_bed, tmp_path):
    b = make_bed(2)
    node2 = b.nodes[1]
    inv = b.write_inventory(tmp_path / "inv.yaml", defaults_extra={"connect_timeout": 3})
    p = cddp_popen("exec", str(inv), "--timeout", "8", "--", "echo started; sleep 2; echo done")
    try:
        lines = wait_for_line(p, "[node2] started")
        subprocess.run(["ip", "link", "set", node2.veth, "down"], check=True)
        cut = time.monotonic()
        rest, _ = p.communicate(timeout=60)  # stderr is merged into stdout
        out = "".join(lines) + rest
        took = time.monotonic() - cut
        print(f"exec: node2's link cut mid-command, reported after {took:.1f}s")
        assert took < 12, f"exec ended {took:.1f}s after node2's link was cut (--timeout 8)"
        assert p.returncode == 1 and "[node1] done" in out, out
        assert "exec: 1 of 2 host(s) failed:\n  node2: timed out after 8s" in out, out
    finally:
        p.kill()
        subprocess.run(["ip", "link", "set", node2.veth, "up"], check=True)


def test_ctrl_c_ends_the_command_on_every_host(bed, tmp_path):
    inv = bed.write_inventory(tmp_path / "inv.yaml")
    naptime = f"300.{os.getpid()}{secrets.randbelow(10**6)}"  # names this test's sleep among the machine's processes
    p = cddp_popen("exec", str(inv), "--", f"echo started; sleep {naptime} | cat")
    try:
        lines = wait_for_line(p, "[node1] started")
        if not any("[node2] started" in line for line in lines):
            lines += wait_for_line(p, "[node2] started")
        assert eventually(lambda: len(sleeps(naptime)) == 2, 15), "both nodes' sleep should run"
        p.send_signal(signal.SIGINT)
        rest, _ = p.communicate(timeout=60)  # stderr is merged into stdout
        assert p.returncode == 130, rest
        assert "exec: interrupted; the command was ended on 2 host(s)" in rest, rest
        # without a terminal, closing the connection alone leaves the command running on the node
        assert eventually(lambda: not sleeps(naptime), 15), f"still running after Ctrl-C: {sleeps(naptime)}"
    finally:
        p.kill()
        for pid in sleeps(naptime):
            os.kill(int(pid), signal.SIGKILL)


def sleeps(naptime: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", f"^sleep {naptime}$"], capture_output=True, text=True).stdout.split()
