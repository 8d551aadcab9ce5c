"""Preflight checks and the fleet layer, without SSH.

The verdicts are pure (facts in, findings out), so every rule is tested by name on made-up
probe output. The probe itself is run for real on this machine with bash (it is the same
shell text SSH would carry). The connection layer is tested with fake transports.
The SSH versions of all this are in test_check_ssh.py and test_exec_ssh.py.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace

import pytest

from clusterddp import check, inventory, plan
from clusterddp.check import FAIL, OK, WARN, evaluate, probe_command
from clusterddp.errors import HostError, HostErrorKind, InventoryError, PreflightFailed
from clusterddp.exec_ import exec_command
from clusterddp.fleet import Fleet, HostResult, fan_out
from clusterddp.node.probe import MARK, parse_reply
from clusterddp.nodescript import NodeCommand
from clusterddp.runspec import RunSpec
from clusterddp.store import RunStore
from clusterddp.transport import CommandResult
from helpers import resolved

INV = """
defaults: {gpus: 2, python: /opt/py/bin/python, workdir: /data/cddp}
master: {port: 29500}
hosts:
  - {name: a, address: 10.0.0.1}
  - {name: b, address: 10.0.0.2}
  - {name: c, address: 10.0.0.3}
"""
NOW = 1_800_000_000.0


def inv(text: str = INV) -> inventory.Inventory:
    return inventory.parse(text, "inv.yaml")


def facts(**over) -> dict:
    f = {"python": "3.11.7", "executable": "/opt/py/bin/python", "hostname": None, "iface": "eth0",
         "torch": "2.13.0+cu124", "cuda": "12.4", "nccl": "2.21.5", "torch_error": None, "full": True,
         "gpus": 2, "interfaces": ["eth0", "lo"], "env_ifname": {}, "disk_path": "/data/cddp",
         "disk_free": 500 << 30, "workdir_exists": True, "disk_writable": True, "time": NOW}
    f.update(over)
    return f


def probed(host: str, f: dict | None = None, *, port_free: bool | None = None, stdout: str | None = None,
           exit_code: int = 0, stderr: str = "", ended: float = NOW) -> HostResult:
    f = dict(f or facts(hostname=host))
    if port_free is not None:
        f["port_free"] = port_free
    out = stdout if stdout is not None else "motd noise\n" + MARK + json.dumps(f) + "\n"
    return HostResult(host, CommandResult(exit_code, out.encode(), stderr.encode()), None, ended - 0.1, ended)


def healthy(**per_host) -> list[HostResult]:
    """a (the master), b, c with identical facts; per_host={"b": {...overrides}} changes one."""
    return [probed(h, facts(**{"hostname": h, **per_host.get(h, {})}), port_free=True if h == "a" else None)
            for h in "abc"]


def finding(report: check.Report, host: str, name: str) -> check.Finding:
    f = next(h for h in report.hosts if h.host == host).get(name)
    assert f is not None, f"no {name} finding for {host}"
    return f


# ---- verdicts ----

def test_identical_healthy_hosts_pass_with_every_check():
    r = evaluate(inv(), healthy())
    assert r.ok and [h.status for h in r.hosts] == [OK, OK, OK]
    assert [f.check for f in r.hosts[0].findings] == ["ssh", "python", "torch", "cuda", "nccl", "gpus", "iface",
                                                     "port", "disk", "clock"]
    assert r.hosts[1].get("port") is None  # only the master's port is checked
    assert finding(r, "a", "port").value == "29500 free" and finding(r, "b", "gpus").value == "2"
    json.dumps(r.to_dict())  # --json must not choke


def test_the_odd_python_is_named_against_the_majority():
    r = evaluate(inv(), healthy(b={"python": "3.10.12"}))
    f = finding(r, "b", "python")
    assert not r.ok and f.status == FAIL and f.value == "3.10.12"
    assert f.problem == "python 3.10.12 differs from 3.11.7 on a, c; every node must run the same python"
    assert "Python 3.11.7" in f.fix and "/opt/py/bin/python" in f.fix
    assert finding(r, "a", "python").status == finding(r, "c", "python").status == OK


def test_on_a_tie_the_earliest_host_is_the_reference():
    two = inv(INV.replace("  - {name: c, address: 10.0.0.3}\n", ""))
    r = evaluate(two, healthy(b={"python": "3.12.1"})[:2])
    assert finding(r, "a", "python").status == OK and finding(r, "b", "python").status == FAIL


def test_torch_cuda_and_nccl_must_agree():
    r = evaluate(inv(), healthy(b={"torch": "2.3.0+cu121", "cuda": "12.1", "nccl": "2.20.5"}))
    assert {finding(r, "b", c).status for c in ("torch", "cuda", "nccl")} == {FAIL}
    assert "pip install torch==2.13.0" in finding(r, "b", "torch").fix
    assert finding(r, "a", "torch").status == OK


def test_missing_torch_is_its_own_failure_and_not_a_version_to_compare():
    r = evaluate(inv(), healthy(c={"torch": None, "cuda": None, "nccl": None, "torch_error": "not installed"}))
    f = finding(r, "c", "torch")
    assert (f.status, f.value) == (FAIL, "missing")
    assert "not importable by /opt/py/bin/python (not installed)" in f.problem and "torch==2.13.0" in f.fix
    assert finding(r, "c", "cuda").value == "-" and finding(r, "a", "torch").status == OK


def test_torch_that_does_not_import_is_broken():
    r = evaluate(inv(), healthy(a={"torch_error": "import torch failed: OSError: libcudnn.so.9"}))
    f = finding(r, "a", "torch")
    assert (f.status, f.value) == (FAIL, "broken") and "libcudnn" in f.problem and "--force-reinstall" in f.fix


def test_nccl_is_compared_only_where_known():
    r = evaluate(inv(), healthy(b={"nccl": None}))
    assert r.ok and finding(r, "b", "nccl").value == "-"


def test_unreachable_and_changed_key_hosts_fail_without_hiding_the_others():
    results = healthy()
    results[1] = HostResult("b", None, HostError("b", "no answer from root@10.0.0.2:22 within 3s", "check it",
                                                 kind=HostErrorKind.TIMEOUT))
    results[2] = HostResult("c", None, HostError("c", "host key for 10.0.0.3 has CHANGED (refused)",
                                                 "`ssh-keygen -R 10.0.0.3`", kind=HostErrorKind.HOST_KEY_CHANGED))
    r = evaluate(inv(), results)
    assert finding(r, "b", "ssh").value == "timeout" and finding(r, "b", "ssh").fix == "check it"
    assert finding(r, "c", "ssh").value == "host key CHANGED"
    assert finding(r, "c", "ssh").problem == "host key for 10.0.0.3 has CHANGED (refused)"
    assert r.hosts[0].status == OK  # a still compared and passing on its own
    assert "  b: no answer from root@10.0.0.2:22 within 3s\n    fix: check it" in r.summary()


@pytest.mark.parametrize("kind, value", [
    (HostErrorKind.HOST_KEY_UNKNOWN, "host key unknown"), (HostErrorKind.HOST_KEY_CHANGED, "host key CHANGED"),
    (HostErrorKind.AUTH_REFUSED, "auth failed"), (HostErrorKind.TIMEOUT, "timeout"),
    (HostErrorKind.UNREACHABLE, "unreachable"), (HostErrorKind.CONNECTION_LOST, "connection lost"),
    (HostErrorKind.CONFIG, "ssh_config"), (HostErrorKind.KEY_FILE, "key file"), (HostErrorKind.OTHER, "failed"),
])
def test_the_ssh_verdict_comes_from_the_errors_kind_not_its_wording(kind, value):
    results = healthy()
    results[1] = HostResult("b", None, HostError("b", "the host key changed within 3s: authentication", "fix",
                                                 kind=kind))
    r = evaluate(inv(), results)
    assert (finding(r, "b", "ssh").value, finding(r, "b", "ssh").status) == (value, FAIL)


def test_python_not_found_and_failing_setup_are_named():
    results = healthy()
    results[1] = probed("b", stdout="", stderr="bash: exec: /opt/py/bin/python: not found\n", exit_code=127)
    results[2] = probed("c", stdout=MARK + json.dumps({"setup_failed": "source ~/venv/bin/activate"}),
                        stderr="bash: /root/venv/bin/activate: No such file or directory\n")
    r = evaluate(inv(), results)
    b, c = finding(r, "b", "python"), finding(r, "c", "setup")
    assert b.value == "not found" and "/opt/py/bin/python was not found" in b.problem
    assert "setup line failed: source ~/venv/bin/activate (bash: /root/venv/bin/activate: No such" in c.problem


def test_busy_master_port_fails_on_the_master():
    results = healthy()
    results[0] = probed("a", facts(hostname="a", port_error="Address already in use"), port_free=False)
    r = evaluate(inv(), results, master_port=29600)
    f = finding(r, "a", "port")
    assert (f.status, f.value) == (FAIL, "29600 busy") and "Address already in use" in f.problem
    assert "--master-port" in f.fix and "sport = :29600" in f.fix


@pytest.mark.parametrize("gpus_setting, seen, extra, status, words", [
    (2, 1, {}, FAIL, "the inventory says gpus: 2, but nvidia-smi sees 1"),
    (2, 4, {}, OK, "4 (uses 2)"),
    ("auto", 8, {}, OK, "8"),
    (2, None, {}, OK, "no GPU, 2 procs"),  # a CPU node: gpus is processes per node (gloo)
    (2, 2, {"cuda": None, "nccl": None}, FAIL, "is a CPU-only build"),
    (2, None, {"gpu_error": "NVIDIA-SMI has failed"}, FAIL, "nvidia-smi failed: NVIDIA-SMI has failed"),
])
def test_gpus_against_the_inventory(gpus_setting, seen, extra, status, words):
    i = inv(INV.replace("gpus: 2", f"gpus: {gpus_setting}"))
    r = evaluate(i, healthy(b={"gpus": seen, **extra}))
    f = finding(r, "b", "gpus")
    assert f.status == status and words in (f.problem or f.value)


def test_interface_checks():
    r = evaluate(inv(), healthy(b={"iface": None}, c={"iface": "lo"}))
    assert "no interface on this node routes to the master address 10.0.0.1" in finding(r, "b", "iface").problem
    assert "loopback" in finding(r, "c", "iface").problem
    env = INV.replace("  - {name: c, address: 10.0.0.3}",
                      "  - {name: c, address: 10.0.0.3, env: {NCCL_SOCKET_IFNAME: ib0, GLOO_SOCKET_IFNAME: ib0}}")
    r = evaluate(inv(env), healthy())
    assert "NCCL_SOCKET_IFNAME=ib0, but this node has no interface ib0 (it has eth0, lo)" in \
        finding(r, "c", "iface").problem
    r = evaluate(inv(env), healthy(c={"interfaces": ["eth0", "ib0", "lo"]}))
    assert finding(r, "c", "iface") == check.Finding("iface", OK, "ib0 (env)")
    r = evaluate(inv(), healthy(b={"iface": None, "ip_tool": False}))
    assert finding(r, "b", "iface").status == WARN and "iproute2" in finding(r, "b", "iface").problem


def test_single_node_on_loopback_is_fine():
    one = inv("master: {addr: 127.0.0.1}\nhosts: [{name: a}]\n")
    r = evaluate(one, [probed("a", facts(iface="lo", gpus=None), port_free=True)])
    assert finding(r, "a", "iface").status == OK


@pytest.mark.parametrize("over, status, words", [
    ({"disk_free": 512 << 20}, FAIL, "only 512.0M free in /data/cddp"),
    ({"disk_free": 5 << 30}, WARN, "checkpoints may not fit"),
    ({"disk_writable": False, "disk_path": "/data"}, FAIL, "cannot write to /data (workdir: /data/cddp)"),
    ({"workdir_exists": False, "disk_path": "/data"}, OK, "500.0G free (new)"),
])
def test_disk(over, status, words):
    f = finding(evaluate(inv(), healthy(b=over)), "b", "disk")
    assert f.status == status and words in (f.problem or f.value)


@pytest.mark.parametrize("skew, status", [(0.3, OK), (-4.0, WARN), (120.0, FAIL)])
def test_clock_skew(skew, status):
    f = finding(evaluate(inv(), healthy(b={"time": NOW + skew})), "b", "clock")
    assert f.status == status and f.value == f"{skew:+.1f}s"


def test_two_entries_on_one_machine_warn():
    r = evaluate(inv(), healthy(b={"hostname": "box"}, c={"hostname": "box"}))
    assert r.ok and finding(r, "b", "machine").problem == "same machine as c (hostname box)"


def test_hosts_reading_one_workdir_marker_share_it_and_are_told_once_what_clusterddp_does(capsys):
    r = evaluate(inv(), healthy(a={"workdir_id": "x1"}, b={"workdir_id": "x2"}, c={"workdir_id": "x1"}))
    assert r.ok and [finding(r, h, "workdir").value for h in "abc"] == ["shared (2 hosts)", "own", "shared (2 hosts)"]
    note = finding(r, "a", "workdir").note
    assert note.startswith("a, c share one workdir folder") and "unpacked into <workdir>/runs/<run_id>/ once" in note
    assert finding(r, "b", "workdir").note is None and finding(r, "c", "workdir").note is None  # said once
    from clusterddp.cli.check import print_report
    assert print_report(r, 1.0)
    assert f"note a workdir: {note}\n" in capsys.readouterr().out
    r = evaluate(inv(), healthy(b={"workdir_id_error": "PermissionError: [Errno 13] denied"}))
    assert r.ok and finding(r, "b", "workdir").status == WARN and "denied" in finding(r, "b", "workdir").problem


def test_clusterddp_train_is_shipped_to_a_python_without_it_and_a_differing_own_copy_is_named():
    ours = check._launcher_train_sha256()
    r = evaluate(inv(), healthy(a={"train": None}, b={"train": "/n/clusterddp/train.py", "train_sha256": ours},
                                c={"train": "/n/clusterddp/train.py", "train_sha256": "0" * 64}))
    assert [(finding(r, h, "train").status, finding(r, h, "train").value) for h in "abc"] == [
        (OK, "shipped"), (OK, "installed"), (WARN, "installed, differs")]
    f = finding(r, "c", "train")
    assert "/n/clusterddp/train.py" in f.problem and "never shadowed" in f.problem
    assert "/opt/py/bin/python -m pip install clusterddp==" in f.fix and "pip uninstall clusterddp" in f.fix
    r = evaluate(inv(), healthy(b={"train_error": "it has a clusterddp (/x/__init__.py) without clusterddp.train"}))
    assert finding(r, "b", "train").status == WARN and "not shipped" == finding(r, "b", "train").value


def test_quick_mode_checks_only_the_cheap_subset():
    results = [probed(h, facts(hostname=h, gpus=None, nccl=None, time=0, disk_free=1, full=False),
                      port_free=(h == "a") or None) for h in "abc"]
    r = evaluate(inv(), results, full=False)
    assert r.ok and r.checks == check.QUICK_CHECKS
    assert [f.check for f in r.hosts[0].findings] == ["ssh", "python", "torch", "cuda", "iface", "port"]


def test_preflight_failure_names_each_host_and_the_way_out():
    r = evaluate(inv(), healthy(b={"python": "3.10.12"}))
    e = check.preflight_failed(r, "inv.yaml")
    assert e.exit_code == 1
    text = str(e)
    assert text.startswith("preflight check failed on b; the job was not started:\n  b: python 3.10.12 differs")
    assert "`clusterddp check inv.yaml`" in text and "--skip-check" in text


# ---- the probe and exec commands, run for real with bash on this machine ----

def local_host(**over) -> inventory.Host:
    return replace(inventory.local(python=sys.executable).hosts[0], **over)


def bash(cmd: NodeCommand) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd.text], input=cmd.stdin, capture_output=True, timeout=60)


def test_probe_reports_this_machine(tmp_path):
    h = local_host(workdir=str(tmp_path / "not" / "yet"), env=(("GLOO_SOCKET_IFNAME", "it's $HOME"),),
                   setup=("export FROM_SETUP=1", "echo chatter"))
    with socket.socket() as s:  # a free port, then check the probe agrees
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = bash(probe_command(h, "127.0.0.1", port, full=False))
    f = parse_reply(p.stdout, p.stderr, p.returncode)
    assert f["python"] == ".".join(map(str, sys.version_info[:3])) and f["executable"] == sys.executable
    from importlib.metadata import version
    assert f["torch"] == version("torch")  # read from torch/version.py, without importing torch
    assert f["env_ifname"]["GLOO_SOCKET_IFNAME"] == "it's $HOME"  # exported verbatim
    assert f["iface"] == "lo" and f["port_free"] is True and "gpus" not in f  # quick: no nvidia-smi
    assert f["disk_path"] == str(tmp_path) and f["workdir_exists"] is False and f["disk_free"] > 0
    assert abs(f["time"] - time.time()) < 30
    assert b"chatter" in p.stderr and b"chatter" not in p.stdout  # setup output kept off the report


def test_probe_finds_the_master_port_taken():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = bash(probe_command(local_host(), "127.0.0.1", port, full=False))
    f = parse_reply(p.stdout, p.stderr, p.returncode)
    assert f["port_free"] is False and "in use" in f["port_error"]


def test_probe_reports_a_failing_setup_line():
    p = bash(probe_command(local_host(setup=("true", "echo 'it''s' >&2; false")), "127.0.0.1", None))
    f = parse_reply(p.stdout, p.stderr, p.returncode)
    assert f == {"setup_failed": "echo 'it''s' >&2; false"} and b"its" in p.stderr


def test_exec_command_runs_setup_and_env_then_the_words():
    h = local_host(name="gpu-01", env=(("GREETING", "a 'b' $c"),), setup=("export S=from-setup", "echo quiet"))
    p = bash(exec_command(h, ["echo", '"$GREETING|$S|$CLUSTERDDP_HOST"', "|", "tr", "a", "A"]))
    assert (p.returncode, p.stdout) == (0, b"A 'b' $c|from-setup|gpu-01\n")
    p = bash(exec_command(local_host(setup=("false",)), ["echo", "never"]))
    assert p.returncode == 98 and p.stdout == b"" and b"setup failed: false" in p.stderr


# ---- inventory keys ----

def test_fanout_and_keepalive_from_the_inventory():
    i = inv("fanout: 8\ndefaults: {keepalive: 0}\nhosts: [{name: a, keepalive: 15}, {name: b}]\n")
    assert i.fanout == 8 and [h.keepalive for h in i.hosts] == [15.0, 0.0]
    assert i.select(["b"]).fanout == 8
    d = inv("hosts: [{name: a}]\n")
    assert d.fanout == 32 and d.hosts[0].keepalive == 5.0
    with pytest.raises(InventoryError, match="fanout"):
        inv("fanout: 0\nhosts: [{name: a}]\n")


# ---- the connection layer ----

class FakeTransport:
    def __init__(self, name: str, log: list, delay: float = 0.0, code: int = 0) -> None:
        self.name, self.log, self.delay, self.code, self.closed = name, log, delay, code, False

    def run(self, command, *, timeout=None, stdin=None):
        time.sleep(self.delay)
        self.log.append((self.name, command))
        return CommandResult(self.code, f"{self.name}: {command}".encode(), b"")

    def stream(self, command, on_data, *, timeout=None, stderr_to=None, stdin=None):
        on_data(f"{self.name} says {command}\n".encode())
        return self.code

    def close(self):
        self.closed = True


def hosts(n: int) -> tuple[inventory.Host, ...]:
    return tuple(local_host(name=f"h{i}") for i in range(n))


def test_fan_out_never_exceeds_its_limit_and_keeps_order():
    lock, now, peak = threading.Lock(), [0], [0]

    def work(x):
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        time.sleep(0.02)
        with lock:
            now[0] -= 1
        if x == 3:
            raise ValueError("three")
        return x * 10
    out = fan_out(list(range(12)), work, limit=3, key=lambda x: f"h{x}")
    assert peak[0] == 3
    assert list(out) == [f"h{x}" for x in range(12)]  # a mapping, in item order
    assert list(out.failed) == ["h3"] and isinstance(out["h3"], ValueError)
    assert out.succeeded == {f"h{x}": x * 10 for x in range(12) if x != 3}
    assert out.first_failure() == ("h3", out["h3"])
    assert out.or_else(lambda k, e: str(e))["h3"] == "three"
    assert fan_out([], work, key=str) == {} and fan_out([], work, key=str).first_failure() is None
    with pytest.raises(ValueError, match="unique"):
        fan_out([1, 1], work, key=str)


def test_fleet_keeps_every_hosts_result_and_reuses_connections():
    log, connects = [], []

    def connect(h):
        connects.append(h.name)
        if h.name == "h1":
            raise HostError("h1", "no answer within 3s")
        if h.name == "h2":
            raise RuntimeError("boom")
        return FakeTransport(h.name, log, code=5 if h.name == "h3" else 0)
    with Fleet(hosts(5), fanout=2, connect=connect) as fleet:
        first = fleet.run(lambda h: f"hello {h.name}")
        second = fleet.run("again")
    assert [r.host for r in first] == ["h0", "h1", "h2", "h3", "h4"]
    assert [r.ok for r in first] == [True, False, False, False, True]
    assert str(first[1].error) == "h1: no answer within 3s" and "h2: cannot connect: boom" in str(first[2].error)
    assert first[3].exit_code == 5 and first[0].result.text == "h0: hello h0"
    assert all(r.started <= r.ended for r in first)
    assert sorted(connects) == ["h0", "h1", "h2", "h3", "h4"]  # once each: reused, and failures not retried
    assert [r.error is not None for r in second] == [False, True, True, False, False]


def test_fleet_streams_and_closes_one_host_or_all():
    log, made, connects = [], {}, []

    def connect(h):
        connects.append(h.name)
        if h.name == "h2":
            raise HostError("h2", "no answer within 3s")
        made[h.name] = FakeTransport(h.name, log)
        return made[h.name]
    seen = []
    fleet = Fleet(hosts(3), connect=connect)
    res = fleet.run("x", on_output=lambda host, b: seen.append((host, b)))
    assert sorted(seen) == [("h0", b"h0 says x\n"), ("h1", b"h1 says x\n")]
    assert [r.ok for r in res] == [True, True, False]
    assert [h.name for h in fleet.connected()] == ["h0", "h1"] and list(fleet.unreachable) == ["h2"]
    fleet.close_host(hosts(3)[0])
    assert made["h0"].closed and not made["h1"].closed
    again = fleet.each(lambda h, t: t)
    assert again.succeeded == made and list(again.failed) == ["h2"]  # h0's closed one is kept, not reopened
    assert sorted(connects) == ["h0", "h1", "h2"]
    fleet.close()
    assert made["h1"].closed and fleet.connected() == []


def test_fleet_is_as_slow_as_its_slowest_host_not_the_sum():
    # 8 hosts of 0.5 s: about 0.5 s in parallel, 4 s one after another; 2 s tells them apart
    # even on a loaded machine; a fan-out of 1 (4 s) or 2 (2 s) fails it.
    log = []
    t0 = time.monotonic()
    with Fleet(hosts(8), connect=lambda h: FakeTransport(h.name, log, delay=0.5)) as fleet:
        results = fleet.run("x")
    elapsed = time.monotonic() - t0
    assert [r.ok for r in results] == [True] * 8 and len(log) == 8
    assert 0.5 <= elapsed < 2.0, f"{elapsed:.2f}s for 8 hosts of 0.5s each"


# ---- the CLI, without a test bed ----

def test_cli_reports_an_unreachable_host_with_exit_1(tmp_path):
    from helpers import cddp
    (tmp_path / "inv.yaml").write_text(  # nothing listens on port 1 of loopback: refused at once
        "defaults: {port: 1, connect_timeout: 2}\nhosts: [{name: box, address: 127.0.0.1}]\n")
    r = cddp("check", "inv.yaml", cwd=tmp_path, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "FAIL box ssh: cannot connect to " in r.stdout and "FAIL: 1 of 1 host(s) not ready: box" in r.stdout
    r = cddp("exec", "inv.yaml", "--", "true", cwd=tmp_path, timeout=60)
    assert r.returncode == 1 and r.stderr.startswith("exec: 1 of 1 host(s) failed:\n  box: cannot connect to ")


@pytest.mark.parametrize("args, words", [
    (["check", "nope.yaml"], "nope.yaml: no such file"),
    (["check", "inv.yaml", "--hosts", "gpu-9"], "--hosts names gpu-9"),
    (["check", "inv.yaml", "--fanout", "0"], "--fanout"),
    (["exec", "inv.yaml", "--hosts", ",", "--", "true"], "--hosts ',' names no host"),
    (["exec", "bad.yaml", "--", "true"], "bad.yaml:1: fanout: input should be greater than or equal to 1"),
])
def test_cli_bad_input_exits_2(tmp_path, args, words):
    from helpers import cddp
    (tmp_path / "inv.yaml").write_text("hosts: [{name: gpu-1, address: gpu-1.invalid}]\n")
    (tmp_path / "bad.yaml").write_text("fanout: 0\nhosts: [{name: gpu-1}]\n")
    r = cddp(*args, cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, r.stderr


# ---- up's preflight, at the seam ----

class ProbeTransport(FakeTransport):
    """Answers the probe with made-up facts."""

    def __init__(self, name: str, log: list, facts_: dict) -> None:
        super().__init__(name, log)
        self.facts = facts_

    def run(self, command, *, timeout=None, stdin=None):
        self.log.append((self.name, command + (stdin or b"").decode()))
        return CommandResult(0, (MARK + json.dumps(self.facts) + "\n").encode(), b"")


def test_preflight_refuses_or_lends_its_connections_to_the_run(tmp_path):
    from clusterddp.backends.ssh import launch as jobs
    i = inv()
    p = plan.build_plan(i, resolved(RunSpec("t.py", env=(("FROM_CLI", "1"),)), i), "20261129-000000-test")
    log, made = [], {}

    def connect_with(over):
        def connect(h):
            made[h.name] = ProbeTransport(h.name, log, facts(hostname=h.name, port_free=True, full=False,
                                                             **over.get(h.name, {})))
            return made[h.name]
        return connect
    with pytest.raises(PreflightFailed) as e:
        jobs.preflight(p, connect=connect_with({"c": {"python": "3.9.2"}}))
    assert "preflight check failed on c" in str(e.value) and all(t.closed for t in made.values())
    assert "export FROM_CLI=1\n" in log[0][1]  # the run's env, as the job will have it (sent on stdin)
    assert json.loads(log[0][1].split("'")[-2])["full"] is False  # the quick probe: no torch import

    # The run goes on over the preflight's connections: one per host for the whole of `up`.
    made.clear()
    log.clear()
    fleet = jobs.preflight(p, connect=connect_with({}))
    assert fleet is not None and not any(t.closed for t in made.values())
    opened = dict(made)
    prep = jobs.Prepared(p, RunStore(tmp_path / "runs"), tmp_path)
    prep.store.create(jobs.new_record(prep, "inv.yaml"))
    jobs.execute(prep, lambda h, b: None, detach=True, fleet=fleet)
    assert made == opened and all(t.closed for t in made.values())  # no second connection; all closed at the end
    starts = {n.host.name: plan.start_node_command(n, False, False, len(n.launch_script.encode()))[0]
              + n.launch_script for n in p.nodes}  # + stdin
    assert sorted(h for h, cmd in log if cmd == starts[h]) == ["a", "b", "c"]
    here = inventory.local()
    local = plan.build_plan(here, resolved(RunSpec("t.py"), here), "x", local_run_dir=str(tmp_path),
                            local_control_dir=str(tmp_path / "c"))
    assert jobs.preflight(local) is None  # `up local` pays nothing


def test_busy_master_port_only_warns_when_up_would_choose_another():
    results = healthy()
    results[0] = probed("a", facts(hostname="a", port_error="Address already in use"), port_free=False)
    f = finding(evaluate(inv(), results, master_port=29500, port_fixed=False), "a", "port")
    assert (f.status, f.value) == (WARN, "29500 busy") and "next free one" in f.problem
