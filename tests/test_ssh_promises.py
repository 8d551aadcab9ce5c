"""README's SSH promises, each on real sshd hosts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from clusterddp import inventory
from clusterddp.errors import HostError
from clusterddp.transport import connect
from helpers import cddp, eventually

pytestmark = pytest.mark.integration

SSH_FIELDS = ("user", "port", "identity_file")


def inventory_without_ssh_fields(bed, path: Path, hosts: list[dict]) -> Path:
    """An inventory of `hosts` whose defaults leave user, port and identity_file to ssh_config."""
    doc = yaml.safe_load(bed.write_inventory(path).read_text())
    for k in SSH_FIELDS:
        del doc["defaults"][k]
    doc["hosts"] = hosts
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def empty_home(tmp_path: Path, ssh_config: str | None = None) -> Path:
    """A HOME with no keys (so nothing logs in by accident), and ~/.ssh/config if given."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    if ssh_config is not None:
        (home / ".ssh" / "config").write_text(ssh_config)
    return home


def no_agent_env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
    return {**env, "HOME": str(home), "OMP_NUM_THREADS": "1"}


def cli(*args: str, env: dict, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """The real CLI with exactly this environment (helpers.cddp can only add variables)."""
    return subprocess.run([*prefix, sys.executable, "-m", "clusterddp", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def host_key_line(bed, node) -> str:
    keytype, blob = (bed.root / node.name / "ssh_host_ed25519_key.pub").read_text().split()[:2]
    return f"{node.address} {keytype} {blob}"


def fingerprint(pub: Path) -> str:
    return subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True, check=True).stdout.split()[1]


def test_accept_new_records_unknown_host_keys_and_refuses_a_changed_one(bed, tmp_path):
    n1, n2 = bed.nodes
    known = tmp_path / "fresh" / "known_hosts"  # neither the file nor its folder exists yet
    inv = bed.write_inventory(tmp_path / "inv.yaml",
                              defaults_extra={"known_hosts": str(known), "host_key_policy": "accept-new"})
    r = cddp("exec", str(inv), "--", "hostname", check_rc=0, timeout=120)
    assert "[node1] node1" in r.stdout and "[node2] node2" in r.stdout
    # both keys recorded (in parallel), in OpenSSH's format, and they are the nodes' real keys
    assert sorted(known.read_text().splitlines()) == sorted([host_key_line(bed, n1), host_key_line(bed, n2)])
    recorded = known.read_text()
    cddp("exec", str(inv), "--", "true", check_rc=0, timeout=120)
    assert known.read_text() == recorded  # known now: checked, not appended again

    # node1's recorded key differs from the one it presents (node2's key under node1's address)
    stale = f"{n1.address} {host_key_line(bed, n2).split(' ', 1)[1]}\n"
    known.write_text(stale)
    r = cddp("exec", str(inv), "--", "hostname", check_rc=1, timeout=120)
    assert f"node1: host key for {n1.address} has CHANGED (refused)" in r.stderr, r.stderr
    assert "[node2] node2" in r.stdout and "Traceback" not in r.stderr
    # the changed key is neither replaced nor added beside the old one; unknown node2 still is recorded
    assert known.read_text() == stale + host_key_line(bed, n2) + "\n"
