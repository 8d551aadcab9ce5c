"""The connection layer under every command that talks to several hosts.

One :class:`Fleet` per command (`check`, `exec`, `up` from its preflight to the run's end,
`status`, `stop`, `logs`, `collect`): it opens at most one connection per host, lazily, and
reuses it for every step of that command; hosts are worked on in parallel, at most ``fanout``
at once (pdsh's default is 32, and so is ours). Each host gets its own result, good or bad, in
a :class:`GroupResult`, so one host that is down, slow or refusing us never hides the others'.

Connecting and running are pipelined per host: a host's command starts as soon as *its*
connection is up, so a fleet command takes about as long as its slowest host, not the sum
and not "slowest connect + slowest command".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

from .errors import HostError
from .errors import HostErrorKind as Kind
from .inventory import DEFAULT_FANOUT, RunNode
from .transport import CommandResult, Transport
from .transport import connect as default_connect

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)
R = TypeVar("R")


class GroupResult(dict[K, R | Exception]):
    """Each item's result, or the exception it raised, by key, in the order the items were given.

    Fabric's ``GroupResult`` for our fan-out: ``succeeded`` and ``failed`` split it, so no caller
    pairs items with results by position or sorts exceptions from values itself.
    """

    @property
    def succeeded(self) -> dict[K, R]:
        return {k: v for k, v in self.items() if not isinstance(v, Exception)}

    @property
    def failed(self) -> dict[K, Exception]:
        return {k: v for k, v in self.items() if isinstance(v, Exception)}

    def or_else(self, on_failure: Callable[[K, Exception], R]) -> dict[K, R]:
        """Every item's result, each failure replaced by ``on_failure(key, exception)``, in item order."""
        return {k: on_failure(k, v) if isinstance(v, Exception) else v for k, v in self.items()}

    def first_failure(self) -> tuple[K, Exception] | None:
        """The earliest item's failure (in item order), or None when every item succeeded."""
        return next(iter(self.failed.items()), None)


def fan_out(items: Iterable[T], fn: Callable[[T], R], limit: int = DEFAULT_FANOUT, *,
            key: Callable[[T], K]) -> GroupResult[K, R]:
    """Call ``fn`` on every item in parallel (at most ``limit`` at once): the one parallel primitive.

    Returns each item's result or exception under ``key(item)`` (unique per item), in item order.
    """
    items = tuple(items)
    keys = [key(x) for x in items]
    if len(set(keys)) != len(keys):
        raise ValueError(f"fan_out: keys must be unique, got {keys}")

    def safe(x: T) -> R | Exception:
        try:
            return fn(x)
        except Exception as e:  # noqa: BLE001 - every item's own result, good or bad, is kept
            return e
    if not items:
        return GroupResult()
    pool = ThreadPoolExecutor(max_workers=max(1, min(limit, len(items))))
    try:
        return GroupResult(zip(keys, pool.map(safe, items), strict=True))
    finally:
        # On Ctrl-C, do not wait here for every host's command: the caller closes the connections,
        # which ends them.
        pool.shutdown(wait=False, cancel_futures=True)


def as_host_error(host: str, e: Exception) -> HostError:
    """``e`` as the HostError naming ``host`` (a HostError already names its host)."""
    return e if isinstance(e, HostError) else HostError(host, str(e) or type(e).__name__)


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


N = TypeVar("N", bound=RunNode)


