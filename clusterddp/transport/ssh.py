"""SSH transport on paramiko: ssh_config resolves the connection, paramiko channels run commands.

The only module that imports paramiko. ``~/.ssh/config`` and ``/etc/ssh/ssh_config`` fill what
the inventory leaves unset (address alias -> HostName, User, Port, IdentityFile) and supply
ProxyJump / ProxyCommand, as OpenSSH reads them (first value wins). Host keys are always checked
against the inventory's ``known_hosts``: ``strict`` refuses unknown and changed keys,
``accept-new`` records unknown ones and still refuses changed ones. Agent forwarding is never
enabled. Fabric, which used to read ssh_config here, is not used: paramiko's SSHConfig does that
part, and the CLI keeps invoke (imported by both, for ssh_config ``Match exec`` only) unloaded.
"""

from __future__ import annotations

import ctypes
import getpass
import io
import logging
import os
import socket
import threading
from dataclasses import dataclass
from typing import Callable

import paramiko

from ..errors import HostError
from ..inventory import Host
from .base import CommandResult

_known_hosts_lock = threading.Lock()


class _LocalError(Exception):
    """Carries an exception raised by a stream's consumer past the connection-error handlers."""
# paramiko logs failures on its own threads (a banner timeout, a reset) with tracebacks, which
# Python's last-resort handler would print; every failure already reaches the user as a HostError.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

# paramiko starts a re-key after 512 MiB; a channel closing while that re-key is pending
# deadlocks its transport thread until "Key-exchange timed out waiting for key negotiation"
# (paramiko issue #822), so any fetch past 512 MiB on one connection failed. Leave re-keying
# to the server (OpenSSH re-keys on its own schedule), which does not hit that race.
paramiko.packet.Packetizer.REKEY_BYTES = 1 << 62
paramiko.packet.Packetizer.REKEY_PACKETS = 1 << 62

# Throughput (bench/collect_speed.py): paramiko prefers aes128-ctr + hmac-sha2-256, whose MAC
# and per-packet work cost far more in Python than AES-GCM (an AEAD, one C call per packet);
# OpenSSH servers offer GCM by default: a 256 MiB stream went from about 1.8 s to 1.4 s. Channels
# also allow 128 KiB packets and a 4 MiB window (paramiko: 32 KiB, 2 MiB), though OpenSSH sends
# a command's output in 32 KiB packets whatever the client allows (it reads its pipe 32 KiB at
# a time); sizes from 512 KiB to 16 MiB windows measured alike.
_PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
_WINDOW = 4 << 20
_MAX_PACKET = 128 << 10


def _reuse_freed_memory() -> None:
    """Let glibc's malloc keep and reuse the buffers a bulk stream churns through.

    paramiko's channel buffer grows and drains for every chunk read, and each chunk is a fresh
    bytes object of up to 1 MiB. With glibc's defaults, blocks over 128 KiB (the threshold moves,
    but the heap is trimmed back each time) come from fresh zeroed pages, so every MiB fetched
    costs page faults several times over. Serving blocks up to 8 MiB from the heap and trimming
    it only past 32 MiB free made a 256 MiB collect about 0.15 s (9%) faster (measured with
    interleaved runs). Other C libraries: nothing to do.
    """
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 8 << 20)   # M_MMAP_THRESHOLD
        libc.mallopt(-1, 32 << 20)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


_reuse_freed_memory()


def _transport_factory(sock: socket.socket, **kwargs) -> paramiko.Transport:
    t = paramiko.Transport(sock, **kwargs)
    opts = t.get_security_options()
    first = tuple(c for c in _PREFERRED_CIPHERS if c in opts.ciphers)
    opts.ciphers = first + tuple(c for c in opts.ciphers if c not in first)
    return t


class _AcceptNew(paramiko.MissingHostKeyPolicy):
    """Like OpenSSH's ``StrictHostKeyChecking=accept-new``: remember unknown keys, never changed ones."""

    def __init__(self, path: str) -> None:
        self.path = path

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        with _known_hosts_lock:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            with io.open(self.path, "a", encoding="utf-8") as f:  # open() is this module's entry point
                f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


@dataclass(frozen=True)
class _Hop:
    """One SSH server on the way to a node (a ProxyJump host or the node itself)."""

    hostname: str
    user: str
    port: int
    keys: tuple[str, ...]  # identity files to offer, the inventory's first

    def __str__(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}"


