"""The preflight probe (clusterddp/node/probe.py), in-process: what it prints, read back by its parser.

test_check.py runs the same program through bash as ``probe_command`` renders it; these cover
its branches (a torch with CUDA, nvidia-smi answering or failing) and the parser's refusals.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sys
import types
from importlib.metadata import version

import pytest

from clusterddp.node import probe
from clusterddp.node.probe import MARK, ProbeError, parse_reply


def run(capsys, *, full: bool, port: int | None, workdir: str, iface: str = "lo") -> dict:
    assert probe.main([json.dumps({"full": full, "port": port, "workdir": workdir}), iface]) == 0
    out, err = capsys.readouterr()
    return parse_reply(("login banner\n" + out).encode(), err.encode(), 0)


def test_quick_probe_of_this_machine(capsys, tmp_path):
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen()
        taken = s.getsockname()[1]
        f = run(capsys, full=False, port=taken, workdir=str(tmp_path / "not" / "yet"))
    assert f["python"] == ".".join(map(str, sys.version_info[:3])) and f["executable"] == sys.executable
    assert f["torch"] == version("torch") and f["torch_error"] is None  # from torch/version.py
    assert f["iface"] == "lo" and "lo" in f["interfaces"] and "gpus" not in f  # quick: no nvidia-smi
    assert f["port_free"] is False and "in use" in f["port_error"]
    assert f["disk_path"] == str(tmp_path) and f["workdir_exists"] is False and f["disk_writable"] is True
    assert run(capsys, full=False, port=None, workdir="/", iface="")["iface"] is None


def test_a_port_in_time_wait_counts_as_free(capsys, tmp_path):
    """The previous run's closed connections are no conflict: its store and the probe both bind with
    SO_REUSEADDR, as torch's TCPStore does (Linux refuses unless both sides set it)."""
    with socket.socket() as ls:
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("", 0))
        ls.listen()
        port = ls.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as c:
            conn, _ = ls.accept()
            conn.close()  # the server side closes first: its end of the port goes to TIME_WAIT
            c.recv(1)
    f = run(capsys, full=False, port=port, workdir=str(tmp_path))
    assert f["port_free"] is True, f.get("port_error")


