"""README's SSH promises, each on real sshd hosts: host_key_policy, ssh_config, agent, keepalives."""

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
from clusterddp.errors import HostError, HostErrorKind
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


def test_proxycommand_carries_the_connection_with_the_inventorys_user_and_port(bed, tmp_path):
    """ProxyCommand `ssh -W` through node1: node2 sees node1, not this machine, as the client.

    ssh_config's own User and Port for that alias are wrong; the inventory's (root, 22) win, and
    they are what the command's %r and %p expand to, as with OpenSSH's -l and -p.
    """
    n1, n2 = bed.nodes
    proxy = tmp_path / "proxy"
    proxy.write_text(f'#!/bin/sh\necho "$1" >> {tmp_path}/proxy-user\n'
                     f"exec ssh -F /dev/null -i {bed.identity_file} -o BatchMode=yes -o StrictHostKeyChecking=yes "
                     f'-o UserKnownHostsFile={bed.known_hosts} -W "$2:$3" root@{n1.address}\n')
    proxy.chmod(0o755)
    home = empty_home(tmp_path, f"Host behind-node1\n  HostName {n2.address}\n  ProxyCommand {proxy} %r %h %p\n"
                                f"  User no-such-user\n  Port 2222\n")
    doc = yaml.safe_load(bed.write_inventory(tmp_path / "inv.yaml").read_text())
    doc["hosts"] = [{"name": "via-n1", "address": "behind-node1", "workdir": n2.workdir},
                    {"name": "direct", "address": n2.address, "workdir": n2.workdir}]
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = cddp("exec", str(inv), "--", "echo", "$(hostname)", "from=${SSH_CONNECTION%% *}", check_rc=0,
             timeout=120, env={"HOME": str(home)})
    assert f"[via-n1] node2 from={n1.address}\n" in r.stdout, r.stdout  # came out of node1, to port 22
    assert f"[direct] node2 from={bed.gateway}\n" in r.stdout, r.stdout  # the direct route, for contrast
    assert (tmp_path / "proxy-user").read_text() == "root\n"


def test_etc_ssh_config_is_read_after_the_users_config(bed, tmp_path):
    """/etc/ssh/ssh_config fills what ~/.ssh/config leaves unset; for a keyword in both, ~/.ssh/config wins.

    The CLI runs in a private mount namespace where the test's file is bind-mounted over
    /etc/ssh/ssh_config, so no other process on this machine sees it.
    """
    n1, n2 = bed.nodes
    etc_config = tmp_path / "etc_ssh_config"
    etc_config.write_text(f"Host sys-alias\n  HostName {n1.address}\n  User no-such-user\n"
                          f"  IdentityFile {bed.identity_file}\n")
    home = empty_home(tmp_path, f"Host sys-alias\n  HostName {n2.address}\n  User root\n")
    inv = inventory_without_ssh_fields(bed, tmp_path / "inv.yaml",
                                       [{"name": "sys", "address": "sys-alias", "workdir": n2.workdir}])
    real = Path("/etc/ssh/ssh_config").read_bytes()
    r = cli("exec", str(inv), "--", "echo", "$(hostname)", "$(id -un)", env=no_agent_env(home),
            prefix=("unshare", "--mount", "--propagation", "private", "sh", "-c",
                    'mount --bind "$0" /etc/ssh/ssh_config && exec "$@"', str(etc_config)))
    assert r.returncode == 0, r
    # HostName and User from ~/.ssh/config (first value wins); the only key that logs in, from /etc
    assert r.stdout == "[sys] node2 root\n", r
    assert Path("/etc/ssh/ssh_config").read_bytes() == real


def test_inventory_fields_override_ssh_config(bed, tmp_path, monkeypatch):
    """Host entry and defaults beat ssh_config's User, Port, IdentityFile, and its HostName for the name."""
    n1, n2 = bed.nodes
    wrong_key = tmp_path / "wrong_key"  # a key sshd does not accept
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong_key)], check=True)
    home = empty_home(tmp_path, f"Host gpu-*\n  HostName {n2.address}\nHost *\n  User no-such-user\n  Port 2222\n"
                                f"  IdentityFile {wrong_key}\n")
    doc = yaml.safe_load(bed.write_inventory(tmp_path / "inv.yaml").read_text())
    doc["hosts"] = [  # gpu-a takes user, port, key from defaults; gpu-b sets them in its own entry
        {"name": "gpu-a", "address": n1.address, "workdir": n1.workdir},
        {"name": "gpu-b", "address": n1.address, "workdir": n1.workdir,
         **{k: doc["defaults"][k] for k in SSH_FIELDS}},
    ]
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = cli("exec", str(inv), "--", "echo", "$(hostname)", "$(id -un)", "$SSH_CONNECTION", env=no_agent_env(home))
    assert r.returncode == 0, r
    log = (bed.root / n1.name / "sshd.log").read_text()
    fp = fingerprint(bed.identity_file.with_suffix(".pub"))
    for name in ("gpu-a", "gpu-b"):
        m = re.search(rf"^\[{name}\] node1 root {re.escape(bed.gateway)} (\d+) {re.escape(n1.address)} 22$",
                      r.stdout, re.M)
        assert m, r.stdout
        # the inventory's key was offered first and logged in; ssh_config's key was never tried
        conn = [line for line in log.splitlines() if f" port {m[1]} " in line]
        assert any(f"Accepted publickey for root from {bed.gateway} port {m[1]} ssh2: ED25519 {fp}" in line
                   for line in conn), conn
        assert not any("Failed" in line for line in conn), conn

    # Controls: ssh_config is read (so the overrides above meant something)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    h = inventory.load(inv).hosts[0]
    with pytest.raises(HostError, match=re.escape(f"cannot connect to no-such-user@{n2.address}:2222")) as e:
        connect(replace(h, address="gpu-c", user=None, port=None, identity_file=None))
    assert e.value.kind is HostErrorKind.UNREACHABLE
    with pytest.raises(HostError, match=re.escape(f"authentication failed for root@{n1.address}:22")) as e:
        connect(replace(h, identity_file=None))  # only ssh_config's (refused) key is left to offer
    assert e.value.kind is HostErrorKind.AUTH_REFUSED


