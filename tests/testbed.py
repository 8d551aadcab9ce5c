"""A throwaway "cluster" of SSH hosts on one Linux machine, for integration tests.

Each node is a network namespace wired to a host bridge, running its own sshd
in its own UTS namespace (so ``hostname`` says ``node<i>``).  The nodes share the
host's filesystem and process table; only the network and hostname differ.

Layout for ``TestBed(n, root, prefix="cd0s", subnet="10.100.0")``::

    host:   bridge cd0s-br  10.100.0.1/24
    node i: netns cd0s-n<i>, veth cd0s-v<i> (host side, on the bridge) <-> eth0
            address 10.100.0.<10+i>/24, default route via 10.100.0.1, sshd on :22

Several test sessions (or a test run and a benchmark) share one machine safely: each takes
its own slot with :func:`session_slot` and builds its prefixes and subnets from it, so no
session ever removes another one's namespaces.

Needs root, iproute2 (``ip``), OpenSSH server and client tools, util-linux
``unshare``; ``scripts/install-system-deps.sh`` installs them on Debian.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml

SSHD = "/usr/sbin/sshd"  # sshd re-executes itself, so it must be started by absolute path
SFTP_SERVER = "/usr/lib/openssh/sftp-server"  # scp (the collect benchmark's baseline) speaks SFTP
NETNS_ETC = Path("/etc/netns")  # `ip netns exec NS` bind-mounts /etc/netns/NS/* over /etc/*
SLOT_DIR = Path("/run/lock")  # slot locks live in tmpfs: a reboot frees them all
SLOTS = 50  # subnets 10.100.x .. 10.149.x

_slot: tuple[int, int] | None = None  # (slot, fd of its held lock) for this process


def session_slot() -> int:
    """This process's test-bed slot (0..SLOTS-1), taken on first call and held until it exits.

    A slot is an exclusive ``flock`` on a file, so the kernel frees it when the process dies:
    a killed session never leaves its slot taken. Beds use prefixes ``cd<slot>...`` and
    subnets ``10.<100+slot>.*``, and clean up only leftovers of their own prefix, which only
    a dead holder of the same slot can have left.
    """
    global _slot
    if _slot is None:
        SLOT_DIR.mkdir(parents=True, exist_ok=True)
        for k in range(SLOTS):
            fd = os.open(SLOT_DIR / f"clusterddp-testbed-{k}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            _slot = (k, fd)
            break
        else:
            raise RuntimeError(f"all {SLOTS} test-bed slots are taken ({SLOT_DIR}/clusterddp-testbed-*.lock)")
    return _slot[0]


@dataclass(frozen=True)
class Node:
    """One test host: a network namespace with its own address, hostname and sshd."""

    name: str  # "node1", ...; also its hostname, deliberately not resolvable
    address: str  # e.g. "10.77.0.11"
    ns: str  # network namespace name, e.g. "cddp-n1"
    veth: str  # host-side veth; `ip link set <veth> down` cuts the node off
    workdir: str  # per-node folder, since all nodes share one filesystem


def require_bed() -> None:
    """Skip the calling test when this machine cannot run a test bed (:func:`missing_requirements`);
    in CI fail it instead, since a skip there would hide a broken set-up."""
    import pytest

    from ci_skips import in_ci
    reason = missing_requirements()
    if reason:
        if in_ci():
            pytest.fail(f"test bed unavailable in CI: {reason}", pytrace=False)
        pytest.skip(f"test bed unavailable: {reason}")


def missing_requirements() -> str | None:
    """Why a TestBed cannot run here, or None if it can."""
    if os.geteuid() != 0:
        return "the test bed needs root (network namespaces, bridge, sshd)"
    missing = [t for t in ("ip", "ssh-keygen", "unshare") if shutil.which(t) is None]
    if not os.access(SSHD, os.X_OK):
        missing.append(SSHD)
    if missing:
        return f"missing {', '.join(missing)}; run scripts/install-system-deps.sh"
    return None


# What the nodes' login shells read as ~/.bashrc unless a test says otherwise (TestBed's login_rc): nothing.
# sshd runs every command through the user's shell, and Debian's bash reads ~/.bashrc for it; this machine's
# (pyenv init, virtualenv-init, cargo) costs 0.2 CPU-s and a dozen forks per SSH command, about 14 of them
# per `up` of 2 nodes, and ties the bed to whatever the machine's user keeps there. The nodes need none of
# it: inventories name the interpreter by absolute path (write_inventory), and sshd's default PATH has the
# system tools. A test about login shells passes its own (tests/node/test_node_reply.py: a banner).
LOGIN_RC = ""

PYENV_LOCK_STALE_S = 20.0  # a rehash takes well under a second, even on a loaded machine


def release_stale_pyenv_lock() -> bool:
    """Remove pyenv's rehash lock if a killed shell left it behind; True if it did.

    The nodes log in as this machine's user, whose ~/.bashrc may run ``pyenv init -``, and that
    runs ``pyenv rehash`` in every SSH command's shell. Killing a node's processes (a bed's
    stop, a test's teardown) can catch a shell inside rehash, which leaves
    ``$PYENV_ROOT/shims/.pyenv-shim``; every later shell then waits 60 s for it and commands
    time out. The lock is removed when no ``pyenv-rehash`` process is alive to own it, or when
    it is older than a rehash ever takes (the other shells waiting on it are rehash processes too).
    """
    lock = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "shims" / ".pyenv-shim"
    try:
        age = time.time() - lock.stat().st_mtime
    except OSError:
        return False
    if age > PYENV_LOCK_STALE_S:
        lock.unlink(missing_ok=True)
        return True
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if b"pyenv-rehash" in cmdline.read_bytes():
                return False
        except OSError:
            pass
    lock.unlink(missing_ok=True)
    return True


def _run(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run with check=True and an error that shows the command's stderr."""
    try:
        return subprocess.run(args, check=True, capture_output=True, text=True, **kwargs)
    except subprocess.CalledProcessError as e:
        raise RuntimeError(
            f"command failed (exit {e.returncode}): {' '.join(args)}\n{(e.stderr or '').strip()}"
        ) from None


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class TestBed:
    """n SSH nodes in network namespaces on one host; see the module docstring.

    Use as a context manager, or call start() and stop() yourself.  start()
    first removes leftovers of an earlier bed with the same prefix, so a bed
    that was never stopped (killed test run) does not block the next one.
    """

    __test__ = False  # not a pytest test class, despite the name

    SSHD_START_TIMEOUT = 20.0  # seconds for all sshds to accept TCP connections

    def __init__(self, n: int, root: Path, prefix: str, subnet: str, login_rc: str | None = LOGIN_RC) -> None:
        if not 1 <= n <= 200:
            raise ValueError(f"n must be between 1 and 200, got {n}")
        # Interface names are limited to 15 characters: "<prefix>-v<n>".
        if len(f"{prefix}-v{n}") > 15 or not re.fullmatch(r"[a-z][a-z0-9]*", prefix):
            raise ValueError(f"prefix must be short lowercase alphanumerics, got {prefix!r}")
        self.root = Path(root).resolve()
        if re.search(r"\s", str(self.root)):
            raise ValueError(f"root must not contain whitespace (sshd_config): {self.root}")
        self.prefix = prefix
        self.subnet = subnet
        self.bridge = f"{prefix}-br"
        self.gateway = f"{subnet}.1"
        self.identity_file = self.root / "id_ed25519"
        self.known_hosts = self.root / "known_hosts"
        self.authorized_keys = self.root / "authorized_keys"
        self.nodes: list[Node] = [
            Node(
                name=f"node{i}",
                address=f"{subnet}.{10 + i}",
                ns=f"{prefix}-n{i}",
                veth=f"{prefix}-v{i}",
                workdir=str(self.root / f"node{i}" / "work"),
            )
            for i in range(1, n + 1)
        ]
        self._sshd: dict[str, subprocess.Popen] = {}  # node name -> sshd listener
        self._sshd_extra: dict[str, str] = {}  # node name -> extra sshd_config lines
        # What the login user's ~/.bashrc reads on the nodes (bind-mounted over it in each sshd's own
        # mount namespace; this machine's file is untouched); None: this machine's own ~/.bashrc.
        # By default the nodes read LOGIN_RC (nothing), whatever this machine's user keeps there.
        self.login_rc = login_rc

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> TestBed:
        """Create bridge, namespaces and sshds; return once every sshd accepts TCP."""
        reason = missing_requirements()
        if reason:
            raise RuntimeError(f"cannot start TestBed: {reason}")
        self._cleanup_stale()
        release_stale_pyenv_lock()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            # sshd's privilege separation refuses to start without this directory.
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
            self._make_keys()
            self._make_network()
            for node in self.nodes:
                self._start_sshd(node)
            self._wait_for_sshd(self.nodes)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Kill every process in the nodes' namespaces and remove all network objects.

        Safe to call more than once, and on a bed that only half started.
        """
        errors: list[Exception] = []
        for node in self.nodes:
            try:
                self._kill_ns(node.ns)
            except RuntimeError as e:  # carry on, so the rest is still cleaned up
                errors.append(e)
        release_stale_pyenv_lock()
        for proc in self._sshd.values():
            try:
                proc.wait(timeout=5)  # reap, so no zombies are left behind
            except subprocess.TimeoutExpired:
                pass
        self._sshd.clear()
        try:
            self._remove_network([n.ns for n in self.nodes], [n.veth for n in self.nodes] + [self.bridge])
        except RuntimeError as e:
            errors.append(e)
        if errors:
            raise errors[0]

    def __enter__(self) -> TestBed:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ queries and helpers

    def ns_pids(self, node: Node) -> list[int]:
        """Pids living in the node's network namespace, except its sshd listener.

        Includes the per-connection sshd processes of open SSH sessions.
        """
        out = _run(["ip", "netns", "pids", node.ns]).stdout
        return [pid for pid in map(int, out.split()) if pid not in self._listener_pids(node)]

    def write_inventory(
        self,
        path: Path,
        hosts: list[Node] | None = None,
        *,
        defaults_extra: dict | None = None,
        extra: dict | None = None,
    ) -> Path:
        """Write a clusterddp YAML inventory for `hosts` (default: all nodes); return its path."""
        defaults = {
            "user": "root",
            "port": 22,
            "identity_file": str(self.identity_file),
            "known_hosts": str(self.known_hosts),
            "host_key_policy": "strict",
            "gpus": 2,
            "python": sys.executable,
            **(defaults_extra or {}),
        }
        hosts = self.nodes if hosts is None else hosts
        doc = {
            "defaults": defaults,
            **(extra or {}),
            "hosts": [{"name": h.name, "address": h.address, "workdir": h.workdir} for h in hosts],
        }
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    def control_file(self, node: Node, run_id: str, name: str = "node.log") -> Path:
        """A file of ``node``'s control folder for an SSH run (``<workdir>/runs/<id>/.clusterddp/<node>/``):
        its log, ``exit_code``, ``pid``. The nodes share this machine's filesystem, so a test reads it here."""
        return Path(node.workdir) / "runs" / run_id / ".clusterddp" / node.name / name

    def wait_until_written(self, run_id: str, text: str = "", name: str = "node.log",
                           nodes: list[Node] | None = None, timeout: float = 120) -> bool:
        """Wait (bounded) until every node's control file ``name`` exists and holds ``text``; True if so.

        For a test about to ask the CLI (``logs``, ``status``) whether a job got somewhere: waiting here
        costs a file read every 0.2 s, where asking the CLI in a loop costs a Python start and an SSH
        session per node each time, CPU the other tests' jobs want. The test's own assertion follows
        (this returns False rather than failing, so the CLI's answer is what the test reports)."""
        def there(node: Node) -> bool:
            try:
                return text in self.control_file(node, run_id, name).read_text(errors="replace")
            except OSError:
                return False
        deadline = time.monotonic() + timeout
        while not all(there(n) for n in (self.nodes if nodes is None else nodes)):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True

    def restart_sshd(self, node: Node, extra_config: str = "") -> None:
        """Restart `node`'s sshd with `extra_config` lines appended to its sshd_config."""
        self._stop_sshd(node)
        self._sshd_extra[node.name] = extra_config
        self._start_sshd(node)
        self._wait_for_sshd([node])

    def regenerate_host_key(self, node: Node) -> None:
        """Give `node` a new host key and restart its sshd; known_hosts keeps the old key."""
        self._stop_sshd(node)
        key = self._node_dir(node) / "ssh_host_ed25519_key"
        key.unlink(missing_ok=True)
        key.with_suffix(".pub").unlink(missing_ok=True)
        self._keygen(key, comment=node.name)
        self._start_sshd(node)
        self._wait_for_sshd([node])

    # ------------------------------------------------------------------ internals

    def _node_dir(self, node: Node) -> Path:
        return self.root / node.name

    def _keygen(self, key: Path, comment: str) -> None:
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(key)])

    def _make_keys(self) -> None:
        """Client key, one host key per node (in parallel), authorized_keys, known_hosts."""
        for f in (self.identity_file, self.identity_file.with_suffix(".pub")):
            f.unlink(missing_ok=True)
        jobs = [(self.identity_file, "clusterddp-testbed")]
        for node in self.nodes:
            Path(node.workdir).mkdir(parents=True, exist_ok=True)
            key = self._node_dir(node) / "ssh_host_ed25519_key"
            key.unlink(missing_ok=True)
            key.with_suffix(".pub").unlink(missing_ok=True)
            (self._node_dir(node) / "sshd.log").unlink(missing_ok=True)  # fresh log per bed
            jobs.append((key, node.name))
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda job: self._keygen(*job), jobs))
        self.authorized_keys.write_text(self.identity_file.with_suffix(".pub").read_text())
        lines = []
        for node in self.nodes:
            keytype, blob = (self._node_dir(node) / "ssh_host_ed25519_key.pub").read_text().split()[:2]
            lines.append(f"{node.address} {keytype} {blob}\n")  # port 22: plain address entry
        self.known_hosts.write_text("".join(lines))

    def _make_network(self) -> None:
        br = self.bridge
        _run(["ip", "link", "add", br, "type", "bridge"])
        _run(["ip", "addr", "add", f"{self.gateway}/24", "dev", br])
        _run(["ip", "link", "set", br, "up"])
        # Never route node traffic off this host, even if someone enables ip_forward.
        Path(f"/proc/sys/net/ipv4/conf/{br}/forwarding").write_text("0\n")
        for node in self.nodes:
            ns, peer = node.ns, f"{node.veth}p"
            # Point the node's resolver at its own loopback (nothing listens there), so
            # lookups like `getent hosts node1` fail at once instead of leaving the host.
            etc = NETNS_ETC / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "resolv.conf").write_text("nameserver 127.0.0.1\n")
            _run(["ip", "netns", "add", ns])
            _run(["ip", "link", "add", node.veth, "type", "veth", "peer", "name", peer])
            _run(["ip", "link", "set", peer, "netns", ns])
            _run(["ip", "link", "set", node.veth, "master", br, "up"])
            _run(["ip", "-n", ns, "link", "set", peer, "name", "eth0"])
            _run(["ip", "-n", ns, "addr", "add", f"{node.address}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(["ip", "-n", ns, "route", "add", "default", "via", self.gateway])

    def _write_sshd_config(self, node: Node) -> Path:
        d = self._node_dir(node)
        cfg = d / "sshd_config"
        cfg.write_text(
            f"""\
ListenAddress {node.address}
Port 22
HostKey {d / "ssh_host_ed25519_key"}
PidFile {d / "sshd.pid"}
AuthorizedKeysFile {self.authorized_keys}
# The bed lives under /tmp, which sshd's ownership checks would reject.
StrictModes no
UsePAM no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
# Launchers open many connections and sessions at once; sshd's defaults (10, 10) drop them.
MaxStartups 200
MaxSessions 100
UseDNS no
PrintMotd no
LogLevel VERBOSE
Subsystem sftp {SFTP_SERVER}
"""
            + self._sshd_extra.get(node.name, "")
        )
        return cfg

    def _start_sshd(self, node: Node) -> None:
        cfg = self._write_sshd_config(node)
        log = self._node_dir(node) / "sshd.log"
        (self._node_dir(node) / "sshd.pid").unlink(missing_ok=True)
        # ip netns exec, unshare (without --fork) and sh's `exec` all exec in place,
        # so the Popen pid *is* the sshd listener.
        cmd = f"hostname {node.name} && exec {SSHD} -D -e -f {cfg} -E {log}"
        unshare = ["unshare", "--uts"]
        if self.login_rc is not None:
            rc = self.root / "login-bashrc"
            rc.write_text(self.login_rc)
            rc.chmod(0o644)
            bashrc = Path.home() / ".bashrc"
            bashrc.touch(exist_ok=True)
            unshare += ["--mount", "--propagation", "private"]
            cmd = f"mount --bind {rc} {bashrc} && {cmd}"
        with open(log, "ab") as logf:
            self._sshd[node.name] = subprocess.Popen(
                ["ip", "netns", "exec", node.ns, *unshare, "sh", "-c", cmd],
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=logf,
                start_new_session=True,  # keep test-runner signals (Ctrl-C) away from sshd
            )

    def _wait_for_sshd(self, nodes: list[Node]) -> None:
        deadline = time.monotonic() + self.SSHD_START_TIMEOUT
        pending = list(nodes)
        while pending:
            for node in list(pending):
                proc = self._sshd[node.name]
                if proc.poll() is not None:
                    self._sshd_failed(node, f"sshd exited with status {proc.returncode}")
                try:
                    with socket.create_connection((node.address, 22), timeout=1) as s:
                        if s.recv(8).startswith(b"SSH-"):
                            pending.remove(node)
                except OSError:
                    pass
            if pending:
                if time.monotonic() > deadline:
                    self._sshd_failed(pending[0], f"sshd not answering on port 22 after {self.SSHD_START_TIMEOUT}s")
                time.sleep(0.05)
        # Each probe above made sshd fork a pre-auth child that lingers for a moment;
        # wait for them to go, so a fresh node's ns_pids() is empty.
        deadline = time.monotonic() + 5
        while any(self.ns_pids(n) for n in nodes) and time.monotonic() < deadline:
            time.sleep(0.05)

    def _sshd_failed(self, node: Node, why: str) -> None:
        log = self._node_dir(node) / "sshd.log"
        raise RuntimeError(f"{node.name} ({node.address}, netns {node.ns}): {why}\n--- {log}:\n{_tail(log)}")

    def _stop_sshd(self, node: Node) -> None:
        proc = self._sshd.pop(node.name, None)
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)

    def _listener_pids(self, node: Node) -> set[int]:
        pids = set()
        proc = self._sshd.get(node.name)
        if proc is not None:
            pids.add(proc.pid)
        try:
            pids.add(int((self._node_dir(node) / "sshd.pid").read_text().split()[0]))
        except (OSError, ValueError, IndexError):
            pass
        return pids

    @staticmethod
    def _kill_ns(ns: str, timeout: float = 10.0) -> None:
        """SIGKILL everything in `ns` until it is empty (processes may fork meanwhile)."""
        deadline = time.monotonic() + timeout
        while True:
            res = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            pids = [int(p) for p in res.stdout.split()] if res.returncode == 0 else []
            if not pids:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes in netns {ns} survive SIGKILL: {pids}")
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)

    def _cleanup_stale(self) -> None:
        """Remove namespaces and links left by an earlier bed with this exact prefix."""
        p = re.escape(self.prefix)
        out = _run(["ip", "-j", "netns", "list"]).stdout.strip()
        stale_ns = [e["name"] for e in json.loads(out or "[]") if re.fullmatch(rf"{p}-n\d+", e["name"])]
        links = json.loads(_run(["ip", "-j", "link", "show"]).stdout or "[]")
        stale_links = [k["ifname"] for k in links if re.fullmatch(rf"{p}-(br|v\d+p?)", k["ifname"])]
        for ns in stale_ns:
            self._kill_ns(ns)
        self._remove_network(stale_ns, stale_links)
        if NETNS_ETC.is_dir():
            for d in NETNS_ETC.iterdir():
                if re.fullmatch(rf"{p}-n\d+", d.name):
                    shutil.rmtree(d, ignore_errors=True)

    @staticmethod
    def _remove_network(namespaces: list[str], links: list[str]) -> None:
        """Delete namespaces (their eth0 ends take the veth pairs along), then links."""
        for ns in namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
        try:
            NETNS_ETC.rmdir()  # only if no other namespace uses it
        except OSError:
            pass
        # The kernel frees a namespace (and so its veth pair) asynchronously: retry a while.
        deadline = time.monotonic() + 10
        while True:
            left = [ns for ns in namespaces if Path("/run/netns", ns).exists()]
            left += [k for k in links if Path("/sys/class/net", k).exists()]
            for link in left:
                subprocess.run(["ip", "link", "del", link], capture_output=True)
            if not left:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"could not remove: {', '.join(left)}")
            time.sleep(0.1)
