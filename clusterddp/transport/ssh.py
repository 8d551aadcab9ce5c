"""SSH transport: one Fabric Connection per host; commands on that connection's paramiko channels.

The only module that imports Fabric (and with it invoke and paramiko). It is loaded only when a
host is contacted (``clusterddp.transport.connect``), so ``--help``, ``runs``, ``schedule list``
and ``up local`` never pay for them.

How a host is reached is Fabric's work: its Config reads ``~/.ssh/config`` then
``/etc/ssh/ssh_config`` (first value wins, as OpenSSH), and its Connection resolves HostName,
User, Port, IdentityFile, ProxyCommand and ProxyJump, each jump host through its own ssh_config
entry (a jump host's own ProxyJump included). The inventory's user, port and identity_file come
before ssh_config's, as OpenSSH's ``-l``, ``-p`` and ``-i`` do, so a ProxyCommand's ``%r`` and
``%p`` are the inventory's too.

clusterddp's rules hold on every hop, jump hosts included: host keys are checked against the
inventory's ``known_hosts`` only (``strict`` refuses unknown and changed keys, ``accept-new``
records unknown ones and still refuses changed ones; never Fabric's default, which accepts any
key, and never ssh_config's StrictHostKeyChecking or UserKnownHostsFile); ssh-agent may log in
but is never forwarded; ``connect_timeout`` bounds every stage of every handshake.
"""

from __future__ import annotations

import builtins
import ctypes
import logging
import os
import select
import socket
import stat
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

import paramiko
from fabric.config import Config
from fabric.connection import Connection

from ..errors import FileRefused, HostError
from ..errors import HostErrorKind as Kind
from ..files import read_bounded
from ..inventory import Host
from .base import CommandResult, Stdin, stdin_parts

# Throughput (bench/collect_speed.py): paramiko prefers aes128-ctr + hmac-sha2-256, whose MAC
# and per-packet work cost far more in Python than AES-GCM (an AEAD, one C call per packet);
# OpenSSH servers offer GCM by default: a 256 MiB stream went from about 1.8 s to 1.4 s. Channels
# also allow 128 KiB packets and a 4 MiB window (paramiko: 32 KiB, 2 MiB), though OpenSSH sends
# a command's output in 32 KiB packets whatever the client allows (it reads its pipe 32 KiB at
# a time); sizes from 512 KiB to 16 MiB windows measured alike.
_PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
_WINDOW = 4 << 20
_MAX_PACKET = 128 << 10
# Output a captured command (``run``: probes, status, teardown) may hold, per stream. Answers are
# a few KiB; bulk data (logs, collect, exec's output) is streamed, never captured.
MAX_RUN_OUTPUT = 16 << 20
_CHUNK = 1 << 20

# paramiko starts a re-key after 512 MiB; a channel closing while that re-key is pending
# deadlocks its transport thread until "Key-exchange timed out waiting for key negotiation"
# (paramiko issue #822), so any fetch past 512 MiB on one connection failed. Each of our
# transports leaves re-keying to the server (OpenSSH re-keys on its own schedule), which does not
# hit that race. Set per transport, not on paramiko's class: other paramiko users in the process
# keep its default.
_NO_REKEY = 1 << 62

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None)


def _reuse_freed_memory() -> bool:
    """Let glibc's malloc keep and reuse the buffers a bulk stream churns through; False elsewhere.

    paramiko's channel buffer grows and drains for every chunk read, and each chunk is a fresh
    bytes object of up to 1 MiB. With glibc's defaults, blocks over 128 KiB (the threshold moves,
    but the heap is trimmed back each time) come from fresh zeroed pages, so every MiB fetched
    costs page faults several times over. Serving blocks up to 8 MiB from the heap and trimming
    it only past 32 MiB free made a 256 MiB collect about 0.15 s (9%) faster (measured with
    interleaved runs). Other C libraries have no mallopt: nothing to do.
    """
    try:
        mallopt = _libc().mallopt
    except (OSError, AttributeError):
        return False
    mallopt(_M_MMAP_THRESHOLD, 8 << 20)
    mallopt(_M_TRIM_THRESHOLD, 32 << 20)
    return True


_process_lock = threading.Lock()
_process_ready = False


def _prepare_process() -> None:
    """Process-wide settings for SSH transports, made when the first one is created (not at import).

    Idempotent: the first call does the work. Changes glibc's malloc thresholds (see
    :func:`_reuse_freed_memory`) and gives paramiko's logger a handler: paramiko logs failures on
    its own threads (a banner timeout, a reset) with tracebacks, which Python's last-resort
    handler would print, while every failure already reaches the user as a HostError.
    """
    global _process_ready
    with _process_lock:
        if _process_ready:
            return
        _process_ready = True
    logging.getLogger("paramiko").addHandler(logging.NullHandler())
    _reuse_freed_memory()