@pytest.fixture
def agent(tmp_path):
    """A real ssh-agent in debug mode (it logs every signature it makes), with the bed's key loaded."""
    sock, log = tmp_path / "agent.sock", tmp_path / "agent.log"
    with open(log, "wb") as f:
        p = subprocess.Popen(["ssh-agent", "-d", "-a", str(sock)], stdout=f, stderr=f, stdin=subprocess.DEVNULL)
    try:
        assert eventually(sock.exists, 10), log.read_text()
        yield sock, log
    finally:
        p.kill()
        p.wait()


def test_agent_logs_in_but_is_never_forwarded(bed, tmp_path, agent):
    sock, agent_log = agent
    env = {**no_agent_env(empty_home(tmp_path)), "SSH_AUTH_SOCK": str(sock)}
    subprocess.run(["ssh-add", "-q", str(bed.identity_file)], env=env, check=True, capture_output=True)
    inv = inventory_without_ssh_fields(
        bed, tmp_path / "inv.yaml", [{"name": n.name, "address": n.address, "workdir": n.workdir} for n in bed.nodes])
    doc = yaml.safe_load(inv.read_text())
    doc["defaults"]["user"] = "root"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))

    r = cli("exec", str(inv), "--", "echo", "auth=${SSH_AUTH_SOCK:-none}", env=env)
    assert r.returncode == 0, r
    assert sorted(r.stdout.splitlines()) == ["[node1] auth=none", "[node2] auth=none"], r
    assert agent_log.read_text().count("process_sign_request2: good signature") == 2  # the agent signed both logins

    subprocess.run(["ssh-add", "-D"], env=env, check=True, capture_output=True)
    r = cli("exec", str(inv), "--", "true", env=env)
    assert r.returncode == 1 and f"no SSH key to log in to root@{bed.nodes[0].address}:22" in r.stderr, r


def data_segments_from_client(bed, node, client_port: int) -> int:
    """Data-carrying TCP segments node's sshd has received on the connection from client_port."""
    out = subprocess.run(["ip", "netns", "exec", node.ns, "ss", "-Htin", "state", "established",
                          f"( sport = :22 and dport = :{client_port} )"],
                         capture_output=True, text=True, check=True).stdout
    m = re.search(r"\bdata_segs_in:(\d+)", out)
    assert out.strip(), f"no connection from port {client_port} on {node.name}"
    return int(m[1]) if m else 0


def test_keepalive_sends_ssh_keepalives_and_zero_sends_none(bed, tmp_path):
    node = bed.nodes[0]
    conns = {}
    try:
        for k in (1, 0):
            inv = bed.write_inventory(tmp_path / f"ka{k}.yaml", hosts=[node], defaults_extra={"keepalive": k})
            conns[k] = connect(inventory.load(inv).hosts[0])
        ports = {k: t._transport.sock.getsockname()[1] for k, t in conns.items()}

        def segs(k: int) -> int:
            return data_segments_from_client(bed, node, ports[k])

        first = segs(1)
        assert eventually(lambda: segs(1) > first, 30)  # past the handshake's tail on both connections
        base = {k: segs(k) for k in conns}
        # Both connections sit idle: keepalive 1 sends one packet a second, keepalive 0 nothing at all.
        assert eventually(lambda: segs(1) >= base[1] + 3, 60), (segs(1), base)
        assert segs(0) == base[0]
        assert conns[0].run("echo alive").text == "alive\n" and conns[1].run("echo alive").text == "alive\n"
    finally:
        for t in conns.values():
            t.close()


def test_a_captured_command_holds_a_bounded_answer(bed, tmp_path):
    """Probes, status and teardown answers are captured: a node flooding one is cut off, not held."""
    from clusterddp.transport.ssh import MAX_RUN_OUTPUT
    t = connect(inventory.load(bed.write_inventory(tmp_path / "inv.yaml", hosts=[bed.nodes[0]])).hosts[0])
    try:
        for stream in ("", ">&2"):
            with pytest.raises(HostError, match=r"node1: sent more than 16 MiB on std(out|err) for one command"):
                t.run(f"head -c {MAX_RUN_OUTPUT + 1} /dev/zero {stream}; sleep 30", timeout=60)
        assert len(t.run(f"head -c {MAX_RUN_OUTPUT} /dev/zero").stdout) == MAX_RUN_OUTPUT  # the limit itself fits
        assert t.run("echo still usable").text == "still usable\n"
    finally:
        t.close()
