"""`packages:` environments on the test bed: real sshd nodes whose base Python (a bare venv made here) has
no torch and reaches no index; wheels fetched on this machine, sent, built by uv on each node.

These use a tiny wheel built here; test_envs_torch_ssh.py (opt-in, heavy) pushes the CPU torch wheel and
runs a plain torch job in the environment.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from envbed import complete, envs_of, inventory
from helpers import cddp, job_script

pytestmark = pytest.mark.integration


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

    checked = cddp("check", str(inv), env=world["env"], timeout=120).stdout  # exit 1: no torch in these envs
    assert f"env  node1 environment {first} ready" in checked and f"env  node2 environment {first} ready" in checked
    (tmp_path / "requirements.txt").write_text("cddptiny==1.1\n# changed\n")
    checked = cddp("check", str(inv), env=world["env"], timeout=120).stdout
    assert "env  node1 environment " in checked and "will be built (0 B of wheels to send)" in checked, checked

    listed = cddp("env", "list", str(inv), check_rc=0, timeout=60).stdout
    assert listed.count("environments ") == 2 and first in listed, listed

    # prune: no run recorded either environment and the lock now gives a third; one a process runs from stays
    [second] = [e for e in complete(tmp_path, 0) if e != first]
    busy = subprocess.Popen([str(python), "-c", "import time; time.sleep(300)"])
    try:
        runs = ["--runs-dir", str(tmp_path / "runs")]
        r = cddp("env", "prune", str(inv), *runs, "--dry-run", env=world["env"], check_rc=0, timeout=120)
        assert f"node1: would remove environment {second}" in r.stdout and complete(tmp_path, 0) == sorted(
            [first, second]), r.stdout
        r = cddp("env", "prune", str(inv), *runs, env=world["env"], check_rc=0, timeout=120)
        assert f"node1: kept environment {first} (in use)" in r.stdout, r.stdout
        assert f"node1: removed environment {second}" in r.stdout and f"node2: removed environment {first}" in r.stdout
        assert complete(tmp_path, 0) == [first] and complete(tmp_path, 1) == []
    finally:
        busy.kill()
        busy.wait()
    r = cddp("env", "prune", str(inv), *runs, env=world["env"], check_rc=0, timeout=120)
    assert f"node1: removed environment {first}" in r.stdout and complete(tmp_path, 0) == []
    assert not [p for p in envs_of(tmp_path, 0).iterdir() if p.name.startswith(".tmp-")]
    # and the wheel store: the 1.0 wheel no environment left was built from goes; the lock's now (1.1) and uv stay
    assert "node1: removed 1 wheel(s) from the wheel store" in r.stdout and "cddptiny-1.0-py3" in r.stdout, r.stdout
    held = sorted(p.name for p in (envs_of(tmp_path, 0) / "wheels").glob("*/*.whl"))
    assert len(held) == 2 and held[0] == new_wheel.name and held[1].startswith("uv-"), held


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
    r = cddp("check", str(inv), env=world["env"], check_rc=2, timeout=120)
    assert "requirements.txt:2: cddp-no-such-package" in r.stderr, r.stderr
    for host in ("node1", "node2"):  # each host said, nothing built or sent
        assert f"env  {host} environment " in r.stdout and " cannot be built: " in r.stdout, r.stdout
    assert complete(tmp_path, 0) == [] and not (envs_of(tmp_path, 0) / "wheels").exists()


def test_nodes_that_reach_an_index_install_from_it_and_this_machine_sends_no_wheel(bed, world, tmp_path):
    """`packages: {wheels: index}`: each node installs from the index it reaches (here one served on the bed's
    bridge), its uv too; the launcher fetches and sends nothing, and the URL's credentials are never said."""
    import yaml

    from clusterddp.envs import wheels as wheels_module
    from clusterddp.node.envbuild import platform_tag
    from envbed import Served, simple_index
    cache = tmp_path / "launcher-cache"  # this run's own: it must stay empty of wheels
    # the index's uv: the wheel the launcher would send (fetched once into the shared cache), served there instead
    target = wheels_module.Target("3", "cp3", platform_tag())
    shared = Path(world["env"]["CLUSTERDDP_CACHE"])
    uv = wheels_module.installer(target, shared)
    uv_path = uv.path(shared)
    index = simple_index(tmp_path / "index", [world["root"] / "wheels" / "cddptiny-1.0-py3-none-any.whl", uv_path])
    with Served(index, bed.gateway) as served:
        inv = inventory(bed, world, tmp_path, "cddptiny==1.0\n")
        doc = yaml.safe_load(inv.read_text())
        url = f"http://lab:s3cr%2Fet@{bed.gateway}:{served.port}/simple"
        doc["defaults"]["packages"] = {"file": "requirements.txt", "wheels": "index", "index_url": url}
        inv.write_text(yaml.safe_dump(doc, sort_keys=False))
        env = {**world["env"], "CLUSTERDDP_CACHE": str(cache)}
        r = cddp("env", "build", str(inv), env=env, check_rc=0, timeout=240)
        assert "built on node1, node2; sent 0 B" in r.stdout, r.stdout + r.stderr
        assert r.stderr.count("will be built from the node's index (0 B of wheels to send)") == 2, r.stderr
        assert not (cache / "wheels").exists() or not list((cache / "wheels").iterdir())  # nothing fetched here
        [eid] = complete(tmp_path, 0)
        assert complete(tmp_path, 1) == [eid]
        python = envs_of(tmp_path, 1) / eid / "bin" / "python"
        out = subprocess.run([str(python), "-c", "import cddptiny; print(cddptiny.__version__)"],
                             capture_output=True, text=True, check=True).stdout
        assert out.strip() == "1.0"
        log = served.requests()
        assert log.count("GET /files/cddptiny-1.0-py3-none-any.whl") == 2 and log.count(f"GET /files/{uv.name}") == 2

        # a package the index lacks: that node's error, naming it; the credentials said nowhere
        (tmp_path / "requirements.txt").write_text("cddptiny==1.0\ncddp-not-there==1.0\n")
        bad = cddp("env", "build", str(inv), env=env, check_rc=1, timeout=240)
        assert "cddp-not-there" in bad.stderr and "not built" in bad.stderr, bad.stderr
        for said in (r.stdout, r.stderr, bad.stdout, bad.stderr):
            assert "s3cr" not in said and "lab:" not in said
        assert "GET /files/" + uv.name not in served.requests()[len(log):]  # the uv got once is used again