SEEN_MAX = 64  # bytes of a non-SSH answer kept and shown: enough for an HTTP status line


class _NoGreeting(paramiko.SSHException):
    """The server sent no SSH greeting: ``seen`` holds the first bytes it sent instead (maybe none),
    ``closed`` whether it closed the connection (else the banner timeout passed)."""

    def __init__(self, message: str, seen: bytes, closed: bool) -> None:
        super().__init__(message)
        self.seen, self.closed = seen, closed


class _Transport(paramiko.Transport):
    """paramiko's Transport, remembering what a server that is not SSH answered (paramiko keeps it
    only in a debug log), so the error can say what is listening there instead."""

    greeted = False  # the server's SSH version line was read
    seen: bytes | bytearray = b""  # what it sent before (or instead of) that line
    hung_up = False  # the server closed the connection before its version line

    def _check_banner(self) -> None:
        packetizer: Any = self.packetizer  # _read_timeout: private, in paramiko since 2003
        read = packetizer._read_timeout
        seen = self.seen = bytearray()

        def recording(timeout: float) -> bytes:
            try:
                data = read(timeout)
            except (EOFError, ConnectionError):  # a reset, when our version line reached a closed socket
                self.hung_up = True
                raise
            seen.extend(data[:SEEN_MAX - len(seen)])
            return data
        packetizer._read_timeout = recording
        try:
            super()._check_banner()  # type: ignore[misc]
            self.greeted = True
        except paramiko.SSHException as e:
            if isinstance(e, paramiko.ProxyCommandFailure) or seen.startswith(b"SSH-"):
                raise  # an SSH server after all (a bad version line): paramiko's words say it
            closed = self.hung_up or isinstance(e.__context__, (EOFError, ConnectionError)) or (
                seen and not isinstance(e.__context__, socket.timeout))
            raise _NoGreeting(str(e), bytes(seen), bool(closed)) from None
        finally:
            del packetizer._read_timeout


def _no_greeting(t: paramiko.Transport | None, e: BaseException) -> BaseException:
    """``e``, or a :class:`_NoGreeting` when the server never sent its SSH version line: paramiko's
    connect stops waiting at its own timeout, racing the banner timeout, and then fails later
    ("No existing session") before the banner check can say what was, or was not, seen."""
    if not isinstance(t, _Transport) or t.greeted:
        return e
    if isinstance(e, (EOFError, ConnectionError)):  # sending our version line hit the server's close (a reset)
        return _NoGreeting(str(e) or type(e).__name__, bytes(t.seen), closed=True)
    if isinstance(e, paramiko.SSHException) and not isinstance(e, (_NoGreeting, paramiko.ProxyCommandFailure)):
        return _NoGreeting(str(e), bytes(t.seen), closed=t.hung_up or not t.is_alive())
    return e


def _transport_factory(sock: socket.socket, **kwargs) -> paramiko.Transport:
    t = _Transport(_tcp_tuned(sock), **kwargs)
    opts = t.get_security_options()
    first = tuple(c for c in _PREFERRED_CIPHERS if c in opts.ciphers)
    opts.ciphers = first + tuple(c for c in opts.ciphers if c not in first)
    t.packetizer.REKEY_BYTES = t.packetizer.REKEY_PACKETS = _NO_REKEY
    return t


_QUICKACK = getattr(socket, "TCP_QUICKACK", None)  # Linux only
_S = TypeVar("_S")


class _QuickAck(socket.socket):
    """A TCP socket that acknowledges what it read at once: TCP_QUICKACK again after every read (the
    kernel clears it as soon as the connection looks interactive)."""

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data = super().recv(bufsize, flags)
        try:
            self.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)  # type: ignore[arg-type]
        except OSError:  # only slower without it
            pass
        return data


def _tcp_tuned(sock: _S) -> _S:
    """``sock`` set to send each SSH packet at once and to acknowledge each one at once, on a TCP
    connection (a jump host's channel or a ProxyCommand's pipe is none; the jump host's own is).

    Sending (TCP_NODELAY, as OpenSSH's client): paramiko leaves Nagle's algorithm on, and a command
    is small packets one after another (open a channel, exec, stdin, EOF): each waited for the ACK of
    the one before, which the node delays up to 40 ms. That was 45 ms of every command and 87 ms of
    one with stdin, on any network; 3.5 and 5 ms with it.

    Acknowledging (TCP_QUICKACK, after each read): sshd leaves Nagle on for a session without a
    terminal, and right after authentication it sends two packets in a row (the success, then its
    host keys); its answer to the first channel open then waited for our ACK of those, which Linux
    delays 40 ms: 43 ms of every connection's first command (3 ms with it). bench/RESULTS-up-ssh.md.

    Returns the socket to use (the same connection; paramiko's client drops its own object once it
    has made the transport)."""
    if not isinstance(sock, socket.socket) or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return sock
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:  # only slower without it
        pass
    if _QUICKACK is None or type(sock) is not socket.socket:
        return sock
    timeout = sock.gettimeout()
    quick = _QuickAck(sock.family, sock.type, sock.proto, fileno=sock.detach())
    quick.settimeout(timeout)
    return cast(_S, quick)