def _ssh_config() -> paramiko.SSHConfig:
    cfg = paramiko.SSHConfig()
    for path in (os.path.expanduser("~/.ssh/config"), "/etc/ssh/ssh_config"):
        if os.path.isfile(path):
            with io.open(path, encoding="utf-8", errors="replace") as f:  # open() is this module's entry point
                cfg.parse(f)
    return cfg


def _route(host: Host, cfg: paramiko.SSHConfig) -> tuple[list[_Hop], str | None]:
    """The hops to ``host`` (jump hosts first, the node last) and a ProxyCommand, if any."""
    def hop(alias: str, user: str | None, port: int | None, key: str | None) -> tuple[_Hop, dict]:
        found = cfg.lookup(alias)
        keys = ((os.path.expanduser(key),) if key else ()) + tuple(found.get("identityfile", ()))
        return _Hop(found["hostname"], user or found.get("user") or getpass.getuser(),
                    port or int(found.get("port", 22)), keys), found
    node, found = hop(host.address, host.user, host.port, host.identity_file)
    jumps = []
    for spec in (found.get("proxyjump") or "none").split(","):
        if spec.strip().lower() == "none":
            continue
        user, _, rest = spec.strip().rpartition("@")
        name, _, port = rest.partition(":")
        jumps.append(hop(name, user or None, int(port) if port else None, host.identity_file)[0])
    return jumps + [node], None if jumps else found.get("proxycommand")


