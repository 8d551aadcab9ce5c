"""Errors that pointed the wrong way (issue 24, section 3): each one now names what is wrong and where.

A typo in identity_file names the file and the inventory field (not "check that the host is up");
a refused key names the key files offered; a script given where the inventory goes is said so;
an `up` option typed after `--` is warned about before anything starts.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import replace

import pytest
import yaml

from clusterddp import inventory
from clusterddp.errors import HostError, HostErrorKind, InventoryError
from clusterddp.transport import connect
from helpers import cddp

INV = "hosts:\n  - {name: gpu-01, address: gpu-01.invalid}\n  - {name: gpu-02, address: gpu-02.invalid}\n"
SCRIPT = "import torch\n\nif __name__ == '__main__':\n    print('hi')\n"


@pytest.fixture
def project(tmp_path):
    (tmp_path / "inv.yaml").write_text(INV)
    (tmp_path / "train.py").write_text(SCRIPT)
    return tmp_path


def test_swapped_inventory_and_script_are_named_with_the_command_the_right_way_round(project):
    r = cddp("up", "--name", "n1", "train.py", "inv.yaml", "--dry-run", "--", "--steps", "3", cwd=project, timeout=30)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    said, fix = r.stderr.splitlines()
    assert said == ("error: INVENTORY and SCRIPT are swapped: train.py is a Python script, inv.yaml is not; "
                    "the inventory comes first:")
    assert "YAML" not in r.stderr and not r.stdout  # no syntax error about a line of Python, no run id
    argv = shlex.split(fix)
    assert argv[3:] == ["up", "--name", "n1", "inv.yaml", "train.py", "--dry-run", "--", "--steps", "3"]
    ok = cddp(*argv[3:], cwd=project, check_rc=0, timeout=30)  # the printed command works as printed
    assert "train.py --steps 3" in ok.stdout
    # `local` is an inventory too; schedule add takes the same two arguments
    r = cddp("up", "train.py", "local", cwd=project, timeout=30)
    assert r.returncode == 2 and r.stderr.splitlines()[-1] == "  python -m clusterddp up local train.py", r.stderr
    r = cddp("schedule", "add", "n", "--cron", "@daily", "train.py", "inv.yaml", cwd=project, timeout=30)
    assert r.returncode == 2 and r.stderr.splitlines()[-1] == (
        "  python -m clusterddp schedule add n --cron @daily inv.yaml train.py"), r.stderr


def test_a_python_script_read_as_an_inventory_is_said_to_be_one(project):
    """Every command that reads an inventory: named .py, a `#!` python line, or Python lines in a file
    with neither (which read as YAML, or as a hostfile, failed on some line of the script)."""
    (project / "noext").write_text(SCRIPT)
    (project / "tool").write_text("#!/usr/bin/env python3\nprint('hi')\n")
    for name in ("train.py", "noext", "tool"):
        with pytest.raises(InventoryError) as e:
            inventory.load(project / name)
        assert str(e.value).splitlines()[0] == f"{project / name}: is a Python script, not an inventory", name
        assert "the inventory comes first, then the script" in str(e.value)
    r = cddp("check", "train.py", cwd=project, timeout=30)
    assert r.returncode == 2 and r.stderr.startswith("error: train.py: is a Python script, not an inventory\n"), r
    # not a false alarm: a YAML inventory's own mistakes are still reported as they are
    (project / "bad.yaml").write_text("hosts:\n  - {name: a, gpus: -1}\n")
    with pytest.raises(InventoryError, match=r"bad.yaml:2: hosts\[0\].gpus"):
        inventory.load(project / "bad.yaml")


def test_an_up_option_after_the_double_dash_is_warned_about_before_the_run_starts(project):
    r = cddp("up", "inv.yaml", "train.py", "--dry-run", "--", "--steps", "3", "--detach", cwd=project, timeout=30)
    assert r.returncode == 0, r.stderr  # a warning, not an error: a script may have a --detach of its own
    warning, fix = r.stderr.splitlines()
    assert warning == ("warning: --detach after `--` is passed to the script, though it is also an option of "
                       "`python -m clusterddp up`; if meant for `python -m clusterddp up`, put it before `--`:")
    assert shlex.split(fix)[3:] == ["up", "inv.yaml", "train.py", "--dry-run", "--detach", "--", "--steps", "3"]
    assert "train.py --steps 3 --detach" in r.stdout  # and the script still gets what it was given
    # options that take a value move with it; `--opt=value` and short options count; the script's own do not
    r = cddp("up", "inv.yaml", "train.py", "--dry-run", "--", "--gpus=1", "--steps", "3", "--name", "x", "-q",
             cwd=project, timeout=30)
    warning, fix = r.stderr.splitlines()
    assert warning.startswith("warning: --gpus, --name, -q after `--` are passed to the script, though they are "
                              "also options of"), warning
    assert shlex.split(fix)[3:] == ["up", "inv.yaml", "train.py", "--dry-run", "--gpus=1", "--name", "x", "-q",
                                    "--", "--steps", "3"]
    r = cddp("up", "inv.yaml", "train.py", "--dry-run", "--", "--steps", "3", "--detached", cwd=project, timeout=30)
    assert (r.returncode, r.stderr) == (0, ""), r.stderr


def key(tmp_path, name: str):
    path = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


@pytest.mark.integration
def test_key_file_mistakes_name_the_file_and_where_it_was_set(bed, tmp_path, monkeypatch):
    """On real sshd hosts: a typo in identity_file (in defaults, or in a host's entry) is named with its
    inventory field and no connection is tried; a refused key names every key file offered."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    typo = str(bed.identity_file) + "9"
    inv = tmp_path / "inv.yaml"
    doc = yaml.safe_load(bed.write_inventory(inv, defaults_extra={"identity_file": typo}).read_text())
    doc["hosts"][1]["identity_file"] = str(tmp_path / "id_nope")
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    lines = inv.read_text().splitlines()
    at_default = 1 + next(i for i, line in enumerate(lines) if line.strip().startswith("identity_file:"))
    at_host = 1 + next(i for i, line in enumerate(lines) if "id_nope" in line)
    n1, n2 = inventory.load(inv).hosts
    with pytest.raises(HostError) as e:
        connect(n1)
    assert e.value.kind is HostErrorKind.KEY_FILE
    assert str(e.value).splitlines()[0] == (f"{n1.name}: identity_file {typo} does not exist "
                                            f"(set in {inv}:{at_default}: defaults.identity_file)")
    assert "check that the host is up" not in str(e.value)
    with pytest.raises(HostError, match=re.escape(f"{tmp_path / 'id_nope'} does not exist "
                                                  f"(set in {inv}:{at_host}: hosts[1].identity_file)")):
        connect(n2)
    r = cddp("exec", str(inv), "--", "true", env={"HOME": str(home)}, timeout=60)  # what the user reads
    assert f"{n1.name}: identity_file {typo} does not exist (set in {inv}:{at_default}: defaults.identity_file)" \
        in r.stderr, r.stderr
    assert "cannot connect" not in r.stderr and "Traceback" not in r.stderr, r.stderr

    # A refused key: the inventory's, a default key paramiko finds by itself, and ssh_config's
    # IdentityFile that does not exist (skipped, as OpenSSH skips it) are all named.
    wrong, default = key(tmp_path, "id_wrong"), key(home / ".ssh", "id_ed25519")
    (home / ".ssh" / "config").write_text(f"Host *\n  IdentityFile {tmp_path / 'id_gone'}\n")
    h = replace(n1, identity_file=str(wrong), identity_from=f"{inv}:{at_default}: defaults.identity_file")
    with pytest.raises(HostError) as e:
        connect(h)
    assert e.value.kind is HostErrorKind.AUTH_REFUSED
    assert e.value.detail == (
        f"authentication failed for root@{n1.address}:22; tried {wrong} (identity_file, "
        f"{inv}:{at_default}: defaults.identity_file), {default} (paramiko's default); not tried: "
        f"{tmp_path / 'id_gone'} (IdentityFile in ssh_config; does not exist, skipped)")
    # the skipped IdentityFile does not stop a key that works
    t = connect(replace(n1, identity_file=str(bed.identity_file)))
    try:
        assert t.run("hostname").text == "node1\n"
    finally:
        t.close()


def test_the_loader_records_where_each_hosts_identity_file_was_set(tmp_path):
    """The field the transport's message names: the host's own entry, the defaults, a hostfile's line."""
    inv = tmp_path / "inv.yaml"
    inv.write_text("defaults:\n  identity_file: ~/.ssh/lab\nhosts:\n  - {name: a}\n"
                   "  - name: b\n    identity_file: ~/.ssh/b\n")
    a, b = inventory.load(inv).hosts
    assert a.identity_from == f"{inv}:2: defaults.identity_file"
    assert b.identity_from == f"{inv}:6: hosts[1].identity_file"
    inv.write_text("hosts:\n  - {name: a}\n")
    assert inventory.load(inv).hosts[0].identity_from is None
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# lab\na slots=1\nb slots=1 identity_file=~/.ssh/b\n")
    a, b = inventory.load(hostfile).hosts
    assert (a.identity_from, b.identity_from) == (None, f"{hostfile}:3: identity_file")
