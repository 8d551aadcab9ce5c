"""The connection layer under every command that talks to several hosts.

One :class:`Fleet` per command: it opens at most one connection per host, lazily, and
reuses it for every step of that command; hosts are worked on in parallel, at most
``fanout`` at once (pdsh's default is 32, and so is ours). Each host gets its own result,
good or bad, so one host that is down, slow or refusing us never hides the others'.

Connecting and running are pipelined per host: a host's command starts as soon as *its*
connection is up, so a fleet command takes about as long as its slowest host, not the sum
and not "slowest connect + slowest command".
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence, TypeVar

from .errors import HostError
from .inventory import DEFAULT_FANOUT, Host
from .transport import CommandResult, Transport
from .transport import connect as default_connect

T = TypeVar("T")
R = TypeVar("R")


def fan_out(items: Sequence[T], fn: Callable[[T], R], limit: int = DEFAULT_FANOUT) -> list[R | Exception]:
    """Call ``fn`` on every item in parallel (at most ``limit`` at once); results or exceptions, in order."""
    def safe(x: T) -> R | Exception:
        try:
            return fn(x)
        except Exception as e:  # noqa: BLE001 - every host's own result, good or bad, is kept
            return e
    if not items:
        return []
    pool = ThreadPoolExecutor(max_workers=max(1, min(limit, len(items))))
    try:
        return list(pool.map(safe, items))
    finally:
        # On Ctrl-C, do not wait here for every host's command: the caller closes the connections,
        # which ends them.
        pool.shutdown(wait=False, cancel_futures=True)


@dataclass(frozen=True)
class HostResult:
    """One host's outcome of one fleet command.

    ``error`` is set when the host could not be reached or stopped answering (then there is
    no exit code); otherwise ``result`` holds the command's exit code and output. ``started``
    and ``ended`` are this machine's wall-clock times around the command (for clock skew).
    """

    host: str
    result: CommandResult | None = None
    error: HostError | None = None
    started: float = 0.0
    ended: float = 0.0

    @property
    def exit_code(self) -> int | None:
        return None if self.result is None else self.result.exit_code

    @property
    def ok(self) -> bool:
        return self.error is None and self.exit_code == 0


class Fleet:
    """Connections to ``hosts`` for the length of one command; a context manager that closes them.

    ``connect(host)`` opens a :class:`~clusterddp.transport.Transport` (injectable for tests).
    A host that failed to connect keeps its error for the rest of the command: it is not
    retried, so every step reports it at once instead of waiting out the timeout again.
    """

    def __init__(self, hosts: Iterable[Host], *, fanout: int = DEFAULT_FANOUT,
                 connect: Callable[[Host], Transport] = default_connect,
                 clock: Callable[[], float] = time.time) -> None:
        self.hosts = tuple(hosts)
        self.fanout = max(1, fanout)
        self._connect = connect
        self._clock = clock
        self._lock = threading.Lock()
        self._transports: dict[str, Transport] = {}
        self._errors: dict[str, HostError] = {}

    def transport(self, host: Host) -> Transport:
        """The open connection to ``host``, opened now if this command has none yet."""
        with self._lock:
            if host.name in self._transports:
                return self._transports[host.name]
            if host.name in self._errors:
                raise self._errors[host.name]
        try:
            t = self._connect(host)
        except HostError as e:
            err = e
        except Exception as e:  # noqa: BLE001 - a bug or odd failure in one host's connect stays that host's
            err = HostError(host.name, f"cannot connect: {e or type(e).__name__}")
        else:
            with self._lock:
                self._transports[host.name] = t
            return t
        with self._lock:
            self._errors[host.name] = err
        raise err

    def run(self, command: str | Callable[[Host], str], *, timeout: float | None = None,
            on_output: Callable[[str, bytes], None] | None = None) -> list[HostResult]:
        """Run ``command`` (shell text, or a function rendering it per host) on every host.

        With ``on_output`` the output (stdout and stderr merged) is passed on as it arrives and
        the results hold no output; otherwise it is captured. Results come in host order.
        """
        def one(host: Host) -> HostResult:
            started = self._clock()
            try:
                t = self.transport(host)
                text = command(host) if callable(command) else command
                if on_output is None:
                    res = t.run(text, timeout=timeout)
                else:
                    code = t.stream(text, lambda b: on_output(host.name, b), timeout=timeout)
                    res = CommandResult(code, b"", b"")
            except HostError as e:
                return HostResult(host.name, None, e, started, self._clock())
            return HostResult(host.name, res, None, started, self._clock())
        results = fan_out(self.hosts, one, self.fanout)
        return [r if isinstance(r, HostResult) else HostResult(h.name, None, HostError(h.name, str(r)))
                for h, r in zip(self.hosts, results)]

    def take(self, host: Host) -> Transport:
        """Hand the connection to ``host`` over to the caller, who then closes it.

        Shaped like :func:`clusterddp.transport.connect`, so a later step (the supervisor)
        reuses the connections an earlier step (the preflight) opened.
        """
        t = self.transport(host)
        with self._lock:
            self._transports.pop(host.name, None)
        return t

    def close(self) -> None:
        with self._lock:
            transports, self._transports = list(self._transports.values()), {}
        for t in transports:
            try:
                t.close()
            except Exception:  # noqa: BLE001 - closing is best effort; the host may be gone
                pass

    def __enter__(self) -> "Fleet":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
