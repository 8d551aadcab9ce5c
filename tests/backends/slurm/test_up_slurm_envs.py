"""`packages:` on a `slurm:` inventory, on the real Slurm test bed (tests/slurmbed.py): the job's environment
built by its first srun step on the compute nodes from the shared wheel store, once in the shared folder.

The lock is a tiny pure-Python wheel built here (tests/envs/tinywheel.py), with a ``.pth`` that puts the
nodes' base Python's site-packages (its torch) on the environment's path: torchrun runs from the
environment's python without a gigabyte of torch built into it, which the SSH bed's torch test does."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers import cddp, job_script, record, run_id_of
from test_up_slurm import slurm_inv
from tinywheel import make_wheel

pytestmark = pytest.mark.integration

JOB = """import os, sys
import cddptiny
print(f"rank {os.environ['RANK']} prefix {sys.prefix} cddptiny {cddptiny.__version__}", flush=True)
"""


def _wheel_with_base_torch(folder: Path) -> None:
    """cddptiny 1.0, whose wheel also holds ``cddp_base.pth``: the base Python's site-packages (torch)."""
    wheel = make_wheel(folder, version="1.0")
    torch = importlib.util.find_spec("torch")
    assert torch is not None and torch.origin is not None
    site = os.path.dirname(os.path.dirname(torch.origin))
    rebuilt = folder / "rebuilt.zip"
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(rebuilt, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename.endswith("/RECORD"):
                data += b"cddp_base.pth,,\n"
            dst.writestr(item, data)
        dst.writestr("cddp_base.pth", site + "\n")
    rebuilt.replace(wheel)


def _logs(shared: Path, run_id: str) -> str:
    return "".join(p.read_text(errors="replace")
                   for p in sorted((shared / "runs" / run_id / ".clusterddp" / "nodes").glob("*/node.log")))


def test_the_jobs_environment_is_built_once_in_the_shared_folder_then_found_ready(slurm, tmp_path):
    _wheel_with_base_torch(tmp_path / "wheels")
    env = {**slurm.env(), "CLUSTERDDP_CACHE": str(tmp_path / "cache"),
           "PIP_FIND_LINKS": " ".join(x for x in (os.environ.get("PIP_FIND_LINKS", ""), str(tmp_path / "wheels")) if x)}
    (tmp_path / "requirements.txt").write_text("cddptiny==1.0\n")
    inv = slurm_inv(tmp_path, gpus_per_node=1, packages="requirements.txt")
    script = job_script(tmp_path, "job.py", JOB)
    runs, shared = tmp_path / "runs", tmp_path / "shared"

    # a lock that is not one, or that names a package with no wheel: refused before anything starts (exit 2)
    (tmp_path / "bad.txt").write_text("cddptiny==1.0\ntorch>=2\n")
    r = cddp("up", str(inv), str(script), "--packages", str(tmp_path / "bad.txt"), "--runs-dir", str(runs),
             env=env, check_rc=2)
    assert f"{tmp_path / 'bad.txt'}:2: 'torch>=2' is not pinned to one version" in r.stderr, r.stderr
    (tmp_path / "bad.txt").write_text("cddptiny==1.0\ncddp-no-such-package==9.9\n")
    r = cddp("up", str(inv), str(script), "--packages", str(tmp_path / "bad.txt"), "--runs-dir", str(runs),
             env=env, check_rc=2, timeout=120)
    assert "bad.txt:2: cddp-no-such-package" in r.stderr and "no wheel for Python" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not list(runs.glob("*/run.json")) and not (shared / "runs").exists()

    # the first run: the wheels sent to the shared store, the environment built by one node, the other waits
    r = cddp("up", str(inv), str(script), "--runs-dir", str(runs), env=env, check_rc=0, timeout=300)
    run_id = run_id_of(r.stdout)
    [eid] = [p.name for p in (shared / "envs").iterdir() if (p / ".clusterddp-env.json").is_file()]
    prefix = shared / "envs" / eid
    assert f"environment {eid} will be built in the shared folder by the job" in r.stderr, r.stderr
    assert f"environment {eid}: sent " in r.stderr
    for rank in (0, 1):
        assert f"rank {rank} prefix {prefix} cddptiny 1.0" in r.stdout, r.stdout
    logs = _logs(shared, run_id)
    assert "CDDP_ENV" not in logs  # the node program's answer to a launcher: a line a person reads instead
    assert logs.count(f"[clusterddp] environment {eid} built in ") == 1, logs
    assert logs.count(f"[clusterddp] environment {eid} ready") == 1, logs  # the other node: the same one, built once
    rec = record(runs, run_id)
    assert {n["settings"]["env_id"] for n in rec["nodes"]} == {eid}
    assert {n["settings"]["python"] for n in rec["nodes"]} == {str(prefix / "bin" / "python")}
    assert rec["slurm"]["node"]["env_id"] == eid and len(rec["slurm"]["node"]["lock_sha256"]) == 64
    stamp = (prefix / ".clusterddp-env.json").stat().st_mtime_ns

    # the second run: nothing sent, nothing built; one look on the login host, a ready answer on each node
    r = cddp("up", str(inv), str(script), "--runs-dir", str(runs), env=env, check_rc=0, timeout=300)
    second = run_id_of(r.stdout)
    assert f"environment {eid} ready in the shared folder" in r.stderr and "sent" not in r.stderr, r.stderr
    assert f"rank 1 prefix {prefix} cddptiny 1.0" in r.stdout
    logs = _logs(shared, second)
    assert logs.count(f"[clusterddp] environment {eid} ready") == 2 and " built in " not in logs, logs
    assert (prefix / ".clusterddp-env.json").stat().st_mtime_ns == stamp
    shown = cddp("status", second, "--runs-dir", str(runs), env=env, check_rc=0).stdout
    assert f"environment {eid} (lock sha256 " in shown and "on node-1, node-2" in shown, shown

    # check: the environment's id and state on the login host's row; the probe job runs its python
    rep = json.loads(cddp("check", str(inv), "--json", env=env, check_rc=0, timeout=180).stdout)
    found = {c["check"]: c for c in rep["hosts"][0]["checks"]}
    assert found["env"]["status"] == "ok" and found["env"]["value"] == f"{eid[:12]} ready", found
    assert found["env"]["note"] == f"environment {eid} ready in the shared folder"
    assert {c["check"]: c["status"] for c in rep["hosts"][1]["checks"]}["torch"] == "ok"

    # slurm.envs_dir (node-local): the staged node program builds from the shared store into a folder of the
    # node's own; a node whose Python is not the planned one refuses, naming what differs
    ctl = shared / "runs" / second / ".clusterddp"
    request = json.loads((ctl / "env.json").read_text())
    local = tmp_path / "node-local"
    request["root"] = str(local)
    out = subprocess.run([sys.executable, "-S", str(ctl / "envbuild.py"), "build", json.dumps(request), "say"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and f"[clusterddp] environment {eid} built in " in out.stdout, out.stdout + out.stderr
    got = subprocess.run([str(local / eid / "bin" / "python"), "-c", "import cddptiny, sys; print(sys.prefix)"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert got == str(local / eid) and not (local / "wheels").exists()  # the wheels read from the shared store
    request["facts"]["python"] = "3.0.1"
    out = subprocess.run([sys.executable, "-S", str(ctl / "envbuild.py"), "build", json.dumps(request), "say"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stdout
    assert f"environment {eid} not built: this node's Python is not the one" in out.stdout
    assert f"python {platform.python_version()} here, 3.0.1 planned" in out.stdout, out.stdout
