"""One shared (1777) lease folder used by two real Unix users, each logging in over SSH with its own
key and a umask of 077: the lock files one creates must be usable by the other (they took the
creator's umask, and every other user's hold failed for good)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterddp import inventory, leases
from clusterddp import plan as ssh_plan
from clusterddp.fleet import Fleet
from clusterddp.runspec import RunSpec
from helpers import resolved
from testbed import session_slot

pytestmark = pytest.mark.integration


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=60)


@pytest.fixture
def second_user(bed) -> Iterator[tuple[str, Path]]:
    """A Unix user of its own (removed afterwards), with its own key, which the bed's sshds accept."""
    if shutil.which("useradd") is None or os.geteuid() != 0:
        pytest.skip("needs root and useradd")
    name = f"cddplease{session_slot()}"
    _run("userdel", "-r", "-f", name)  # a leftover of a killed session of this slot
    # "-p *": no password, but not locked either (sshd refuses a locked account's key)
    r = _run("useradd", "-m", "-s", "/bin/bash", "-p", "*", name)
    assert r.returncode == 0, r.stderr
    keys = Path(tempfile.mkdtemp(prefix="cddp-key-"))
    key = keys / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(key)], check=True)
    # sshd reads a user's authorized keys as that user, who cannot enter root's folder of the bed's
    # own file: the user's key goes in its home, named for it alone
    ssh_dir = Path(f"/home/{name}/.ssh")
    ssh_dir.mkdir(mode=0o700)
    (ssh_dir / "authorized_keys").write_text(key.with_suffix(".pub").read_text())
    shutil.chown(ssh_dir, name, name)
    shutil.chown(ssh_dir / "authorized_keys", name, name)
    node = bed.nodes[0]
    bed.restart_sshd(node, f"Match User {name}\n    AuthorizedKeysFile {ssh_dir}/authorized_keys\n")
    try:
        yield name, key
    finally:
        bed.restart_sshd(node)  # as it was
        _run("pkill", "-KILL", "-u", name)
        _run("userdel", "-r", "-f", name)
        shutil.rmtree(keys, ignore_errors=True)


def _inventory(bed, path: Path, lease_dir: Path, **defaults) -> inventory.Inventory:
    bed.write_inventory(path, hosts=[bed.nodes[0]], defaults_extra={
        "lease_dir": str(lease_dir), "setup": ["umask 077"], "gpus": 2, **defaults})
    return inventory.load(path)


def test_two_unix_users_with_umask_077_share_one_lease_folder(bed, second_user, tmp_path):
    name, key = second_user
    shared = Path(tempfile.mkdtemp(prefix="cddp-leases-", dir="/tmp"))  # outside root's 0700 pytest folder
    shared.chmod(0o1777)
    try:
        root_inv = _inventory(bed, tmp_path / "root.yaml", shared)
        # the other user's own python (root's venv is under /root, which they cannot enter)
        user_inv = _inventory(bed, tmp_path / "user.yaml", shared, user=name, identity_file=str(key),
                              python=shutil.which("python3", path="/usr/bin") or "/usr/bin/python3",
                              workdir=f"/home/{name}/clusterddp")
        root_plan = ssh_plan.build_plan(root_inv, resolved(RunSpec("t.py", gpus=1), root_inv), "run-root")
        user_plan = ssh_plan.build_plan(user_inv, resolved(RunSpec("t.py", gpus=1), user_inv), "run-user")
        with Fleet(root_inv.hosts) as rf, Fleet(user_inv.hosts) as uf:
            mine = leases.acquire(root_plan, rf, port_fixed=False, user="root@test")
            try:
                theirs = leases.acquire(user_plan, uf, port_fixed=False, user=f"{name}@test")
                try:
                    made = {p.name: stat.S_IMODE(p.stat().st_mode) for p in shared.iterdir()}
                    assert made[".mutex"] == 0o644 and made["slot-0.lock"] == 0o644, made
                    assert made["slot-1.lock"] == 0o644 and made[f"port-{mine.port}.lock"] == 0o644, made
                    assert mine.grants == {"node1": (0,)} and theirs.grants == {"node1": (1,)}
                    assert theirs.port is not None and theirs.port != mine.port
                    views = leases.list_views(uf, user_inv.hosts)  # each sees both
                    assert sorted(h.run for h in views["node1"].holders) == ["run-root", "run-user"]
                    assert views["node1"].garbled == 0
                finally:
                    theirs.release()
            finally:
                mine.release()
            # and the other way round: files the other user made serve root
            again = leases.acquire(root_plan, rf, port_fixed=False, user="root@test")
            again.release()
        owners = {p.name: p.stat().st_uid for p in shared.iterdir() if p.name.startswith("port-")}
        assert len(set(owners.values())) == 2, owners  # a port file of each user's
    finally:
        shutil.rmtree(shared, ignore_errors=True)
