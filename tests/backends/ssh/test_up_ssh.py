"""`clusterddp up` for real: 2 sshd hosts in network namespaces, real torchrun (gloo, CPU)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO, cddp, cddp_popen, eventually, job_pids, record, run_id_of, wait_for_line

pytestmark = pytest.mark.integration

HOSTILE = ["two words", "it's", '"dq"', "$(touch /tmp/cddp-pwned)", "a;b|c&d", "naïve ✓", "", "*", "\\n"]

PROBE = r'''
import json, os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
keys = ["MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "CLUSTERDDP_RUN_ID",
        "CDDP_TEST_INV", "CDDP_TEST_CLI", "WORLD_SIZE", "RANK"]
# one write per line: the ranks share stdout, and under python -u print() writes the newline apart
probe = {"argv": sys.argv[1:], "env": {k: os.environ.get(k) for k in keys}}
os.write(1, ("PROBE " + json.dumps(probe) + "\n").encode())
mode = os.environ.get("CDDP_TEST_MODE", "")
if mode == "crash":
    os.write(1, f"rank {dist.get_rank()} ready\n".encode())
    if dist.get_rank() == dist.get_world_size() - 1:
        time.sleep(2)
        os._exit(13)
    import torch
    dist.all_reduce(torch.ones(1))  # the others block here until the crash breaks the collective
elif mode == "hang":
    os.write(1, f"rank {dist.get_rank()} ready\n".encode())
    time.sleep(600)
dist.barrier()
dist.destroy_process_group()
'''


@pytest.fixture
def job(tmp_path):
    return script_folder(tmp_path)


def script_folder(tmp_path: Path) -> Path:
    """The probe script in a folder of its own, with a data file that travels with it and a .git
    folder that does not (SSH and Slurm runs alike)."""
    src = tmp_path / "job"
    src.mkdir()
    (src / "probe.py").write_text(PROBE)
    (src / "data.txt").write_text("copied with the script's folder\n")
    (src / ".git").mkdir()
    (src / ".git" / "big").write_text("never copied")
    return src


def inv(bed, tmp_path, **extra) -> Path:
    return bed.write_inventory(tmp_path / "inv.yaml", defaults_extra={"env": {"CDDP_TEST_INV": "inv $HOME 'q'"}},
                               extra=extra)


def probes(stdout: str) -> list[tuple[str, dict]]:
    out = []
    for line in stdout.splitlines():
        host, _, rest = line.partition("] ")
        if rest.startswith("PROBE "):
            out.append((host.strip("[ "), json.loads(rest[6:])))
    return out


def no_leftovers(bed, run_id):
    assert eventually(lambda: not job_pids(run_id), 15), f"processes of {run_id} remain: {job_pids(run_id)}"
    for node in bed.nodes:
        assert eventually(lambda node=node: not bed.ns_pids(node), 15), f"{node.name} still runs {bed.ns_pids(node)}"


def test_two_nodes_succeed_with_logs_and_checkpoints(bed, tmp_path):
    runs = tmp_path / "runs"
    shutil.copy(REPO / "examples" / "ddp_train.py", tmp_path / "ddp_train.py")
    r = cddp("up", str(inv(bed, tmp_path, collect=["checkpoints/**"])), str(tmp_path / "ddp_train.py"),
             "--runs-dir", str(runs), "--", "--epochs", "2", check_rc=0)
    run_id = run_id_of(r.stdout)
    assert "[node1] done world_size=4" in r.stdout  # 2 nodes x 2 processes, rank 0 on node1
    rec = record(runs, run_id)
    assert rec["status"] == "succeeded" and rec["exit_code"] == 0 and rec["failed_host"] is None
    assert [(n["host"], n["node_rank"], n["exit_code"], n["address"]) for n in rec["nodes"]] == [
        (bed.nodes[0].name, 0, 0, bed.nodes[0].address), (bed.nodes[1].name, 1, 0, bed.nodes[1].address)]
    ckpts = sorted(p.name for p in (runs / run_id / "artifacts" / "node1" / "checkpoints").glob("step-*.pt"))
    assert ckpts, "rank 0's checkpoints were not brought back"
    for node in bed.nodes:
        log = (runs / run_id / "logs" / f"{node.name}.log").read_text()
        assert f"node {rec['nodes'][int(node.name[-1]) - 1]['node_rank']}/2 on {node.name} iface=eth0" in log
    assert "done world_size=4" in (runs / run_id / "logs" / "node1.log").read_text()
    no_leftovers(bed, run_id)


# `up` run in-process (python -c) with every command the SSH transport streams watched: what goes to the
# nodes is the real thing. Counted: the collect node program's runs (the end of a run's fetch, and the
# checkpoint mirror's look, which asks for a file list only), and those that asked for a node's log.
# A finished `up` ends with os._exit.
WATCHED_UP = r"""
import json, os, sys
import clusterddp.transport.ssh as S
sent, collects = [], []
stream = S.SSHTransport.stream
def counted(self, command, *a, **kw):
    request = json.loads(kw.get("stdin") or b"{}") if "``collect``: the node program" in command else None
    if request is not None and not request.get("list"):
        collects.append(request)
    if request is not None and request.get("log"):
        sent.append(command)
    return stream(self, command, *a, **kw)
