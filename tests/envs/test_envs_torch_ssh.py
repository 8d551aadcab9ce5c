"""The heavy `packages:` test on the bed: the CPU torch wheel (192 MB; about 750 MB installed per node) sent
to both nodes, built, a plain torch job run in the environment, a second run that installs nothing, and a
build cut short by SIGKILL that leaves nothing taken for complete.

It runs in CI: it is the one test of a real torch environment built on nodes that have none. On this
project's 2-core machine the whole test took 33 s at load 8 and 152 s at load 15;
CLUSTERDDP_TEST_TORCH_ENV=0 leaves it out (test_envs_ssh.py covers the same steps with a tiny wheel).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from envbed import TORCH_LOCK, Served, complete, envs_of, inventory, simple_index
from helpers import cddp, cddp_popen, eventually, job_script, record, run_id_of

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.skipif(
    os.environ.get("CLUSTERDDP_TEST_TORCH_ENV") == "0", reason="left out by CLUSTERDDP_TEST_TORCH_ENV=0")]

JOB = r'''
import os, sys
import torch
import torch.distributed as dist
import cddptiny
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
if int(os.environ["LOCAL_RANK"]) == 0:  # each node has a run folder of its own
    torch.save({"sum": t.item()}, "snapshot.pt")
dist.barrier()
print("sum", torch.load("snapshot.pt")["sum"], "python", sys.executable, "tiny", cddptiny.__version__, flush=True)
dist.destroy_process_group()
'''


def _kill_builders(root: Path) -> int:
    """SIGKILL every process whose command line names ``root`` (the node-side build and its uv)."""
    killed = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if str(root).encode() in cmd and b"envbuild" in cmd or (str(root).encode() + b"/.tmp-") in cmd:
            try:
                os.kill(int(pid), signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed




def _index_for_node2(world, tmp_path: Path, inv: Path) -> Served:
    """node2 in `wheels: index` mode: a simple index of the lock's wheels (and uv), fetched once here as a lab's
    mirror would hold them, served on the bed's bridge; node1 stays `push`."""
    import yaml

    from clusterddp.envs import lock as lock_module
    from clusterddp.envs import wheels as wheels_module
    from clusterddp.node.envbuild import platform_tag
    cache = Path(world["env"]["CLUSTERDDP_CACHE"])
    v = sys.version_info
    target = wheels_module.Target(f"{v[0]}.{v[1]}", f"cp{v[0]}{v[1]}", platform_tag())  # the bare venv's
    saved = os.environ.get("PIP_FIND_LINKS")
    os.environ["PIP_FIND_LINKS"] = world["env"]["PIP_FIND_LINKS"]
    try:
        wheels = wheels_module.fetch(lock_module.read(tmp_path / "requirements.txt"), target, cache)
        uv = wheels_module.installer(target, cache)
    finally:
        if saved is None:
            os.environ.pop("PIP_FIND_LINKS")
        else:
            os.environ["PIP_FIND_LINKS"] = saved
    served = Served(simple_index(tmp_path / "index", [w.path(cache) for w in (*wheels, uv)]), world["gateway"])
    doc = yaml.safe_load(inv.read_text())
    doc["hosts"][1]["packages"] = {"file": "requirements.txt", "wheels": "index",
                                   "index_url": f"http://{world['gateway']}:{served.port}/simple"}
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    return served


def test_torch_environment_runs_the_job_again_without_installing_and_survives_a_killed_build(bed, world, tmp_path):
    """node1 gets its wheels pushed; node2 installs from an index it reaches (`wheels: index`): nothing sent."""
    script = job_script(tmp_path, "job.py", JOB)
    inv = inventory(bed, world, tmp_path, TORCH_LOCK)
    with _index_for_node2({**world, "gateway": bed.gateway}, tmp_path, inv) as served:
        _torch_runs(inv, script, tmp_path, world, served)


def _torch_runs(inv: Path, script: Path, tmp_path: Path, world: dict, served: Served) -> None:
    runs = tmp_path / "runs"
    args = ("up", str(inv), str(script), "--runs-dir", str(runs), "--gpus", "1")

    # a build cut short (the launcher and the nodes' builders SIGKILLed): nothing is taken as complete
    p = cddp_popen(*args, env=world["env"])
    try:
        assert eventually(lambda: any(envs_of(tmp_path, i).is_dir() and any(
            x.name.startswith(".tmp-") for x in envs_of(tmp_path, i).iterdir()) for i in (0, 1)), timeout=240)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        for i in (0, 1):
            _kill_builders(envs_of(tmp_path, i))
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    for i in (0, 1):
        for x in envs_of(tmp_path, i).iterdir():
            if not x.name.startswith("."):
                assert x.name == "wheels" or (x / ".clusterddp-env.json").is_file(), x  # none half built

    r = cddp(*args, env=world["env"], check_rc=0, timeout=600)
    run = run_id_of(r.stdout)
    [eid] = complete(tmp_path, 0)
    assert complete(tmp_path, 1) == [eid]
    log = (runs / run / "logs" / "node1.log").read_text()
    assert "sum 3.0 python" in log and "tiny 1.0" in log and f"envs/{eid}/bin/python" in log, log
    rec = record(runs, run)
    for n in rec["nodes"]:
        assert n["settings"]["env_id"] == eid and n["settings"]["python"].endswith(f"envs/{eid}/bin/python")
        assert len(n["settings"]["lock_sha256"]) == 64
    assert f"environment {eid}" in r.stderr, r.stderr
    assert f"node2: environment {eid} will be built from the node's index (0 B of wheels to send)" in r.stderr
    assert "node1: environment" in r.stderr and "MiB of wheels to send" in r.stderr, r.stderr
    assert "GET /files/torch-" in served.requests()  # node2's torch came from the index

    # the same lock again: nothing sent, nothing installed
    r = cddp(*args, env=world["env"], check_rc=0, timeout=300)
    assert f"environment {eid}: ready on 2 node(s); nothing sent" in r.stderr, r.stderr
    status = cddp("status", run_id_of(r.stdout), "--runs-dir", str(runs), check_rc=0).stdout
    assert eid in status, status
    listed = json.loads(cddp("runs", "--runs-dir", str(runs), "--json", check_rc=0).stdout)
    assert eid in json.dumps(listed[0])