class Fleet(Generic[N]):
    """Connections to ``hosts`` for the length of one command; a context manager that closes them.

    ``connect(host)`` opens a :class:`~clusterddp.transport.Transport` (injectable for tests; a verb
    that reaches a run's nodes passes its backend's ``Reach.connect``). Hosts are an inventory's
    (``Fleet[Host]``) or the nodes a backend reaches (``Fleet[Node]``): only their names are read here.
    A host that failed to connect keeps its error for the rest of the command: it is not
    retried, so every step reports it at once instead of waiting out the timeout again.
    """

    def __init__(self, hosts: Iterable[N], *, fanout: int = DEFAULT_FANOUT,
                 connect: Callable[[N], Transport] = default_connect,
                 clock: Callable[[], float] = time.time) -> None:
        self.hosts = tuple(hosts)
        self.fanout = max(1, fanout)
        self._connect = connect
        self._clock = clock
        self._lock = threading.Lock()
        self._transports: dict[str, Transport] = {}
        self._errors: dict[str, HostError] = {}

    def transport(self, host: N) -> Transport:
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

    def each(self, fn: Callable[[N, Transport], R], hosts: Iterable[N] | None = None,
             on_done: Callable[[str, R | Exception], None] | None = None) -> GroupResult[str, R]:
        """``fn(host, its connection)`` on every host (or only ``hosts``), in parallel; results by host name.

        A host that cannot be reached fails with its connect HostError. ``on_done(host name, result or
        exception)`` is called as each host's ends (from its worker thread), for a caller that reports
        hosts as they answer rather than once the slowest has.
        """
        def one(h: N) -> R:
            try:
                r = fn(h, self.transport(h))
            except Exception as e:
                if on_done is not None:
                    on_done(h.name, e)
                raise
            if on_done is not None:
                on_done(h.name, r)
            return r
        return fan_out(self.hosts if hosts is None else hosts, one, self.fanout, key=lambda h: h.name)

    def open(self, hosts: Iterable[N] | None = None) -> GroupResult[str, Transport]:
        """Connect to every host (or only ``hosts``) now, in parallel: for a step that must know
        every host answers before it does anything on any of them."""
        return self.each(lambda h, t: t, hosts)

    def connected(self, hosts: Iterable[N] | None = None) -> list[N]:
        """Those of the hosts (or of ``hosts``) that have an open connection now."""
        with self._lock:
            return [h for h in (self.hosts if hosts is None else hosts) if h.name in self._transports]

    @property
    def unreachable(self) -> dict[str, HostError]:
        """The hosts that could not be connected to in this command, with why."""
        with self._lock:
            return dict(self._errors)

    def run(self, command: str | Callable[[N], str | tuple[str, bytes]], *, timeout: float | None = None,
            on_output: Callable[[str, bytes], None] | None = None, limit: float | None = None,
            timed_out_code: int | None = None) -> list[HostResult]:
        """Run ``command`` (shell text, or a function rendering it per host, alone or with the bytes
        for its stdin: a ``nodescript.NodeCommand``) on every host.

        With ``on_output`` the output (stdout and stderr merged) is passed on as it arrives and
        the results hold no output; otherwise it is captured. Results come in host order.
        ``timeout`` bounds each wait for data; ``limit`` the whole command on each host: a host
        still running it then fails as timed out, and its connection is closed (also what ends
        the wait on a host whose link died; the others keep their results). A command that ends
        itself at the limit (exit ``timed_out_code``, after ``limit`` s) fails the same way.
        """
        def one(host: N, t: Transport) -> HostResult:
            rendered = command(host) if callable(command) else command
            text, stdin = (rendered, None) if isinstance(rendered, str) else rendered
            started = self._clock()
            expired = threading.Event()
            timer = None
            if limit is not None:
                def expire(host: N = host) -> None:
                    expired.set()
                    self.close_host(host)
                timer = threading.Timer(limit, expire)
                timer.daemon = True
                timer.start()
            def timed_out() -> HostError:
                return HostError(host.name, f"timed out after {limit:g}s (the command is ended on the node; "
                                 "its connection was closed)", kind=Kind.TIMEOUT)
            try:
                if on_output is None:
                    res = t.run(text, timeout=timeout, stdin=stdin)
                else:
                    code = t.stream(text, lambda b: on_output(host.name, b), timeout=timeout, stdin=stdin)
                    res = CommandResult(code, b"", b"")
            except Exception:
                if expired.is_set():
                    raise timed_out() from None
                raise
            finally:
                if timer is not None:
                    timer.cancel()
            if expired.is_set() and res.exit_code == -1:  # paramiko's "no exit status": the channel was closed
                raise timed_out()
            if (limit is not None and timed_out_code is not None and res.exit_code == timed_out_code
                    and self._clock() - started >= limit * 0.9):  # the node's own timer beat ours
                raise timed_out()
            return HostResult(host.name, res, None, started, self._clock())
        return list(self.each(one).or_else(lambda h, e: HostResult(h, None, as_host_error(h, e))).values())

    def close_host(self, host: N) -> None:
        """Close ``host``'s connection now, ending its pending streams. It stays this command's
        connection to that host: later steps on it fail at once with its error, not by connecting again."""
        with self._lock:
            t = self._transports.get(host.name)
        if t is not None:
            _close(t)

    def close(self) -> None:
        with self._lock:
            transports, self._transports = list(self._transports.values()), {}
        for t in transports:
            _close(t)

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _close(t: Transport) -> None:
    try:
        t.close()
    except Exception:  # noqa: BLE001 - closing is best effort; the host may be gone
        pass