S.SSHTransport.stream = counted
_exit = os._exit
def told(code):
    sys.__stderr__.write("COLLECTS %d\n" % len(collects))
    sys.__stderr__.write("LOG FETCHES %d\n" % len(sent))
    sys.__stderr__.flush()
    _exit(code)
os._exit = told
sys.argv = ["clusterddp"] + sys.argv[1:]
from clusterddp.cli.app import main
main()
"""


def test_a_run_without_globs_ends_with_no_collect_and_the_nodes_logs_byte_for_byte(bed, tmp_path, job):
    # The followers sent each node's log whole (size and sha256 told with the exit code), so the end of
    # a run fetches no log again, and the local logs are the nodes' own, byte for byte. Each node is asked
    # once (its samplers' files, and its globs if any: one collect command a node, the end of the run's
    # only one). A plain torch script (no helper).
    runs = tmp_path / "runs"
    for extra, fetches in (((), 0), (("--collect", "data.txt"), 0)):
        r = subprocess.run([sys.executable, "-c", WATCHED_UP, "up", str(inv(bed, tmp_path)), str(job / "probe.py"),
                            "--runs-dir", str(runs), *extra], capture_output=True, text=True, timeout=240,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"LOG FETCHES {fetches}" in r.stderr.splitlines() and "COLLECTS 2" in r.stderr.splitlines(), r.stderr
        rec = record(runs, run_id_of(r.stdout))
        # the metrics sampler's files came in those commands (the rank sampler's too, where the run lasted a sample)
        assert sorted(p.name for p in (runs / rec["run_id"] / "metrics").iterdir()) == ["node1", "node2"]
        for n in rec["nodes"]:
            node_log = (Path(n["control_dir"]) / "node.log").read_bytes()
            assert b"PROBE " in node_log
            assert (runs / rec["run_id"] / "logs" / f"{n['host']}.log").read_bytes() == node_log, n["host"]
        got = sorted(p.relative_to(runs / rec["run_id"] / "artifacts").as_posix()
                     for p in (runs / rec["run_id"] / "artifacts").rglob("*") if p.is_file())
        assert got == ([] if not extra else ["node1/data.txt", "node2/data.txt"])
        no_leftovers(bed, rec["run_id"])


def test_arguments_and_env_arrive_byte_for_byte_and_a_master_not_listed_first_hosts_node_rank_0(
        bed, tmp_path, job):
    runs = tmp_path / "runs"
    # the master is node2, listed second: one run for both promises (each run costs both CI cores seconds)
    lead = bed.nodes[1]
    r = cddp("up", str(inv(bed, tmp_path, master={"host": lead.name})), str(job / "probe.py"), "--runs-dir", str(runs),
             "-e", "CDDP_TEST_CLI=cli $(x) `y` \"z\" ü", "--", *HOSTILE, check_rc=0)
    run_id = run_id_of(r.stdout)
    seen = probes(r.stdout)
    assert len(seen) == 4, r.stdout
    for _host, p in seen:
        assert p["argv"] == HOSTILE
        e = p["env"]
        assert e["CDDP_TEST_INV"] == "inv $HOME 'q'" and e["CDDP_TEST_CLI"] == "cli $(x) `y` \"z\" ü"
        assert e["CLUSTERDDP_RUN_ID"] == run_id and e["MASTER_ADDR"] == lead.address and e["WORLD_SIZE"] == "4"
        # the routed interface, found on each node: without it gloo advertises 127.0.0.1 here
        assert e["GLOO_SOCKET_IFNAME"] == e["NCCL_SOCKET_IFNAME"] == "eth0"
    # torchrun's static rendezvous serves its store from node rank 0 at the master address: the
    # master must be node 0 wherever the inventory lists it, or the others wait on a port nobody opened
    assert {p["env"]["RANK"] for h, p in seen if h == lead.name} == {"0", "1"}, r.stdout
    assert not Path("/tmp/cddp-pwned").exists()
    remote = Path(bed.nodes[1].workdir) / "runs" / run_id
    assert (remote / "data.txt").read_text() == "copied with the script's folder\n"
    assert not (remote / ".git").exists()


def test_one_rank_crashing_ends_the_whole_job(bed, tmp_path, job):
    runs = tmp_path / "runs"
    t0 = time.monotonic()
    # one process per node (--gpus 1): the crashing last rank is node2's either way
    r = cddp("up", str(inv(bed, tmp_path)), str(job / "probe.py"), "--runs-dir", str(runs), "--gpus", "1",
             "-e", "CDDP_TEST_MODE=crash", check_rc=1)
    took = time.monotonic() - t0
    run_id = run_id_of(r.stdout)
    rec = record(runs, run_id)
    assert rec["status"] == "failed" and rec["failed_host"] == "node2", rec
    assert "node2" in r.stderr and "failed first" in r.stderr
    assert took < 90, f"a crash took {took:.0f}s to end the job"
    assert (runs / run_id / "logs" / "node2.log").stat().st_size > 0
    no_leftovers(bed, run_id)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_ctrl_c_or_sigterm_ends_every_node_then_exits_130(bed, tmp_path, job, sig):
    runs = tmp_path / "runs"
    # one process per node (--gpus 1): what must end is each node's part, however many ranks it has
    p = cddp_popen("up", str(inv(bed, tmp_path)), str(job / "probe.py"), "--runs-dir", str(runs), "--gpus", "1",
                   "-e", "CDDP_TEST_MODE=hang")
    try:
        lines = wait_for_line(p, "[node2] rank 1 ready")
        run_id = run_id_of(lines[0])
        assert job_pids(run_id), "the job should be running now"
        p.send_signal(sig)
        rest = p.communicate(timeout=60)[0]
        assert p.returncode == 130, "".join(lines) + rest
    finally:
        p.kill()
    assert not job_pids(run_id), "up exited before the job had ended on every node"
    assert "interrupted" in rest
    rec = record(runs, run_id)
    assert rec["status"] == "stopped" and rec["exit_code"] == 130, rec
    no_leftovers(bed, run_id)


def test_unknown_host_key_is_refused_by_name(bed, tmp_path, job):
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    path = bed.write_inventory(tmp_path / "inv.yaml", defaults_extra={"known_hosts": str(empty)})
    r = cddp("up", str(path), str(job / "probe.py"), "--runs-dir", str(tmp_path / "runs"), check_rc=1)
    assert "node1: host key of" in r.stderr and "unknown" in r.stderr and "Traceback" not in r.stderr
    assert empty.read_text() == ""  # strict never writes known_hosts


def test_a_rank_dying_once_restarts_and_resumes_from_its_checkpoint(bed, tmp_path):
    runs = tmp_path / "runs"
    shutil.copy(REPO / "examples" / "ddp_train.py", tmp_path / "ddp_train.py")
    r = cddp("up", str(inv(bed, tmp_path)), str(tmp_path / "ddp_train.py"), "--runs-dir", str(runs),
             "--max-restarts", "1", "--gpus", "1", "--", "--epochs", "2", "--crash-at-epoch", "1",
             "--crash-rank", "1", timeout=300)
    # one process per node (--gpus 1): rank 1, node2's, crashes; rank 0's checkpoint is on node1
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "[node2] rank 1: simulated crash at epoch 1" in r.stdout
    assert "[node1] resumed from step" in r.stdout and "[node1] done world_size=2" in r.stdout
    no_leftovers(bed, run_id_of(r.stdout))
