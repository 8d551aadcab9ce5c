"""`packages:` environments on the test bed: real sshd nodes whose base Python (a bare venv made here) has
no torch and reaches no index; wheels fetched on this machine, sent, built by uv on each node.

The fast test uses a tiny wheel built here; the heavy one (``slow``) pushes the CPU torch wheel
(192 MB, about 750 MB installed per node) and runs a plain torch job in the environment.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import cddp, cddp_popen, eventually, job_script, record, run_id_of
from tinywheel import make_wheel

pytestmark = pytest.mark.integration

TORCH_LOCK = """\
# pip-compile --output-file=requirements.txt requirements.in
cddptiny==1.0
filelock==4.3.2
fsspec==2026.9.0
jinja2==3.1.6
markupsafe==3.0.4
mpmath==1.3.0
networkx==3.6.1
setuptools==84.2.1
sympy==1.14.0
torch==2.13.0
    # via -r requirements.in
typing-extensions==4.16.0
"""

JOB = r'''
import os, sys
import torch
import torch.distributed as dist
import cddptiny
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
if dist.get_rank() == 0:
    torch.save({"sum": t.item()}, "snapshot.pt")
dist.barrier()
print("sum", torch.load("snapshot.pt")["sum"], "python", sys.executable, "tiny", cddptiny.__version__, flush=True)
dist.destroy_process_group()
'''


@pytest.fixture(scope="module")
def world(bed, tmp_path_factory):
    """A bare base Python (no torch), the tiny wheels on a find-links folder, and a wheel cache shared by
    this module's tests (torch is copied into it once)."""
    root = tmp_path_factory.mktemp("envs")
    base = root / "base"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(base)], check=True)
    probe = subprocess.run([str(base / "bin" / "python"), "-c", "import torch"], capture_output=True)
    assert probe.returncode != 0, "the base Python must not have torch"
    wheels = root / "wheels"
    make_wheel(wheels, version="1.0")
    make_wheel(wheels, version="1.1")
    links = " ".join(x for x in (os.environ.get("PIP_FIND_LINKS", ""), str(wheels)) if x)
    env = {"PIP_FIND_LINKS": links, "CLUSTERDDP_CACHE": str(root / "cache")}
    return {"root": root, "python": str(base / "bin" / "python"), "env": env}


def inventory(bed, world, tmp_path: Path, lock: str, name: str = "requirements.txt") -> Path:
    """An inventory whose nodes build from ``lock`` (written beside it) in workdirs of their own."""
    (tmp_path / name).write_text(lock)
    inv = bed.write_inventory(tmp_path / "inv.yaml", defaults_extra={"python": world["python"], "packages": name})
    doc = yaml.safe_load(inv.read_text())
    for i, h in enumerate(doc["hosts"]):
        h["workdir"] = str(tmp_path / f"node{i}")
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    return inv


def envs_of(tmp_path: Path, i: int) -> Path:
    return tmp_path / f"node{i}" / "envs"


def complete(tmp_path: Path, i: int) -> list[str]:
    """The environments complete on node ``i`` (the nodes share this filesystem)."""
    root = envs_of(tmp_path, i)
    return sorted(p.name for p in root.iterdir() if (p / ".clusterddp-env.json").is_file()) if root.is_dir() else []


def test_env_build_sends_once_builds_once_and_a_changed_lock_builds_anew(bed, world, tmp_path):
    inv = inventory(bed, world, tmp_path, "cddptiny==1.0\n")
    r = cddp("env", "build", str(inv), env=world["env"], check_rc=0, timeout=240)
    assert "built on node1, node2" in r.stdout, r.stdout + r.stderr
    assert "will be built (16.8 MiB of wheels to send)" in r.stderr  # the tiny wheel and uv, to each node
    [first] = complete(tmp_path, 0)
    assert complete(tmp_path, 1) == [first]
    python = envs_of(tmp_path, 0) / first / "bin" / "python"
    out = subprocess.run([str(python), "-c", "import cddptiny, sys; print(cddptiny.__version__, sys.prefix)"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["1.0", str(envs_of(tmp_path, 0) / first)]
    stamp = (envs_of(tmp_path, 0) / first / ".clusterddp-env.json").stat().st_mtime_ns

    # the same lock again: one look per node, nothing sent, nothing built
    r = cddp("env", "build", str(inv), env=world["env"], check_rc=0, timeout=120)
    assert f"environment {first}: ready on 2 node(s); nothing sent" in r.stdout, r.stdout + r.stderr
    assert "will be built" not in r.stderr
    assert (envs_of(tmp_path, 0) / first / ".clusterddp-env.json").stat().st_mtime_ns == stamp

    # a changed lock: a new environment; only its new wheel is sent (uv is in each node's store already)
    new_wheel = world["root"] / "wheels" / "cddptiny-1.1-py3-none-any.whl"
    r = cddp("env", "build", str(inv), "--packages", str(tmp_path / "v11.txt"), env=world["env"], check_rc=2)
    assert "v11.txt: cannot be read" in r.stderr
    (tmp_path / "v11.txt").write_text("cddptiny==1.1\n")
    r = cddp("env", "build", str(inv), "--packages", str(tmp_path / "v11.txt"), env=world["env"], check_rc=0,
             timeout=120)
    assert len(complete(tmp_path, 0)) == 2 and first in complete(tmp_path, 0)
    assert f"(sent {new_wheel.stat().st_size} bytes)" in r.stdout, r.stdout

    listed = cddp("env", "list", str(inv), check_rc=0, timeout=60).stdout
    assert listed.count("environments ") == 2 and first in listed, listed


def test_a_lock_that_is_not_one_or_names_no_wheel_is_refused_before_anything_starts(bed, world, tmp_path):
    script = job_script(tmp_path, "job.py", "print('never')\n")
    inv = inventory(bed, world, tmp_path, "cddptiny==1.0\ntorch>=2\n")
    runs = tmp_path / "runs"
    r = cddp("up", str(inv), str(script), "--runs-dir", str(runs), env=world["env"], check_rc=2)
    assert f"{tmp_path / 'requirements.txt'}:2: 'torch>=2' is not pinned to one version" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not runs.exists()

    (tmp_path / "requirements.txt").write_text("cddptiny==1.0\ncddp-no-such-package==9.9\n")
    r = cddp("up", str(inv), str(script), "--runs-dir", str(runs), env=world["env"], check_rc=2, timeout=120)
    assert "requirements.txt:2: cddp-no-such-package" in r.stderr and "no wheel for Python" in r.stderr, r.stderr
    assert "(node1, node2)" in r.stderr
    assert not runs.exists() or not list(runs.glob("*/run.json"))  # no run recorded, nothing started
    assert complete(tmp_path, 0) == [] and complete(tmp_path, 1) == []


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


@pytest.mark.slow
def test_torch_environment_runs_the_job_again_without_installing_and_survives_a_killed_build(bed, world, tmp_path):
    script = job_script(tmp_path, "job.py", JOB)
    inv = inventory(bed, world, tmp_path, TORCH_LOCK)
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

    # the same lock again: nothing sent, nothing installed
    r = cddp(*args, env=world["env"], check_rc=0, timeout=300)
    assert f"environment {eid}: ready on 2 node(s); nothing sent" in r.stderr, r.stderr
    status = cddp("status", run_id_of(r.stdout), "--runs-dir", str(runs), check_rc=0).stdout
    assert eid in status, status
    listed = json.loads(cddp("runs", "--runs-dir", str(runs), "--json", check_rc=0).stdout)
    assert eid in json.dumps(listed[0])