@pytest.fixture
def fake_gpu_node(monkeypatch, tmp_path):
    """A torch with CUDA and NCCL, and an nvidia-smi on PATH: the GPU branches, on a CPU machine."""
    torch = types.ModuleType("torch")
    torch.__spec__ = importlib.util.find_spec("torch")  # where the probe reads torch/version.py first
    torch.__dict__.update(__version__="2.13.0+cu124", version=types.SimpleNamespace(cuda="12.4"),
                          cuda=types.SimpleNamespace(nccl=types.SimpleNamespace(version=lambda: (2, 21, 5))))
    monkeypatch.setitem(sys.modules, "torch", torch)
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\nif [ -n \"$SMI_FAILS\" ]; then echo 'NVIDIA-SMI has failed' >&2; exit 9; fi\n"
                   "echo 'GPU 0: H100 (UUID: a)'; echo 'GPU 1: H100 (UUID: b)'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    return monkeypatch


def test_full_probe_reads_torch_cuda_nccl_and_the_gpu_count(capsys, fake_gpu_node, tmp_path):
    f = run(capsys, full=True, port=None, workdir=str(tmp_path))
    assert (f["torch"], f["cuda"], f["nccl"], f["gpus"]) == ("2.13.0+cu124", "12.4", "2.21.5", 2)
    assert f["workdir_exists"] is True and "port_free" not in f
    fake_gpu_node.setenv("SMI_FAILS", "1")
    f = run(capsys, full=True, port=None, workdir=str(tmp_path))
    assert "gpus" not in f and f["gpu_error"] == "NVIDIA-SMI has failed"


def test_setup_failed_reply_reads_back():
    assert parse_reply((probe.setup_failed_reply("source ~/v/bin/activate") + "\n").encode(), b"", 0) == {
        "setup_failed": "source ~/v/bin/activate"}


def test_the_last_marked_line_wins():
    out = f"{MARK}{{\"python\": \"old\"}}\nnoise\n{MARK}{{\"python\": \"3.11.7\"}}\nmore noise\n"
    assert parse_reply(out.encode(), b"", 0) == {"python": "3.11.7"}


@pytest.mark.parametrize("stdout, stderr, code, words", [
    ("", "bash: line 9: exec: /opt/py/bin/python: not found\n", 127, "not found"),
    ("hello\n", "", 1, "no output, exit 1"),
    (MARK + "{not json\n", "", 0, "unreadable"),
    (MARK + "[1]\n", "", 0, "not a JSON object"),
])
def test_parse_reply_says_why_when_there_is_no_report(stdout, stderr, code, words):
    with pytest.raises(ProbeError, match=words):
        parse_reply(stdout.encode(), stderr.encode(), code)


# ---- a probe reply is untrusted: its shape and types are checked before anything reads it ----

GOOD = {"python": "3.11.7", "executable": "/usr/bin/python3", "hostname": "n", "iface": "eth0",
        "torch": "2.13.0+cu124", "cuda": "12.4", "nccl": "2.21.5", "torch_error": None, "full": True, "gpus": 2,
        "interfaces": ["eth0", "lo"], "ip_tool": True, "env_ifname": {"NCCL_SOCKET_IFNAME": None},
        "disk_path": "/data", "disk_free": 500 << 30, "workdir_exists": True, "disk_writable": True,
        "port_free": True, "time": 1.8e9}

MALFORMED = [
    ({"python": ["3.11"]}, "python must be text, not a list"),
    ({"python": 3.11}, "python must be text, not a number"),
    ({"python": None}, "python must be text, not null"),
    ({"torch": 5}, "torch must be text, not a number"),
    ({"torch": ["2.1"]}, "torch must be text, not a list"),
    ({"cuda": {"v": 1}}, "cuda must be text, not an object"),
    ({"nccl": 2}, "nccl must be text"),
    ({"torch_error": {"a": 1}}, "torch_error must be text"),
    ({"executable": 1}, "executable must be text"),
    ({"hostname": ["a"]}, "hostname must be text"),
    ({"iface": 0}, "iface must be text"),
    ({"gpus": "2"}, "gpus must be a whole number >= 0, not text"),
    ({"gpus": -1}, "gpus must be a whole number >= 0"),
    ({"gpus": True}, "gpus must be a whole number >= 0, not true/false"),
    ({"gpus": 2.5}, "gpus must be a whole number >= 0"),
    ({"gpu_error": None}, "gpu_error must be text, not null"),
    ({"interfaces": "eth0"}, "interfaces must be a list of names, not text"),
    ({"interfaces": [1, 2]}, "interfaces must be a list of names"),
    ({"env_ifname": []}, "env_ifname must be an object of NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME"),
    ({"env_ifname": {"NCCL_SOCKET_IFNAME": 5}}, "env_ifname must be an object"),
    ({"env_ifname": {"PATH": "/bin"}}, "env_ifname must be an object"),
    ({"disk_free": "lots"}, "disk_free must be a finite number, not text"),
    ({"disk_free": 1e300}, "disk_free must be a finite number"),
    ({"disk_writable": 1}, "disk_writable must be true or false, not a number"),
    ({"disk_path": None}, "disk_path must be text"),
    ({"port_free": "yes"}, "port_free must be true or false"),
    ({"port_error": 1}, "port_error must be text"),
    ({"time": "now"}, "time must be a finite number, not text"),
    ({"full": "yes"}, "full must be true or false"),
    ({"python": ...}, "no python version in it"),
]


def reply(**over) -> bytes:
    f = {**GOOD, **over}
    return ("motd\n" + MARK + json.dumps({k: v for k, v in f.items() if v is not ...}) + "\n").encode()


@pytest.mark.parametrize("over, words", MALFORMED, ids=[w for _, w in MALFORMED])
def test_a_malformed_fact_is_a_probe_error_naming_it_and_check_reports_that_host(over, words):
    from clusterddp import inventory
    from clusterddp.check import FAIL, OK, evaluate
    from clusterddp.fleet import HostResult
    from clusterddp.transport import CommandResult

    field = next(iter(over))
    with pytest.raises(ProbeError, match=words) as e:
        parse_reply(reply(**over), b"", 0)
    assert e.value.field == field
    inv = inventory.parse("hosts: [{name: a, address: 10.0.0.1, gpus: 2}, {name: b, address: 10.0.0.2, gpus: 2}]\n",
                          "inv.yaml")
    results = [HostResult("a", CommandResult(0, reply(hostname="a"), b""), None, 1.8e9, 1.8e9),
               HostResult("b", CommandResult(0, reply(**{"hostname": "b", **over}), b""), None, 1.8e9, 1.8e9)]
    for full in (True, False):  # `check`, and `up`'s preflight
        report = evaluate(inv, results, full=full)
        a, b = report.hosts
        assert a.status == OK, a.findings
        assert b.status == FAIL and b.facts is None
        python = b.get("python")
        assert python is not None and python.value == "bad reply" and words in (python.problem or "")


def test_unknown_facts_are_dropped_and_long_texts_cut():
    f = parse_reply(reply(torch_error="x" * 5000, extra={"deep": [1, 2]}), b"", 0)
    assert "extra" not in f and f["torch_error"] == "x" * 2000 + "..."
    assert parse_reply(reply(gpus=None, interfaces=None, iface=None), b"", 0)["gpus"] is None


@pytest.mark.parametrize("line, words", [
    ('{"python": "3.11.7", "time": NaN}', "NaN is not a number"),
    ('{"python": "3.11.7", "time": Infinity}', "Infinity is not a number"),
    ('{"python": "3.11.7", "disk_free": 1' + "0" * 5000 + "}", "unreadable probe output"),
    ('{"python": ' + "[" * 100_000, "unreadable probe output"),
    ('{"setup_failed": ["x"]}', "setup_failed must be text"),
])
def test_odd_json_is_a_probe_error(line, words):
    with pytest.raises(ProbeError, match=words):
        parse_reply((MARK + line + "\n").encode(), b"", 0)