class SSHTransport:
    """One SSH connection to one host; each command gets its own channel (thread-safe)."""

    def __init__(self, host: Host) -> None:
        self.name = host.name
        self.host = host
        self._known = os.path.expanduser(host.known_hosts)
        self._clients: list[paramiko.SSHClient] = []  # jump hosts first, the node last
        self._hops: list[_Hop] = []
        self._transport: paramiko.Transport | None = None

    def open(self) -> "SSHTransport":
        try:
            self._open()
        except BaseException:
            self.close()  # paramiko leaves the socket and its thread up after a refused key or login
            raise
        if self.host.keepalive > 0:
            self._transport.set_keepalive(max(1, int(self.host.keepalive)))
        return self

    def _open(self) -> None:
        try:
            hops, proxy_command = _route(self.host, _ssh_config())
        except ImportError:  # paramiko runs `Match exec` through invoke, which the CLI keeps unloaded
            raise HostError(self.name, "clusterddp does not run ssh_config `Match exec` blocks",
                            "move that block out of ~/.ssh/config, or match on host names instead") from None
        except (paramiko.SSHException, ValueError, KeyError) as e:
            raise HostError(self.name, f"cannot use the ssh_config entry for {self.host.address}: {e}",
                            "check ~/.ssh/config (clusterddp reads HostName, User, Port, IdentityFile, "
                            "ProxyJump, ProxyCommand)") from None
        sock = paramiko.ProxyCommand(proxy_command) if proxy_command else None
        for hop in hops:
            if self._clients:  # through the previous hop, like ssh -J
                try:
                    sock = self._clients[-1].get_transport().open_channel(
                        "direct-tcpip", (hop.hostname, hop.port), ("127.0.0.1", 0),
                        timeout=self.host.connect_timeout)
                except (paramiko.SSHException, OSError, EOFError) as e:
                    raise HostError(self.name, f"jump host {self._hops[-1]} cannot reach {hop}: {e}",
                                    "check ProxyJump in ~/.ssh/config and that the jump host allows "
                                    "TCP forwarding") from None
            self._clients.append(self._connect(hop, sock))
            self._hops.append(hop)
        self._transport = self._clients[-1].get_transport()

    def _connect(self, hop: _Hop, sock: object) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        if os.path.exists(self._known):
            client.load_host_keys(self._known)
        client.set_missing_host_key_policy(
            _AcceptNew(self._known) if self.host.host_key_policy == "accept-new" else paramiko.RejectPolicy())
        # connect_timeout bounds every stage of the handshake, not only the TCP connect, so a host
        # that accepts the connection but never answers is reported as fast as one that is down.
        t = self.host.connect_timeout
        try:
            client.connect(hop.hostname, hop.port, hop.user, key_filename=list(hop.keys) or None, sock=sock,
                           timeout=t, banner_timeout=t, auth_timeout=t, allow_agent=True,
                           transport_factory=_transport_factory)
        except BaseException as e:
            client.close()
            raise self._located(e, hop) from None
        return client

    def _located(self, e: BaseException, hop: _Hop) -> BaseException:
        """The HostError (naming the hop and what to do) for a failed connect; other errors as they are."""
        if isinstance(e, paramiko.BadHostKeyException):
            return HostError(self.name, f"host key for {hop.hostname} has CHANGED (refused)",
                             f"if the host was reinstalled, verify its new key and remove the old one with "
                             f"`ssh-keygen -R {hop.hostname} -f {self._known}`")
        if isinstance(e, paramiko.AuthenticationException):
            return HostError(self.name, f"authentication failed for {hop}: {e}",
                             "check user and identity_file in the inventory, or your ssh-agent")
        if isinstance(e, paramiko.SSHException):
            if "not found in known_hosts" in str(e):
                return HostError(self.name, f"host key of {hop.hostname} is unknown (host_key_policy: strict)",
                                 f"verify the host and add its key: `ssh-keyscan -H {hop.hostname} >> "
                                 f"{self._known}`, or set host_key_policy: accept-new")
            if "No authentication methods available" in str(e):
                return HostError(self.name, f"no SSH key to log in to {hop} with",
                                 "set identity_file in the inventory, add IdentityFile to ~/.ssh/config, "
                                 "or load a key into ssh-agent")
            if "banner" in str(e):  # TCP connected, but no SSH greeting within banner_timeout
                return HostError(self.name, f"{hop} accepted the connection but sent no SSH greeting "
                                            f"within {self.host.connect_timeout:g}s",
                                 "check that sshd (not another service) listens there and is not overloaded")
            return HostError(self.name, f"SSH to {hop} failed: {e}")
        if isinstance(e, (socket.timeout, TimeoutError)):
            return HostError(self.name, f"no answer from {hop} within {self.host.connect_timeout:g}s",
                             "check that the host is up and the address and port are right")
        if isinstance(e, OSError):
            return HostError(self.name, f"cannot connect to {hop}: {e.strerror or e}",
                             "check that the host is up, sshd runs, and the address and port are right")
        return e

    def _channel(self, command: str, timeout: float | None) -> paramiko.Channel:
        try:
            chan = self._transport.open_session(window_size=_WINDOW, max_packet_size=_MAX_PACKET,
                                                     timeout=timeout or self.host.connect_timeout)
            chan.settimeout(timeout)
            chan.exec_command(command)
            return chan
        except (paramiko.SSHException, OSError, EOFError, AttributeError) as e:
            raise HostError(self.name, f"connection lost: {e or type(e).__name__}") from None

    def run(self, command: str, *, timeout: float | None = None, stdin: bytes | None = None) -> CommandResult:
        chan = self._channel(command, timeout)
        out, err = bytearray(), bytearray()
        try:
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
            while True:
                if chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                    continue
                chunk = chan.recv(65536)
                if not chunk:
                    break
                out += chunk
            while chunk := chan.recv_stderr(65536):
                err += chunk
            code = chan.recv_exit_status()
        except socket.timeout:
            raise HostError(self.name, f"command timed out after {timeout:g}s") from None
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise HostError(self.name, f"connection lost: {e or type(e).__name__}") from None
        finally:
            chan.close()
        return CommandResult(code, bytes(out), bytes(err))

    def stream(self, command: str, on_data: Callable[[bytes], None], *, timeout: float | None = None,
               stderr_to: bytearray | None = None, stdin: bytes | None = None) -> int:
        chan = self._channel(command, timeout)
        chan.set_combine_stderr(stderr_to is None)
        try:
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
            while chunk := chan.recv(1 << 20):
                try:
                    on_data(chunk)
                except Exception as e:  # a local failure (full disk, closed pipe) is not "connection lost"
                    raise _LocalError(e) from e
            if stderr_to is not None:
                while chunk := chan.recv_stderr(65536):
                    stderr_to += chunk
            return chan.recv_exit_status()
        except socket.timeout:
            raise HostError(self.name, f"no data for {timeout:g}s") from None
        except _LocalError as e:
            raise e.__cause__ from None
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise HostError(self.name, f"connection lost: {e or type(e).__name__}") from None
        finally:
            chan.close()

    def close(self) -> None:
        for client in reversed(self._clients):
            client.close()


def open(host: Host) -> SSHTransport:  # noqa: A001 - the backend entry point
    return SSHTransport(host).open()
