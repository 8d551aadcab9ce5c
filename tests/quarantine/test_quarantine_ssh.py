"""A GPU error of the machine's kind sets its host aside, for real: 2 sshd hosts, real torchrun (gloo), a
plain torch script whose rank 1 puts a real NVIDIA Xid line in the kernel log (/dev/kmsg; the bed's
nodes share this machine's kernel) and dies. The node's diagnosis reads it back with dmesg; the run is
classified ``gpu`` with the line shown, the host quarantined for the inventory's ``quarantine:``, and
the next `up` refuses it. Parallel runs cannot take each other's lines: a line counts for a node only
while its job ran and when it names one of its ranks (or no process)."""

from __future__ import annotations

import json
import os

import pytest

from helpers import cddp, job_script, record, run_id_of

pytestmark = pytest.mark.integration

GPU_DIES = r'''
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
if dist.get_rank() == 1:
    with open("/dev/kmsg", "w") as k:  # one write per kernel line
        # another process's GPU on this machine (pid 1): not this run's
        k.write("<3>NVRM: Xid (PCI:0000:5e:00): 48, pid=1, name=init, An uncorrectable double bit error (DBE) "
                "has been detected on GPU in the framebuffer\n")
        k.flush()
        k.write(f"<3>NVRM: Xid (PCI:0000:3b:00): 79, pid={os.getpid()}, name=python, GPU has fallen off the bus.\n")
    print(f"rank 1 pid {os.getpid()}", flush=True)
    raise RuntimeError("CUDA error: unspecified launch failure")
dist.all_reduce(torch.ones(1))  # rank 0 waits here until rank 1's end breaks it
dist.destroy_process_group()
'''


@pytest.mark.skipif(not os.access("/dev/kmsg", os.W_OK), reason="writing the kernel log needs root")
def test_a_rank_dying_after_a_real_xid_line_is_a_gpu_failure_and_its_host_is_quarantined(bed, tmp_path):
    from clusterddp import policy
    from clusterddp.store import RunStore
    inv = bed.write_inventory(tmp_path / "inv.yaml", defaults_extra={"gpus": 1}, extra={"quarantine": "30m"})
    runs = tmp_path / "runs"
    r = cddp("up", str(inv), str(job_script(tmp_path, "gpu_dies.py", GPU_DIES)), "--runs-dir", str(runs), check_rc=1)
    run_id = run_id_of(r.stdout)
    pid = next(line.split()[-1] for line in (r.stdout + r.stderr).splitlines() if "rank 1 pid " in line)
    out = r.stdout + r.stderr
    head = "root cause: node2, rank 1 (local rank 0): GPU error: NVIDIA Xid 79 (GPU has fallen off the bus) on GPU " \
           "PCI:0000:3b:00"
    assert head in out, out
    assert f"NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, name=python, GPU has fallen off the bus." in out, out
    assert "then RuntimeError: CUDA error: unspecified launch failure" in out, out
    assert "Xid 48" not in out.split(head, 1)[1].split("\n", 3)[0]  # pid 1's line is not this run's
    f = record(runs, run_id)["failure"]
    assert (f["kind"], f["host"], f["rank"]) == ("gpu", "node2", 1), f
    # the decision, as the spare-host loop takes it
    d = policy.after_failure(RunStore(str(runs)).load(run_id))
    assert (d.carry_on, d.hosts) == (True, ("node2",)) and d.why.startswith("node2: GPU error: NVIDIA Xid 79"), d
    # set aside at once (no second failure needed), for the inventory's 30 minutes, and refused next time
    machine = f"node2 ({bed.nodes[1].address}:22)"
    assert f"quarantine: {machine} is set aside until " in r.stderr, r.stderr
    [e] = json.loads(cddp("quarantine", "list", "--json", check_rc=0).stdout)
    assert (e["host"], e["run_id"], e["until"] - e["since"]) == ("node2", run_id, 1800), e
    assert e["why"].startswith("GPU error: NVIDIA Xid 79 (GPU has fallen off the bus)") and run_id in e["why"]
    again = cddp("up", str(inv), str(tmp_path / "job" / "gpu_dies.py"), "--runs-dir", str(runs), "--dry-run",
                 check_rc=75)
    assert f"{machine} is quarantined until " in again.stderr and "Traceback" not in again.stderr, again.stderr
    assert "released node2" in cddp("quarantine", "release", "node2", check_rc=0).stdout
