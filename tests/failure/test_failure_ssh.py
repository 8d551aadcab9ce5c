"""Why a run failed, for real: 2 sshd hosts x 2 torchrun processes (gloo, CPU), a rank that raises,
a rank SIGKILLed, a node cut off from the master's port; the summary of `up` and `status`, run.json,
`runs --json`, and the GPU forensics with a fake nvidia-smi/dmesg on the nodes' PATH."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from helpers import cddp, eventually, record, run_id_of

pytestmark = pytest.mark.integration

JOB = r'''
import os, signal, sys
import torch, torch.distributed as dist
import clusterddp.train as ct

ctx = ct.init()
dist.barrier()


def explode(step):
    raise ValueError("boom at step %d \x1b[31mred" % step)


if ctx.rank == 3:
    print("rank 3 fails now", flush=True)
    if os.environ["CDDP_FAIL"] == "raise":
        # torch's own flight recorder dump, where launch.sh points NCCL's (gloo never writes it itself)
        from torch._C._distributed_c10d import _dump_fr_trace
        with open(os.environ["TORCH_FR_DUMP_TEMP_FILE"] + "3", "wb") as f:
            f.write(_dump_fr_trace())
        explode(7)
    os.kill(os.getpid(), signal.SIGKILL)
dist.all_reduce(torch.ones(1))  # the other ranks wait here until rank 3's end breaks the collective
dist.barrier()
'''

# nvidia-smi and dmesg as a GPU node would show them, for the forensics (there is no GPU here).
FAKE_SMI = "#!/bin/sh\necho 'NVIDIA-SMI 550.54  Driver Version: 550.54  GPU 0: H100 80GB'\n"
FAKE_DMESG = ("#!/bin/sh\necho '[  12.5] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.'\n"
              "echo '[  13.0] eth0: link up'\n")


def job(tmp_path):
    src = tmp_path / "job"
    src.mkdir()
    (src / "fail.py").write_text(JOB)
    return src / "fail.py"


def fake_tools(tmp_path):
    fake = tmp_path / "fakebin"
    fake.mkdir()
    for name, text in (("nvidia-smi", FAKE_SMI), ("dmesg", FAKE_DMESG)):
        (fake / name).write_text(text)
        (fake / name).chmod(0o755)
    return fake


def test_python_exception_on_rank_3_is_the_root_cause_in_up_status_run_json_and_runs(bed, tmp_path):
    fake = fake_tools(tmp_path)
    inventory = bed.write_inventory(tmp_path / "inv.yaml", defaults_extra={"setup": [f"export PATH={fake}:$PATH"]})
    runs = tmp_path / "runs"
    r = cddp("up", str(inventory), str(job(tmp_path)), "--runs-dir", str(runs), "-e", "CDDP_FAIL=raise", check_rc=1)
    run_id = run_id_of(r.stdout)
    # rank 3 is node2's second process; the type, message (its escape character shown escaped) and frame
    assert "root cause: node2, rank 3 (local rank 1): ValueError: boom at step 7 \\x1b[31mred" in r.stderr, r.stderr
    assert "in explode: raise ValueError(" in r.stderr
    assert "\x1b" not in r.stderr
    others = [line for line in r.stderr.splitlines() if line.startswith("  node1: ")]
    assert len(others) == 1, r.stderr  # the other node, in one line
    rec = record(runs, run_id)
    f = rec["failure"]
    assert (f["host"], f["kind"], f["rank"], f["local_rank"]) == ("node2", "exception", 3, 1)
    assert f["exc_type"] == "ValueError"
    assert f["message"] == "boom at step 7 \x1b[31mred"
    assert any("in explode" in fr for fr in f["frames"]) and any("fail.py" in fr for fr in f["frames"])
    assert [o["host"] for o in f["others"]] == ["node1"]
    # rank 3's flight recorder dump came back from node2's control folder, read; ranks 0-2 wrote none
    fl = f["flight"]
    assert [(e["host"], e["rank"], e["op"][:5]) for e in fl["ranks"]] == [("node2", 3, "gloo:")], fl
    assert "no dump from ranks 0-2" in " ".join(fl["notes"]), fl
    assert (runs / run_id / "flight" / "node2" / "rank3").stat().st_size > 0
    # the error file came back; the GPU forensics of each node (fake nvidia-smi on PATH)
    err_file = runs / run_id / "errors" / "node2" / "attempt_0" / "1" / "error.json"
    assert "boom at step 7" in json.loads(err_file.read_text())["message"]["message"]
    for node in ("node1", "node2"):
        assert "H100" in (runs / run_id / "forensics" / node / "nvidia-smi.txt").read_text()
        xid = (runs / run_id / "forensics" / node / "xid.txt").read_text()
        assert "Xid" in xid and "link up" not in xid
    # status of the failed run and runs --json say the same
    s = cddp("status", run_id, "--runs-dir", str(runs), check_rc=0)
    assert "root cause: node2, rank 3 (local rank 1): ValueError: boom at step 7 \\x1b[31mred" in s.stdout, s.stdout
    rows = json.loads(cddp("runs", "--json", "--runs-dir", str(runs), check_rc=0).stdout)
    assert rows[0]["failure"]["exc_type"] == "ValueError" and rows[0]["failure"]["rank"] == 3


# A plain script (no clusterddp.train, no @record: no error file), as most third-party code is: rank 3
# fails before its process group exists, so its traceback carries no [rank3]: prefix either, and every
# rank printed a traceback of its own before it.
PLAIN = r'''
import os
import traceback
import torch.distributed as dist

try:  # an optional dependency, its traceback printed and carried on from, as scripts do
    import apex_is_not_installed  # noqa: F401
except ImportError:
    traceback.print_exc()


def step(n):
    raise ValueError(f"boom on rank 3 at step {n}")


if os.environ["RANK"] == "3":
    print("rank 3 starts", flush=True)
    step(3)
dist.init_process_group("gloo")  # the others wait here until torchrun ends them
'''


def test_a_plain_scripts_unprefixed_exception_is_the_root_cause_not_torchruns_table(bed, tmp_path):
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "plain.py").write_text(PLAIN)
    inventory = bed.write_inventory(tmp_path / "inv.yaml")
    runs = tmp_path / "runs"
    r = cddp("up", str(inventory), str(tmp_path / "job" / "plain.py"), "--runs-dir", str(runs), check_rc=1)
    assert "root cause: node2, rank 3 (local rank 1): ValueError: boom on rank 3 at step 3" in r.stderr, r.stderr
    assert "in step: raise ValueError(" in r.stderr and "without a Python exception" not in r.stderr, r.stderr
    f = record(runs, run_id_of(r.stdout))["failure"]
    assert (f["host"], f["kind"], f["rank"], f["exc_type"]) == ("node2", "exception", 3, "ValueError"), f


def test_sigkilled_rank_is_reported_as_a_signal_by_status_of_a_detached_run(bed, tmp_path):
    inventory = bed.write_inventory(tmp_path / "inv.yaml")
    runs = tmp_path / "runs"
    r = cddp("up", str(inventory), str(job(tmp_path)), "--runs-dir", str(runs), "-e", "CDDP_FAIL=kill", "--detach",
             check_rc=0)
    run_id = run_id_of(r.stdout)
    seen = []

    def failed() -> bool:  # no supervisor: `status` finds the run failed, and works out why
        seen.append(cddp("status", run_id, "--runs-dir", str(runs)))
        return f"run {run_id}: failed" in seen[-1].stdout
    try:
        bed.wait_until_written(run_id, name="exit_code")  # both nodes ended: `status` knows at its first ask
        assert eventually(failed, 120, interval=1), seen[-1].stdout
        s = seen[-1]
        assert "root cause: node2, rank 3 (local rank 1): killed by SIGKILL" in s.stdout, s.stdout + s.stderr
        f = record(runs, run_id)["failure"]
        assert (f["kind"], f["signal"], f["rank"]) == ("signal", "SIGKILL", 3)
        assert f["log_tail"], "no Python exception: the failing node's last log lines are shown"
    finally:
        cddp("stop", run_id, "--runs-dir", str(runs), "--grace", "1")


def test_node_blocked_from_the_master_port_is_named_as_never_joined_within_the_bound(bed, tmp_path):
    port = 29511  # the bed's nodes have network namespaces of their own: no other test uses it there
    node2 = bed.nodes[1]
    rule = ["-p", "tcp", "-d", bed.nodes[0].address, "--dport", str(port), "-j", "DROP"]
    subprocess.run(["ip", "netns", "exec", node2.ns, "iptables", "-I", "OUTPUT", *rule], check=True)
    try:
        inventory = bed.write_inventory(tmp_path / "inv.yaml")
        started = time.monotonic()
        r = cddp("up", str(inventory), str(job(tmp_path)), "--runs-dir", str(tmp_path / "runs"), "-e",
                 "CDDP_FAIL=raise", "--master-port", str(port), "--join-timeout", "15", check_rc=1)
        took = time.monotonic() - started
    finally:
        subprocess.run(["ip", "netns", "exec", node2.ns, "iptables", "-D", "OUTPUT", *rule], check=True)
    want = (f"root cause: node2: never joined the rendezvous within 15s: cannot reach the master "
            f"{bed.nodes[0].address}:{port} from it (timed out)")
    assert want in r.stderr, r.stderr
    # 15 s + two connect attempts (3 s each) + start and teardown; without it torch waits 600 s
    assert took < 75, took
    f = record(tmp_path / "runs", run_id_of(r.stdout))["failure"]
    assert (f["host"], f["kind"]) == ("node2", "never_joined") and f["log_tail"]
