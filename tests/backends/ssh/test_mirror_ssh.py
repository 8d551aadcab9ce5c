"""The checkpoint mirror (issue 26, section 2) on the real bed: while an attached run goes on, rank 0's
checkpoints come back verified as they appear (a file still being written never does); rank 0's machine
then drops off the network, the run ends as it would anyway (no mirror warning), the launcher still holds
them, and :func:`clusterddp.mirror.seed` puts them on another node, where ``clusterddp.train.load_latest``
and a plain ``torch.load`` resume from them; once the machine is back, `collect` fetches only what the
mirror had not. Real sshd hosts, real torchrun (1 process on node1), no shared folder."""

from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from clusterddp import mirror, nodeops
from clusterddp.fleet import Fleet
from clusterddp.inventory import load as load_inventory
from clusterddp.store import RunStore
from helpers import cddp, cddp_popen, eventually, job_script, run_id_of

pytestmark = pytest.mark.integration

# Rank 0 saves two checkpoints the usual ways (clusterddp.train's save_checkpoint; a plain atomic
# torch.save + os.replace), then writes a third in place, a little at a time, until the test says go.
JOB = """
import os, sys, time
from pathlib import Path
import torch
import torch.distributed as dist
from clusterddp import train

ctx = train.init()
train.save_checkpoint({"w": torch.full((4096,), 5.0)}, step=5)
if ctx.is_main:
    tmp = Path("checkpoints/.ckpt-3.tmp")
    torch.save({"step": 3, "w": torch.arange(1000.0)}, tmp)
    os.replace(tmp, "checkpoints/ckpt-3.pt")
    print("saved", flush=True)
    with open("checkpoints/ckpt-7.pt", "wb") as f:  # never settled: it grows while the test looks
        while not Path("go").exists():
            f.write(b"x" * 100)
            f.flush()
            time.sleep(0.2)
train.cleanup(barrier=True)
"""


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_checkpoints_come_back_during_the_run_outlive_rank_0s_machine_and_seed_another_node(make_bed, tmp_path):
    bed = make_bed(2)
    script = job_script(tmp_path, "job.py", JOB)
    inventory = bed.write_inventory(tmp_path / "inv.yaml", defaults_extra={"connect_timeout": 3})
    runs = tmp_path / "runs"
    node1, node2 = bed.nodes
    p = cddp_popen("up", str(inventory), str(script), "--hosts", "node1", "--gpus", "1", "--runs-dir", str(runs),
                   "--collect", "checkpoints/*.pt", env={"CLUSTERDDP_MIRROR_INTERVAL": "1"})
    try:
        assert p.stdout is not None
        run_id = run_id_of(p.stdout.readline())
        there = Path(node1.workdir) / "runs" / run_id
        store = RunStore(runs)

        def held() -> dict:
            try:
                doc = json.loads(store.mirror_index_path(run_id).read_text())
            except (OSError, ValueError):
                return {}
            paths = {f["path"]: f["sha256"] for c in doc["checkpoints"] for f in c["files"]}
            return paths if {"checkpoints/step-5.pt", "checkpoints/ckpt-3.pt"} <= set(paths) else {}
        got = eventually(held, timeout=120, interval=0.5)
        assert got, f"no checkpoint mirrored in 120s: {store.mirror_index_path(run_id)}"
        assert p.poll() is None, "the run ended before its checkpoints came back"
        local = runs / run_id / "artifacts" / "node1" / "checkpoints"
        for name in ("step-5.pt", "ckpt-3.pt"):  # verified: the node's very bytes, and mirror.json says so
            assert sha(local / name) == sha(there / "checkpoints" / name) == got[f"checkpoints/{name}"]
        assert (there / "checkpoints" / "ckpt-7.pt").stat().st_size > 0
        assert not (local / "ckpt-7.pt").exists() and "checkpoints/ckpt-7.pt" not in got  # still being written
        assert not list(local.glob("*.part")) and not list(local.glob(".*"))

        # rank 0's machine goes: the run ends as any run that loses a node does; the mirror says nothing
        subprocess.run(["ip", "link", "set", node1.veth, "down"], check=True)
        out, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 1 and "node1 failed first" in out and "stopped answering" in out, out
    assert not [line for line in out.splitlines() if line.startswith("mirror:")], out
    assert sha(local / "step-5.pt") == got["checkpoints/step-5.pt"]

    # A new attempt's rank 0 on node2: same run, its own run folder there, nothing in it yet.
    rec = store.load(run_id)
    host2 = next(h for h in load_inventory(str(inventory)).hosts if h.name == "node2")
    run_dir2 = str(Path(node2.workdir) / "runs" / run_id)
    launch2 = replace(nodeops.nodes_of(rec)[0], host=host2, run_dir=run_dir2,
                      control_dir=f"{run_dir2}/.clusterddp/node2")
    with Fleet([host2]) as fleet:
        said = mirror.seed(fleet, launch2, store, run_id)
        assert said is not None and said.startswith("node2 seeded with the mirrored checkpoints "), said
        assert "checkpoints/ckpt-3.pt" in said and "checkpoints/step-5.pt" in said and "from node1" in said, said
        seeded = Path(run_dir2) / "checkpoints"
        assert sorted(f.name for f in seeded.iterdir()) == ["ckpt-3.pt", "step-5.pt"]  # no temp file left
        # on node2, as its job would: clusterddp.train.load_latest, and a plain torch.load
        res = fleet.transport(host2).run(
            f"cd {run_dir2} && {host2.python} -c 'import torch; from clusterddp import train; "
            "obj, step = train.load_latest(\"checkpoints\"); "
            "print(\"resumed\", step, float(obj[\"w\"][0]), torch.load(\"checkpoints/ckpt-3.pt\")[\"step\"])'",
            timeout=120)
    assert res.exit_code == 0, res.stderr.decode()
    assert res.text.strip().splitlines()[-1] == "resumed 5 5.0 3", res.text

    # node1 back: its job is stopped, and a collect fetches only what the mirror had not (ckpt-7.pt)
    subprocess.run(["ip", "link", "set", node1.veth, "up"], check=True)
    cddp("stop", run_id, "--runs-dir", str(runs), "--grace", "2", timeout=120)
    r = cddp("collect", run_id, "--runs-dir", str(runs), check_rc=0, timeout=120)
    assert "node1: 1 fetched" in r.stdout and "2 already whole" in r.stdout, r.stdout
