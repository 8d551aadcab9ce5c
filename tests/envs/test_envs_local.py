"""`up local --packages`: the same machinery on this machine (the local transport): the environment built
under this machine's cache, the job started with its python, recorded; a second run builds nothing.

The lock holds only the tiny wheel, so the job's torchrun is not found in that environment: the run fails,
and the way it fails shows the job ran with the environment's python (this test's own Python has torch).
"""

from __future__ import annotations

import json
import os
import re

import pytest

from helpers import cddp, job_script
from tinywheel import make_wheel

pytestmark = pytest.mark.integration


def test_up_local_builds_the_environment_here_and_runs_the_job_with_its_python(tmp_path):
    make_wheel(tmp_path / "wheels")
    links = " ".join(x for x in (os.environ.get("PIP_FIND_LINKS", ""), str(tmp_path / "wheels")) if x)
    env = {"PIP_FIND_LINKS": links, "CLUSTERDDP_CACHE": str(tmp_path / "cache")}
    (tmp_path / "req.txt").write_text("cddptiny==1.0\n")
    script = job_script(tmp_path, "job.py", "print('hi')\n")
    runs = tmp_path / "runs"
    r = cddp("up", "local", str(script), "--packages", str(tmp_path / "req.txt"), "--runs-dir", str(runs),
             cwd=tmp_path, env=env, timeout=240)
    m = re.search(r"\[clusterddp\] local: environment ([0-9a-f]{24}) will be built", r.stderr)
    assert m, r.stderr
    eid = m.group(1)
    assert f"environment {eid}: built on local; sent" in r.stderr
    root = tmp_path / "cache" / "envs"
    assert (root / eid / ".clusterddp-env.json").is_file() and not (tmp_path / "envs").exists()
    # torchrun started from the environment's python, which has cddptiny and not torch
    assert r.returncode == 1 and "No module named 'torch'" in r.stderr, r.stderr
    [rec] = runs.glob("*/run.json")
    settings = json.loads(rec.read_text())["nodes"][0]["settings"]
    assert settings["env_id"] == eid and settings["python"] == str(root / eid / "bin" / "python")

    r = cddp("up", "local", str(script), "--packages", str(tmp_path / "req.txt"), "--runs-dir", str(runs),
             cwd=tmp_path, env=env, timeout=240)
    assert f"environment {eid}: ready on 1 node(s); nothing sent" in r.stderr, r.stderr
    assert "will be built" not in r.stderr