_known_hosts_lock = threading.Lock()
log = logging.getLogger("clusterddp")  # as the store's: the CLI prints its warnings on stderr


class _KnownHosts:
    """A known_hosts file read line by line the way OpenSSH reads it, not paramiko's ``load``.

    paramiko's loader raises on the first line it cannot parse (a ``@cert-authority`` or
    ``@revoked`` marker, a damaged key), so one such line broke every connection, and it has no
    notion of revoked keys. Here plain entries are kept; ``@revoked`` keys are refused for the
    hosts their line names (OpenSSH patterns: ``*``, ``?``, ``!negation``, hashed names) even
    where a plain line lists them (a revoked key is never accepted); lines
    paramiko cannot honour (``@cert-authority``: it cannot verify host certificates; a malformed
    line; a key type it does not know) are skipped with a warning naming file and line, once per
    process and version of the file.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.entries: list[paramiko.hostkeys.HostKeyEntry] = []
        self.revoked: list[tuple[list[str], paramiko.PKey, int]] = []  # (patterns, key, line number)
        try:  # non-blocking, regular files only, bounded: a FIFO or /dev/zero named as known_hosts is refused
            text = read_bounded(path, 64 << 20)[0].decode("utf-8", "replace")
            lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")  # as open()'s text mode split it
        except FileRefused as e:
            if e.reason == "missing":
                return
            raise FileRefused(path, e.reason, f"(known_hosts) {e.problem}", "name a known_hosts file in the inventory "
                              "(known_hosts:), or leave it out for ~/.ssh/known_hosts") from None
        for lineno, raw in enumerate(lines, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            marker = None
            if line.startswith("@"):
                marker, _, line = line.partition(" ")
                line = line.strip()
                if marker != "@revoked":
                    why = ("paramiko cannot verify host certificates; the hosts it covers need their own key lines"
                           if marker == "@cert-authority" else f"unknown marker {marker[:40]!r}")
                    self._skip(lineno, why)
                    continue
            try:
                entry = paramiko.hostkeys.HostKeyEntry.from_line(line, lineno)
            except Exception as e:  # InvalidHostKey (not an SSHException), a key that does not parse, ...
                self._skip(lineno, f"not a valid known_hosts line ({type(e).__name__})")
                continue
            if entry is None:  # too few fields, or a key type paramiko does not know
                fields = line.split()
                why = ("not a valid known_hosts line" if len(fields) < 3
                       else f"key type {fields[1][:40]!r} not supported")
                self._skip(lineno, why)
                continue
            if marker == "@revoked":
                self.revoked.append((entry.hostnames, entry.key, lineno))
            else:
                self.entries.append(entry)

    def _skip(self, lineno: int, why: str) -> None:
        log.warning("warning: %s:%d: %s; line skipped", self.path, lineno, why)

    def install(self, client: paramiko.SSHClient) -> None:
        """Give ``client`` these host keys (the first key of a type listed for a host wins, as paramiko's)."""
        keys = client.get_host_keys()
        revoked = {k.asbytes() for _, k, _ in self.revoked}
        for e in self.entries:
            for name in e.hostnames:
                # a revoked key is never accepted, listed or not; a hashed name cannot be matched
                # against the revocation's patterns, so a key revoked anywhere is dropped there
                if e.key.asbytes() in revoked and (name.startswith("|1|") or self.revoked_line(name, e.key)):
                    continue
                known = keys.lookup(name)
                if known is None or e.key.get_name() not in known:
                    keys.add(name, e.key.get_name(), e.key)

    def revoked_line(self, hostname: str, key: paramiko.PKey) -> int | None:
        """The line revoking ``key`` for ``hostname`` (as paramiko names it: ``[host]:port`` off port 22)."""
        for patterns, k, lineno in self.revoked:
            if k.asbytes() == key.asbytes() and _host_matches(hostname, patterns):
                return lineno
        return None


def _host_matches(hostname: str, patterns: list[str]) -> bool:
    """OpenSSH's host pattern list: a match on any pattern, and on no negated one."""
    import fnmatch
    hit = False
    for p in patterns:
        neg = p.startswith("!")
        p = p[1:] if neg else p
        if p.startswith("|1|"):
            ok = paramiko.HostKeys.hash_host(hostname, p) == p
        else:
            ok = fnmatch.fnmatchcase(hostname.lower(), p.lower().replace("[", "[[]"))
        if ok and neg:
            return False
        hit = hit or ok
    return hit


_known_cache_lock = threading.Lock()
_known_cache: dict[str, tuple[tuple | None, _KnownHosts]] = {}


def _known_hosts(path: str) -> _KnownHosts:
    """The parsed known_hosts, once per process and version of the file (its warnings once too)."""
    sig = _file_signature(path)
    with _known_cache_lock:
        cached = _known_cache.get(path)
        if cached is None or cached[0] != sig:
            cached = _known_cache[path] = (sig, _KnownHosts(path))
        return cached[1]


class _UnknownHostKey(paramiko.SSHException):
    """The host's key is not in known_hosts and the policy is strict."""


class _RevokedHostKey(paramiko.SSHException):
    """The host offered a key that known_hosts marks ``@revoked``."""

    def __init__(self, hostname: str, lineno: int) -> None:
        super().__init__(hostname)
        self.hostname, self.lineno = hostname, lineno


class _Strict(paramiko.MissingHostKeyPolicy):
    def __init__(self, path: str) -> None:
        self.path = path

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        lineno = _known_hosts(self.path).revoked_line(hostname, key)
        if lineno is not None:
            raise _RevokedHostKey(hostname, lineno)
        raise _UnknownHostKey(hostname)


class _AcceptNew(_Strict):
    """Like OpenSSH's ``StrictHostKeyChecking=accept-new``: remember unknown keys, never changed or revoked ones."""

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        lineno = _known_hosts(self.path).revoked_line(hostname, key)
        if lineno is not None:
            raise _RevokedHostKey(hostname, lineno)
        client.get_host_keys().add(hostname, key.get_name(), key)
        with _known_hosts_lock:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            with builtins.open(self.path, "a", encoding="utf-8") as f:  # open() is this module's entry point
                f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


_SSH_CONFIG_FILES = ("~/.ssh/config", "/etc/ssh/ssh_config")  # what Fabric's Config reads, in this order
_config_lock = threading.Lock()
_config_cache: tuple[tuple, paramiko.SSHConfig] | None = None


def _file_signature(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _ssh_config() -> paramiko.SSHConfig:
    """ssh_config as Fabric's Config loads it, parsed once per process (again only if a file changed)."""
    global _config_cache
    key = tuple((p, _file_signature(p)) for p in map(os.path.expanduser, _SSH_CONFIG_FILES))
    with _config_lock:
        if _config_cache is None or _config_cache[0] != key:
            # lazy: Fabric's and invoke's own config files (/etc/fabric.yaml, ~/.fabric.py, ...) are
            # not read; the inventory, not a Fabric setting, decides how clusterddp connects.
            cfg = Config(lazy=True)
            cfg.load_ssh_config()
            _config_cache = (key, cfg.base_ssh_config)
        return _config_cache[1]


def _fabric_config(host: Host) -> Config:
    """Fabric's Config for ``host``: ssh_config, with the inventory's user and port read first.

    Those come first the way OpenSSH's ``-l``/``-p`` do, so that ssh_config's tokens (a
    ProxyCommand's ``%r``/``%p``) and ``Match user`` see them, not ssh_config's own values.
    """
    base = _ssh_config()
    given = {k: str(v) for k, v in (("user", host.user), ("port", host.port)) if v is not None}
    if not given:
        return Config(ssh_config=base, lazy=True)
    layered = paramiko.SSHConfig()
    # SSHConfig has no public way to add a rule to parsed ones; Fabric itself copies `_config`.
    layered._config = [{"host": [host.address], "config": given}, *base._config]  # type: ignore[attr-defined]  # private, as in Fabric
    return Config(ssh_config=layered, lazy=True)


class _Hop(Connection):
    """A fabric.Connection under clusterddp's rules (module docstring); so is every jump host it uses."""

    # Declared on the class: invoke's DataProxy (a Connection's base) stores an attribute it does
    # not know as a config value instead.
    _owner: SSHTransport = None  # type: ignore[assignment]  # a class attribute (see above); set in __init__
    keys: _KeyFiles = None  # type: ignore[assignment]  # likewise

    def __init__(self, host: str, owner: SSHTransport, *, config: Config, **kwargs) -> None:
        self._owner = owner  # before Fabric's __init__, which builds the gateways (get_gateway)
        h = owner.host
        connect_kwargs = {"allow_agent": True, "transport_factory": _transport_factory,
                          # connect_timeout bounds every stage of the handshake, not only the TCP
                          # connect, so a host that accepts but never answers is reported as fast
                          # as one that is down.
                          "banner_timeout": h.connect_timeout, "auth_timeout": h.connect_timeout}
        if h.identity_file:
            connect_kwargs["key_filename"] = [os.path.expanduser(h.identity_file)]  # before ssh_config's
        super().__init__(host, config=config, forward_agent=False, connect_kwargs=connect_kwargs, **kwargs)
        self.connect_timeout = h.connect_timeout  # Fabric's own is whole seconds; 0.5 would mean none
        self.client.set_missing_host_key_policy(owner._policy)  # replaces Fabric's AutoAddPolicy
        _known_hosts(owner._known).install(self.client)
        self.keys = _KeyFiles(self.connect_kwargs.get("key_filename") or [], h)
        if self.keys.files:
            self.connect_kwargs["key_filename"] = [path for path, _ in self.keys.files]
        else:
            self.connect_kwargs.pop("key_filename", None)

    @property
    def where(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    def get_gateway(self) -> _Hop | str | None:
        jumps = [j.strip() for j in (self.ssh_config.get("proxyjump") or "").split(",") if j.strip()]
        if not jumps or jumps[0].lower() == "none":
            return self.ssh_config.get("proxycommand")  # a string, started by Fabric at open; or None
        if any(self.derive_shorthand(j)["host"] in (self.original_host, self.host) for j in jumps):
            return None  # a `Host *` ProxyJump naming this very host: connect directly (as Fabric does)
        # OpenSSH's order: the first jump host is reached as its own ssh_config says (its own
        # ProxyJump included), each next one through the one before, the node through the last.
        # (Fabric 3.2's get_gateway nests a list the other way round.)
        gateway = None
        for spec in jumps:
            gateway = _Hop(spec, self._owner, config=self.config, gateway=gateway)
        return gateway

    def open_gateway(self) -> object:
        if isinstance(self.gateway, str):
            return super().open_gateway()
        self.gateway.open()
        try:
            return self.gateway.transport.open_channel("direct-tcpip", (self.host, int(self.port)), ("", 0),
                                                       timeout=self.connect_timeout)
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise HostError(self._owner.name, f"jump host {self.gateway.where} cannot reach {self.where}: {e}",
                            "check ProxyJump in ~/.ssh/config and that the jump host allows TCP forwarding",
                            kind=Kind.UNREACHABLE) from None

    def open(self) -> None:
        if self.keys.unusable:  # before any connection: paramiko would fail with "No such file" after the handshake
            raise self.keys.unusable
        try:
            super().open()
        except BaseException as e:
            e = _no_greeting(self.client.get_transport(), e)
            try:  # before close(): it forgets the agent paramiko asked for keys
                located = e if isinstance(e, HostError) else self._owner._located(e, self)
            finally:
                self.client.close()  # paramiko leaves the socket and its thread up after a refused key or login
            raise located from None

    def offered(self) -> str:
        """The keys offered to this hop, in paramiko's order, for an authentication failure's message."""
        agent = getattr(self.client, "_agent", None)  # paramiko's own: the agent it asked (no new connection)
        try:
            agent_keys = len(agent.get_keys()) if agent is not None else 0
        except Exception:  # noqa: BLE001 - only a count for a message
            agent_keys = 0
        return self.keys.offered(agent_keys)


def _key_problem(path: str) -> str | None:
    """Why the key file at ``path`` cannot be offered, or None. paramiko opens each named file as it
    comes to it: a missing one stops the whole login with "No such file or directory" (read as a
    host that is down), and a FIFO would block it for ever."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "does not exist"
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    if stat.S_ISDIR(st.st_mode):
        return "is a folder, not a key file"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if not os.access(path, os.R_OK):
        return "cannot be read (permission denied)"
    return None


# The key files paramiko reads by itself (SSHClient's look_for_keys, on by default), in its order.
_DEFAULT_KEYS = tuple(f"~/{d}/id_{t}" for t in ("rsa", "ecdsa", "ed25519") for d in (".ssh", "ssh"))


class _KeyFiles:
    """The key files a hop names, each with where it was named: the inventory's identity_file first
    (its field, ``lab.yaml:7: hosts[1].identity_file``), then ssh_config's IdentityFile lines.

    An inventory key that cannot be read is an error naming the file and that field (``unusable``,
    raised before connecting); an ssh_config IdentityFile that does not exist is skipped, as OpenSSH
    skips it, and named only if the login then fails.
    """

    def __init__(self, named: list[str] | str, host: Host) -> None:
        self.files: list[tuple[str, str]] = []  # (path, where it was named)
        self.skipped: list[tuple[str, str]] = []  # (path, why)
        self.unusable: HostError | None = None
        named = [named] if isinstance(named, str) else list(named)
        inventory = os.path.expanduser(host.identity_file) if host.identity_file else None
        for i, raw in enumerate(named):
            path = os.path.expanduser(raw)
            if i == 0 and path == inventory:
                field = host.identity_from or "the inventory's identity_file"
                problem = _key_problem(path)
                if problem:
                    self.unusable = HostError(
                        host.name, f"identity_file {path} {problem} (set in {field})",
                        "correct the path in the inventory (`ls ~/.ssh` lists your keys), or remove identity_file "
                        "to log in with ssh-agent or ~/.ssh/config's IdentityFile", kind=Kind.KEY_FILE)
                self.files.append((path, f"identity_file, {field}"))
            elif any(path == p for p, _ in self.files):
                continue
            else:
                problem = _key_problem(path)
                if problem:
                    self.skipped.append((path, f"IdentityFile in ssh_config; {problem}, skipped"))
                else:
                    self.files.append((path, "IdentityFile in ssh_config"))

    def offered(self, agent_keys: int) -> str:
        """``tried a (identity_file, lab.yaml:7: defaults.identity_file), 2 keys from ssh-agent, ...``"""
        tried = [f"{path} ({where})" for path, where in self.files]
        if agent_keys:
            tried.append(f"{agent_keys} key{'s' if agent_keys > 1 else ''} from ssh-agent")
        named = {p for p, _ in self.files}
        tried += [f"{p} (paramiko's default)" for p in map(os.path.expanduser, _DEFAULT_KEYS)
                  if p not in named and os.path.isfile(p)]
        said = "tried " + ", ".join(tried) if tried else "no key was offered"
        if self.skipped:
            said += "; not tried: " + ", ".join(f"{p} ({why})" for p, why in self.skipped)
        return said


def _not_ssh(name: str, where: str, e: _NoGreeting, timeout: float) -> HostError:
    """What answered at ``where`` instead of an SSH server, in words and escaped bytes."""
    if e.seen:
        shown = repr(e.seen)[1:]  # b'...' without the b: every byte that is not printable ASCII escaped
        more = "..." if len(e.seen) >= SEEN_MAX else ""
        return HostError(name, f"{where} is not an SSH server: it answered {shown}{more}",
                         "check the address and port (an SSH server's greeting starts with SSH-2.0); "
                         "another service listens there", kind=Kind.UNREACHABLE)
    if e.closed:
        return HostError(name, f"{where} accepted the connection, then closed it without an SSH greeting",
                         "check that sshd listens on that port; a busy sshd (MaxStartups) or a firewall "
                         "rule (tcp wrappers) also does this", kind=Kind.UNREACHABLE)
    return HostError(name, f"{where} accepted the connection but sent nothing within {timeout:g}s "
                           "(an SSH server greets at once)",
                     "check that sshd (not another service) listens there and is not overloaded", kind=Kind.TIMEOUT)


class SSHTransport:
    """One SSH connection to one host; each command gets its own channel (thread-safe)."""

    def __init__(self, host: Host) -> None:
        _prepare_process()
        self.name = host.name
        self.host = host
        self._known = os.path.expanduser(host.known_hosts)
        self._policy = _AcceptNew(self._known) if host.host_key_policy == "accept-new" else _Strict(self._known)
        self._conn: _Hop | None = None
        self._transport: paramiko.Transport | None = None

    def open(self) -> SSHTransport:
        try:
            self._open()
        except BaseException:
            self.close()
            raise
        if self.host.keepalive > 0 and self._transport is not None:
            self._transport.set_keepalive(max(1, int(self.host.keepalive)))
        return self

    def _open(self) -> None:
        try:
            self._conn = _Hop(self.host.address, self, config=_fabric_config(self.host),
                              user=self.host.user, port=self.host.port)
        except (paramiko.SSHException, ValueError, KeyError, OSError, RecursionError) as e:
            why = "its ProxyJump hosts jump through each other in a loop" if isinstance(e, RecursionError) else e
            raise HostError(self.name, f"cannot use the ssh_config entry for {self.host.address}: {why}",
                            "check ~/.ssh/config (clusterddp reads HostName, User, Port, IdentityFile, "
                            "ProxyJump, ProxyCommand)", kind=Kind.CONFIG) from None
        self._conn.open()
        self._transport = self._conn.transport

    def _located(self, e: BaseException, hop: _Hop) -> BaseException:
        """The HostError (naming the hop and what to do) for a failed connect; other errors as they are."""
        where = hop.where
        if isinstance(e, paramiko.BadHostKeyException):  # a revoked key where another one is listed
            lineno = _known_hosts(self._known).revoked_line(e.hostname, e.key)
            if lineno is not None:
                e = _RevokedHostKey(e.hostname, lineno)
        if isinstance(e, _RevokedHostKey):
            return HostError(self.name, f"host key of {hop.host} is REVOKED ({self._known}:{e.lineno}; refused)",
                             "the host still offers a key you marked @revoked: do not trust it until its owner "
                             f"installs a new key; verify that key and add it to {self._known}",
                             kind=Kind.HOST_KEY_CHANGED)
        if isinstance(e, paramiko.BadHostKeyException):
            return HostError(self.name, f"host key for {hop.host} has CHANGED (refused)",
                             f"if the host was reinstalled, verify its new key and remove the old one with "
                             f"`ssh-keygen -R {hop.host} -f {self._known}`", kind=Kind.HOST_KEY_CHANGED)
        if isinstance(e, _UnknownHostKey):
            return HostError(self.name, f"host key of {hop.host} is unknown (host_key_policy: strict)",
                             f"verify the host and add its key: `ssh-keyscan -H {hop.host} >> "
                             f"{self._known}`, or set host_key_policy: accept-new", kind=Kind.HOST_KEY_UNKNOWN)
        if isinstance(e, paramiko.AuthenticationException):
            said = "" if str(e) in ("", "Authentication failed.") else f" ({e})"  # paramiko's words, when they add any
            return HostError(self.name, f"authentication failed for {where}{said}; {hop.offered()}",
                             f"check user and identity_file in the inventory, or your ssh-agent; the key's .pub "
                             f"must be in ~{hop.user}/.ssh/authorized_keys on {hop.host}", kind=Kind.AUTH_REFUSED)
        if isinstance(e, paramiko.SSHException):
            # paramiko raises these two as plain SSHExceptions; its wording is all that tells them apart
            if "No authentication methods available" in str(e):
                skipped = "" if not hop.keys.skipped else f" ({hop.offered()})"
                return HostError(self.name, f"no SSH key to log in to {where}{skipped}",
                                 "set identity_file in the inventory, add IdentityFile to ~/.ssh/config, "
                                 "or load a key into ssh-agent", kind=Kind.AUTH_REFUSED)
            if isinstance(e, _NoGreeting):
                return _not_ssh(self.name, where, e, self.host.connect_timeout)
            if "banner" in str(e):  # TCP connected, but no SSH greeting within banner_timeout
                return HostError(self.name, f"{where} accepted the connection but sent no SSH greeting "
                                            f"within {self.host.connect_timeout:g}s",
                                 "check that sshd (not another service) listens there and is not overloaded",
                                 kind=Kind.TIMEOUT)
            kind = Kind.UNREACHABLE if isinstance(e, paramiko.ProxyCommandFailure) else Kind.OTHER
            return HostError(self.name, f"SSH to {where} failed: {e}", kind=kind)
        if isinstance(e, (socket.timeout, TimeoutError)):
            return HostError(self.name, f"no answer from {where} within {self.host.connect_timeout:g}s",
                             "check that the host is up and the address and port are right", kind=Kind.TIMEOUT)
        if isinstance(e, OSError):
            return HostError(self.name, f"cannot connect to {where}: {e.strerror or e}",
                             "check that the host is up, sshd runs, and the address and port are right",
                             kind=Kind.UNREACHABLE)
        return e

    def _lost(self, e: BaseException) -> HostError:
        return HostError(self.name, f"connection lost: {e or type(e).__name__}", kind=Kind.CONNECTION_LOST)

    # Commands run on channels of the Connection's paramiko transport, not through Fabric's
    # Connection.run: output stays bytes, stdin is written as given, one loop on the caller's thread
    # reads stdout and stderr (Fabric's runner starts threads per command and decodes text: a cost
    # at every host of a fan-out and every chunk of a bulk stream), each channel gets the window
    # and packet sizes above, and none ever asks for agent forwarding.
    def _channel(self, command: str, timeout: float | None) -> paramiko.Channel:
        try:
            if self._transport is None:
                raise paramiko.SSHException("not connected")
            chan = self._transport.open_session(window_size=_WINDOW, max_packet_size=_MAX_PACKET,
                                                timeout=timeout or self.host.connect_timeout)
            chan.settimeout(timeout)
            chan.exec_command(command)
            return chan
        except (paramiko.SSHException, OSError, EOFError, AttributeError) as e:
            raise self._lost(e) from None

    @staticmethod
    def _pump(chan: paramiko.Channel, on_out: Callable[[bytes], None], on_err: Callable[[bytes], None],
              timeout: float | None) -> int:
        """Pass stdout and stderr on as either arrives; return the exit code.

        Both streams share the channel's flow-control window: waiting on one while the command
        fills the other (over 4 MiB of stderr before any stdout) would stall both ends for ever.
        ``timeout`` bounds each wait for data.
        """
        poller = select.poll()
        poller.register(chan.fileno(), select.POLLIN)  # readable while either stream has data, or at EOF
        wait_ms = None if timeout is None else max(1, int(timeout * 1000))
        while True:
            ended = chan.eof_received or chan.closed  # before the reads: what came before EOF is buffered
            if chan.recv_stderr_ready():
                on_err(chan.recv_stderr(_CHUNK))
            elif chan.recv_ready():
                on_out(chan.recv(_CHUNK))
            elif ended:
                return chan.recv_exit_status()
            elif not poller.poll(wait_ms):
                raise TimeoutError()

    @staticmethod
    def _send(chan: paramiko.Channel, stdin: Stdin) -> None:
        """Write ``stdin``: bytes as they are, a path's file read in chunks (an upload is never held
        whole), a tuple's parts one after another."""
        for part in stdin_parts(stdin):
            if isinstance(part, os.PathLike):
                with builtins.open(part, "rb") as f:
                    while chunk := f.read(_CHUNK):
                        chan.sendall(chunk)
            elif part:
                chan.sendall(part)

    def run(self, command: str, *, timeout: float | None = None, stdin: Stdin = None) -> CommandResult:
        chan = self._channel(command, timeout)
        out, err = bytearray(), bytearray()

        def keep(buf: bytearray, what: str) -> Callable[[bytes], None]:
            def add(chunk: bytes) -> None:
                if len(buf) + len(chunk) > MAX_RUN_OUTPUT:
                    raise _TooMuch(what)
                buf.extend(chunk)
            return add
        try:
            self._send(chan, stdin)
            chan.shutdown_write()
            code = self._pump(chan, keep(out, "stdout"), keep(err, "stderr"), timeout)
        except _TooMuch as e:
            raise HostError(self.name, f"sent more than {MAX_RUN_OUTPUT >> 20} MiB on {e} for one command "
                            "(its answer is expected to be small); the command was abandoned",
                            "look at what the node's shell start-up files and setup lines print") from None
        except TimeoutError:
            raise HostError(self.name, f"command timed out after {timeout:g}s", kind=Kind.TIMEOUT) from None
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise self._lost(e) from None
        finally:
            chan.close()
        return CommandResult(code, bytes(out), bytes(err))

    def stream(self, command: str, on_data: Callable[[bytes], None], *, timeout: float | None = None,
               stderr_to: bytearray | None = None, stdin: bytes | None = None) -> int:
        chan = self._channel(command, timeout)
        chan.set_combine_stderr(stderr_to is None)

        def deliver(chunk: bytes) -> None:
            try:
                on_data(chunk)
            except Exception as e:  # a local failure (full disk, closed pipe) is not "connection lost"
                raise _LocalError(e) from e
        try:
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
            return self._pump(chan, deliver, stderr_to.extend if stderr_to is not None else deliver, timeout)
        except TimeoutError:
            raise HostError(self.name, f"no data for {timeout:g}s", kind=Kind.TIMEOUT) from None
        except _LocalError as e:
            raise e.cause from None
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise self._lost(e) from None
        finally:
            chan.close()

    def ping(self) -> None:
        # keepalive@openssh.com with a reply asked for, as OpenSSH's ServerAliveInterval sends it:
        # sshd answers it (with a refusal) from the connection's own process; nothing starts on the
        # node, where a command per heartbeat (a shell, its start-up files) took CPU from the job.
        t = self._transport
        try:
            if t is None:
                raise paramiko.SSHException("not connected")
            t.global_request("keepalive@openssh.com", wait=True)  # returns early, unanswered, once t closes
            if not t.is_active():
                raise EOFError("the connection closed")
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise self._lost(e) from None

    def close(self) -> None:
        hop = self._conn
        while isinstance(hop, _Hop):  # the node first, then each jump host it went through
            hop.client.close()
            hop = hop.gateway


class _TooMuch(Exception):
    """A node sent more output than a captured command may hold. Private control flow."""


class _LocalError(Exception):
    """Carries an exception raised by a stream's consumer past the connection-error handlers.

    Private control flow inside this module, never seen outside it (so not in errors.py).
    """

    def __init__(self, cause: Exception) -> None:
        super().__init__(cause)
        self.cause = cause


def open(host: Host) -> SSHTransport:  # noqa: A001 - the backend entry point
    return SSHTransport(host).open()
