"""Two runs of the same lock at once on the test bed: the environment is built once per node, the other
run waits for that build (and says so), then takes it complete; no half-built environment is ever used.

Both are `clusterddp env build`: the same survey, push and build as `up` runs before its job (an `up`
needs torch in the environment, which the heavy opt-in test_envs_torch_ssh.py covers).
"""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from envbed import complete, envs_of, inventory
from helpers import cddp, eventually

pytestmark = pytest.mark.integration


def _waiters(lockfile: Path) -> int:
    """How many processes wait (blocked) for the flock on ``lockfile`` (from /proc/locks)."""
    ino = os.stat(lockfile).st_ino
    n = 0
    for line in Path("/proc/locks").read_text().splitlines():
        parts = line.split()
        if "->" in parts and "FLOCK" in parts:
            dev = parts[parts.index("FLOCK") + 4]  # FLOCK ADVISORY WRITE <pid> <maj:min:inode>
            if dev.rsplit(":", 1)[-1] == str(ino):
                n += 1
    return n


def test_two_runs_of_one_lock_at_once_build_it_once_and_the_other_waits(bed, world, tmp_path):
    inv = inventory(bed, world, tmp_path, "cddptiny==1.0\n")
    checked = cddp("check", str(inv), env=world["env"], timeout=120).stdout  # exit 1: no torch in the env
    ids = set(re.findall(r"env  node\d environment ([0-9a-f]{24}) will be built", checked))
    assert len(ids) == 1, checked
    [eid] = ids
    # A build of it already going on each node (this test holds its lock), so both runs arrive while it is
    # built; once both wait, it is let go: one run builds on each node, the other waits for it.
    held = []
    for i in (0, 1):
        (envs_of(tmp_path, i) / ".locks").mkdir(parents=True, exist_ok=True)
        fd = os.open(envs_of(tmp_path, i) / ".locks" / eid, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        held.append(fd)
    argv = [sys.executable, "-m", "clusterddp", "env", "build", str(inv)]
    env = {**os.environ, **world["env"]}
    runs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for _ in range(2)]
    try:
        locks = [envs_of(tmp_path, i) / ".locks" / eid for i in (0, 1)]
        assert eventually(lambda: all(_waiters(f) == 2 for f in locks), timeout=180), \
            [_waiters(f) for f in locks]
        assert complete(tmp_path, 0) == [] and complete(tmp_path, 1) == []
        for fd in held:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        held = []
        outs = [r.communicate(timeout=240) for r in runs]
    finally:
        for fd in held:
            os.close(fd)
        for r in runs:
            if r.poll() is None:
                r.kill()
                r.wait()
    assert [r.returncode for r in runs] == [0, 0], outs
    python = {i: str(envs_of(tmp_path, i) / eid / "bin" / "python") for i in (0, 1)}
    for i, node in ((0, "node1"), (1, "node2")):
        built = [o for o, _ in outs if f"{node}: environment {eid} built: {python[i]}" in o]
        ready = [o for o, _ in outs if f"{node}: environment {eid} ready: {python[i]}" in o]
        assert len(built) == 1 and len(ready) == 1, outs  # built once; the other run took it as it was
        waited = [e for _, e in outs if f"{node}: waited " in e and f"another run building environment {eid}" in e]
        assert len(waited) == 2, outs  # both arrived while this test's "build" held the lock
        lines = [line for _, e in outs for line in e.splitlines() if f"] {node}: waited " in line]
        assert sorted(line.rsplit("then ", 1)[1] for line in lines) == ["built it", "found it ready"], outs
        assert complete(tmp_path, i) == [eid]
        assert not [p for p in envs_of(tmp_path, i).iterdir() if p.name.startswith(".tmp-")]
        got = subprocess.run([python[i], "-c", "import cddptiny; print(cddptiny.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()
        assert got == "1.0"
