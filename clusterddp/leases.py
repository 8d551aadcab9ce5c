"""GPU slot leases and the queue, launcher side: take a run's slots on every node, all or nothing,
before it starts; wait for them in a queue shared by every launcher; list them. No daemon: each
node's lease folder holds locked files (``clusterddp/node/lease.py`` says which, and the queue's rule).

Taking a lease on several nodes: each node's check-and-take runs under that node's mutex (held only
for that check, never while waiting for anything else) and without waiting for a slot. A run's first
try asks every node at once (one round trip, not one per node); later tries (a retry while another
launcher is taking the same nodes, a turn in the queue) ask one node at a time, in one order every
launcher uses (by address, port, name). Either way, when a node does not fit, what was taken on the
others is given back, the refusal named is the first node's in that order, and nobody ever waits for
one node's slot while holding another's, so two launchers cannot deadlock. Two that both took half
at once both give it back and retry in order, where they meet on the first node and one wins
outright instead of each holding half again. A node's lease is held by a
holder process that the launcher's SSH channel keeps: if the launcher dies before the job starts, the
channel closes and the holder ends, freeing the slots. At the start the holder runs the job with the
lock files open, so from then on the job's own processes hold them.
"""

from __future__ import annotations

import getpass
import json
import posixpath
import queue
import random
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from . import plan as ssh_plan
from .errors import HostError, LeaseBusy, UsageError
from .fleet import Fleet, GroupResult, as_host_error
from .inventory import Host
from .node import lease as node_lease
from .nodescript import preamble, python_command, q, qpath
from .plan import GO_FILE
from .runspec import fixed_slots
from .runspec import nproc as runspec_nproc
from .transport import Transport

REPLY_TIMEOUT_S = 60.0    # a node's first answer (its mutex waits at most 30 s)
RETRY_STARTING_S = 10.0   # a node busy because another launcher is taking it right now: retry this long
WAIT_POLL_S = 1.0         # how often a waiting run looks at the nodes again


@dataclass(frozen=True)
class Holding:
    """A lease a node reports: ``run`` holds ``slots`` (and ``port``, on its master) there."""

    run: str
    user: str
    since: str
    host: str
    slots: tuple[int, ...]
    port: int | None
    state: str          # starting (taken, job not yet started) or running
    name: str | None = None  # the run's --name

    @property
    def who(self) -> str:
        return who(self.run, self.name, self.user)


@dataclass(frozen=True)
class Waiting:
    """A queue entry a node reports: ``run`` waits for ``need`` slots (or exactly ``slots``)."""

    ticket: str
    run: str
    user: str
    since: str
    need: int | None
    slots: tuple[int, ...] | None
    name: str | None = None  # the run's --name

    @property
    def who(self) -> str:
        return who(self.run, self.name, self.user)


def who(run: str, name: str | None, user: str) -> str:
    """A run as lease and queue messages name it: ``run ID (its --name) of user@machine``."""
    return f"run {run}" + (f" ({name})" if name else "") + f" of {user}"


@dataclass(frozen=True)
class NodeView:
    """What one node's lease folder says: its capacity, live leases and queue (garbled entries counted)."""

    host: str
    capacity: int
    holders: tuple[Holding, ...]
    waiting: tuple[Waiting, ...]
    garbled: int = 0

    @property
    def free(self) -> set[int]:
        return set(range(self.capacity)) - {s for h in self.holders for s in h.slots}


def _view(host: str, reply: dict) -> NodeView:
    hs = [h for h in reply.get("holders", []) if not h["garbled"]]
    ws = [w for w in reply.get("waiting", []) if not w["garbled"]]
    garbled = len(reply.get("holders", [])) + len(reply.get("waiting", [])) - len(hs) - len(ws)
    return NodeView(host, reply.get("capacity", 0),
                    tuple(Holding(h["run"], h["user"], h["since"], h["host"], tuple(h["slots"]), h["port"], h["state"],
                                  h.get("name")) for h in hs),
                    tuple(sorted((Waiting(w["ticket"], w["run"], w["user"], w["since"], w["need"],
                                          tuple(w["slots"]) if w["slots"] else None, w.get("name")) for w in ws),
                                 key=lambda w: w.ticket)),
                    garbled)


def launching_user() -> str:
    """Who launches, as leases name them: ``user@machine`` of the launcher (the nodes' SSH user may be
    one shared account)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "?"
    return f"{user}@{socket.gethostname()}"


def new_ticket(run_id: str) -> str:
    """A queue ticket: the launcher's clock in ns, then the run id. Tickets sort in arrival order
    (up to the launchers' clock skew), and every node sees the same order, so no two waiters each
    wait for the other."""
    return f"{time.time_ns():019d}-{run_id}"


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S%z")


# ---- what a run asks of each node ----

@dataclass(frozen=True)
class Ask:
    """One node's part of a run's lease: ``need`` slots (None: all the node has) or exactly ``slots``;
    ``port``: on the master, the port to lock (``{"fixed": p}``) or where to start looking (``{"from": p}``)."""

    host: Host
    control_dir: str
    need: int | None
    slots: tuple[int, ...] | None
    port: dict | None

    @property
    def wants(self) -> str:
        if self.slots:
            return "slots " + ",".join(map(str, self.slots))
        return f"{self.need} slot(s)" if self.need else "every slot"


def asks(plan: ssh_plan.LaunchPlan, port_fixed: bool) -> list[Ask]:
    """Each node's part of ``plan``'s lease, in the order every launcher takes nodes."""
    out = []
    for n in plan.nodes:
        h = n.host
        fixed = fixed_slots(plan.spec, h)  # --gpus N wins over a host's fixed choice
        nproc = runspec_nproc(plan.spec, h)
        need = nproc if isinstance(nproc, int) else None
        port = None
        if h.name == plan.inventory.master.host:
            port = {"fixed": plan.master_port} if port_fixed else {"from": plan.master_port, "span": 100}
        out.append(Ask(h, n.control_dir, None if fixed else need, fixed, port))
    return sorted(out, key=lambda a: (a.host.address, a.host.port or 22, a.host.name))


def _request(a: Ask, run_id: str, user: str, since: str, name: str | None = None, **extra: object) -> bytes:
    return json.dumps({"dir": lease_dir(a.host), "run": run_id, "name": name, "user": user, "host": a.host.name,
                       "since": since, "need": a.need, "slots": list(a.slots) if a.slots else None,
                       "fallback": a.host.gpus if isinstance(a.host.gpus, int) else 1, **extra}).encode()


# ---- a node program kept running over its SSH channel ----

class _Channel:
    """A node program on one host, running in a thread of its own for as long as it holds something:
    its reply lines come through :meth:`reply`."""

    MAX_LINES = 4  # a holder says two lines (its reply, then "started"); whatever else it sends is dropped
    MAX_NOISE = 1000  # lines that are no reply (a login banner) before the node is not believed

    def __init__(self, host: str, t: Transport, command: str, stdin: bytes) -> None:
        self.host = host
        self._lines: queue.Queue[str | Exception | None] = queue.Queue()
        self._queued = 0      # lines put for the reader (at most MAX_LINES)
        self._partial: list[bytes] = []   # the line being received, in pieces (at most MAX_REPLY bytes)
        self._held = 0
        self._broken = False  # a line over MAX_REPLY was refused: nothing after it is read
        self._noise = 0
        self.thread = threading.Thread(target=self._run, args=(t, command, stdin), daemon=True,
                                       name=f"lease-{host}")
        self.thread.start()

    def _run(self, t: Transport, command: str, stdin: bytes) -> None:
        try:
            t.stream(command, self._data, stdin=stdin, stderr_to=bytearray())
        except Exception as e:  # noqa: BLE001 - the reader gets it as this host's failure
            self._lines.put(e)
        finally:
            self._lines.put(None)

    def _data(self, chunk: bytes) -> None:
        """Reply lines from ``chunk`` (each byte looked at once); bounded however much the node sends."""
        if self._queued >= self.MAX_LINES:
            return  # every line a reader asks for is here: the rest is dropped unread
        start = 0
        while not self._broken and self._queued < self.MAX_LINES and (end := chunk.find(b"\n", start)) >= 0:
            self._add(chunk, start, end)
            if not self._broken:
                line = b"".join(self._partial)
                self._partial, self._held = [], 0
                if not line.startswith(node_lease.MARK.encode()):
                    self._noise += 1
                    if self._noise > self.MAX_NOISE:
                        self._broken = True
                        self._lines.put(ValueError(f"over {self.MAX_NOISE} lines that are no reply"))
                        return
                else:
                    self._queued += 1
                    self._lines.put(line.decode("utf-8", "replace"))
            start = end + 1
        if not self._broken and self._queued < self.MAX_LINES:
            self._add(chunk, start, len(chunk))

    def _add(self, chunk: bytes, start: int, end: int) -> None:
        if self._queued >= self.MAX_LINES or start == end:
            return
        self._held += end - start
        if self._held > node_lease.MAX_REPLY:
            self._broken = True
            self._partial = []
            self._lines.put(ValueError(f"a reply line of over {node_lease.MAX_REPLY} bytes"))
            return
        self._partial.append(chunk[start:end])

    def reply(self, timeout: float = REPLY_TIMEOUT_S) -> dict:
        """The program's next reply, checked; HostError when there is none or it is unreadable."""
        try:
            item = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise HostError(self.host, f"the lease program did not answer within {timeout:g}s") from None
        if item is None:
            raise HostError(self.host, "the lease program ended without answering")
        if isinstance(item, Exception):
            raise item if isinstance(item, HostError) else HostError(self.host, f"lease: {item}")
        try:
            return node_lease.parse_reply(item)
        except ValueError as e:
            raise HostError(self.host, f"unreadable answer from the lease program: {e}") from None


# ---- a run's lease ----

@dataclass
class Lease:
    """A run's lease, held on every node: each node's slots, and the master port."""

    run_id: str
    fleet: Fleet
    grants: dict[str, tuple[int, ...]] = field(default_factory=dict)
    port: int | None = None
    _held: list[Ask] = field(default_factory=list)

    def release(self) -> None:
        """Give back every node's lease whose job was not started (a started job keeps its own until
        it ends). Best effort: a node that does not answer loses its holder with the connection."""
        held, self._held = self._held, []

        def one(h: Host, t: Transport) -> None:
            a = next(x for x in held if x.host.name == h.name)
            t.run(lease_release_command(h, self.run_id, a.control_dir), timeout=30)
        self.fleet.each(one, [a.host for a in held])


def _busy(run_id: str, a: Ask, view: NodeView, why: str | None, never: bool) -> UsageError | LeaseBusy:
    h = a.host.name
    if never:
        return UsageError(f"the run can never fit on {h}: {why}",
                          f"ask for fewer processes (--gpus) or other slots on {h} (gpus: [..] or --hosts {h}:0,1)")
    lines = [f"the run does not fit: it needs {a.wants} on {h}, which has {view.capacity}"
             + (" (the master port is taken)" if why == "port" else "")]
    for x in view.holders:
        lines.append(f"  {h}: slots {','.join(map(str, x.slots))} held by {x.who} since {x.since}"
                     + (f", master port {x.port}" if x.port else "") + f" ({x.state})")
    for w in view.waiting:
        lines.append(f"  {h}: {w.who} waits since {w.since} for "
                     + (f"slots {','.join(map(str, w.slots))}" if w.slots else f"{w.need or 'every'} slot(s)"))
    if view.garbled:
        lines.append(f"  {h}: {view.garbled} unreadable lease file(s) in {lease_dir(a.host)}")
    return LeaseBusy("\n".join(lines), "wait for a turn with `up --wait`, or choose other hosts (--hosts) or fewer "
                     "processes (--gpus); `clusterddp leases INVENTORY` lists every lease", holders=view.holders,
                     run_id=run_id, host=h)


def try_acquire(plan: ssh_plan.LaunchPlan, fleet: Fleet, ask_list: Sequence[Ask], *, user: str,
                ticket: str | None = None, together: bool = False) -> Lease:
    """Take the lease on every node of ``ask_list``, or none: raises LeaseBusy (exit 75) naming who
    holds what on the first node (in ``ask_list``'s order) that does not fit, UsageError when the run
    can never fit. One node after another in that order, stopping at the first refusal; ``together``:
    every node asked at once, and every answer waited for before what was taken is given back (a node
    still answering could otherwise take its part after the release)."""
    lease = Lease(plan.run_id, fleet)
    since = _now()

    def ask(a: Ask) -> _Channel:
        req = _request(a, plan.run_id, user, since, plan.spec.name, ticket=ticket, port=a.port,
                       go=posixpath.join(a.control_dir, ssh_plan.GO_FILE), start=ssh_plan.start_command(
                           next(n for n in plan.nodes if n.host.name == a.host.name)))
        return _Channel(a.host.name, fleet.transport(a.host), lease_command(a.host, "hold"), req)

    def took(a: Ask, reply: dict) -> Exception | None:
        if not reply.get("ok"):
            return _busy(plan.run_id, a, _view(a.host.name, reply), reply.get("why"), reply.get("never", False))
        lease._held.append(a)
        lease.grants[a.host.name] = tuple(reply["slots"])
        if a.port is not None:
            lease.port = reply["port"]
        return None

    try:
        if together:
            channels: list[tuple[Ask, _Channel | Exception]] = []
            for a in ask_list:
                try:
                    channels.append((a, ask(a)))
                except Exception as e:  # noqa: BLE001 - this node's failure, told once every node answered
                    channels.append((a, e))
            failures: list[Exception] = []
            for a, ch in channels:
                try:
                    refused = ch if isinstance(ch, Exception) else took(a, ch.reply())
                except Exception as e:  # noqa: BLE001 - as above
                    refused = e
                if refused is not None:
                    failures.append(refused)
            if failures:
                raise failures[0]
        else:
            for a in ask_list:
                refused = took(a, ask(a).reply())
                if refused is not None:
                    raise refused
    except BaseException:
        lease.release()
        raise
    return lease


def acquire(plan: ssh_plan.LaunchPlan, fleet: Fleet, *, port_fixed: bool, wait: bool = False,
            on_wait: Callable[[str], None] = lambda s: None, user: str | None = None,
            sleep: Callable[[float], object] = time.sleep) -> Lease:
    """The run's lease on every node. Without ``wait`` a run that does not fit raises LeaseBusy, after
    retrying for a few seconds while the nodes it needs are being taken by another launcher right now.
    With ``wait`` it joins the queue on its nodes and waits its turn, telling ``on_wait`` its position
    and what it waits for whenever that changes; Ctrl-C leaves the queue."""
    user = user or launching_user()
    ask_list = asks(plan, port_fixed)
    ticket = new_ticket(plan.run_id) if wait else None
    deadline = time.monotonic() + RETRY_STARTING_S
    first = True
    while True:
        try:
            # The first try asks every node at once; a retry asks them in order (see the module's docstring).
            return try_acquire(plan, fleet, ask_list, user=user, ticket=ticket, together=first)
        except LeaseBusy as e:
            first = False
            if wait:
                break
            starting = any(h.state == "starting" for h in e.holders)
            if not starting or time.monotonic() > deadline:
                raise
            sleep(random.uniform(0.2, 1.0))
    assert ticket is not None
    return _wait(plan, fleet, ask_list, user, ticket, on_wait, sleep)


def _wait(plan: ssh_plan.LaunchPlan, fleet: Fleet, ask_list: Sequence[Ask], user: str, ticket: str,
          on_wait: Callable[[str], None], sleep: Callable[[float], object]) -> Lease:
    since = _now()
    entries: list[Host] = []
    try:
        for a in ask_list:
            ch = _Channel(a.host.name, fleet.transport(a.host), lease_command(a.host, "queue"),
                          _request(a, plan.run_id, user, since, plan.spec.name, ticket=ticket))
            if not ch.reply().get("queued"):
                raise HostError(a.host.name, "the lease program did not queue the run")
            entries.append(a.host)
        said = None
        while True:
            views = list_views(fleet, [a.host for a in ask_list])
            status = _position(ask_list, views, ticket)
            if status != said:
                on_wait(status)
                said = status
            if _may_fit(ask_list, views, ticket):
                try:
                    return try_acquire(plan, fleet, ask_list, user=user, ticket=ticket)
                except LeaseBusy:
                    pass
            sleep(WAIT_POLL_S)
    finally:
        fleet.each(lambda h, t: t.run(queue_leave_command(h, ticket), timeout=30), entries)


def _position(ask_list: Sequence[Ask], views: dict[str, NodeView], ticket: str) -> str:
    """What a waiting run is told: its place in the queue, and who holds the slots it waits for, or,
    when nobody holds them (just given back, or kept for the runs ahead), who comes first."""
    ahead = {w.ticket: w for v in views.values() for w in v.waiting if w.ticket < ticket}
    holders: dict[str, tuple[Holding, list[str]]] = {}
    for a in ask_list:
        v = views[a.host.name]
        for h in v.holders:
            holders.setdefault(h.run, (h, []))[1].append(f"{a.host.name}:{','.join(map(str, h.slots))}")
    where = f"waiting in the queue: position {len(ahead) + 1}; "
    if holders:
        return where + "the slots are held by " + "; ".join(f"{h.who} ({' '.join(at)})" for h, at in holders.values())
    if ahead:
        first = [ahead[t] for t in sorted(ahead)]
        return where + "the slots are free, kept for the run(s) ahead: " + "; ".join(w.who for w in first[:3]) + (
            f" and {len(first) - 3} more" if len(first) > 3 else "")
    return where + "the slots are free now; taking them"


def _may_fit(ask_list: Sequence[Ask], views: dict[str, NodeView], ticket: str) -> bool:
    """Whether every node has room for the run by the queue's rule, as the nodes' files say (the
    take itself decides; this only spares the nodes attempts that cannot succeed)."""
    for a in ask_list:
        v = views[a.host.name]
        earlier = [w for w in v.waiting if w.ticket < ticket]
        reserved = {s for w in earlier if w.slots for s in w.slots}
        count = sum(min(v.capacity, w.need or v.capacity) for w in earlier if not w.slots)
        free = v.free - reserved
        need = len(a.slots) if a.slots else (a.need or v.capacity)
        if (a.slots and not set(a.slots) <= free) or len(free) - need < count:
            return False
    return True


def read_views(fleet: Fleet, hosts: Sequence[Host]) -> GroupResult[str, NodeView]:
    """Every host's lease folder, read in parallel; a host that cannot be read fails on its own."""
    def one(h: Host, t: Transport) -> NodeView:
        req = json.dumps({"dir": lease_dir(h), "fallback": h.gpus if isinstance(h.gpus, int) else 1}).encode()
        res = t.run(lease_command(h, "list"), stdin=req, timeout=REPLY_TIMEOUT_S)
        try:
            return _view(h.name, node_lease.parse_reply(res.text))
        except ValueError as e:
            raise HostError(h.name, f"unreadable answer from the lease program: {e}") from None
    return fleet.each(one, hosts)


def list_views(fleet: Fleet, hosts: Sequence[Host]) -> dict[str, NodeView]:
    """Every host's lease folder; the first host that cannot be read raises its HostError."""
    res = read_views(fleet, hosts)
    first = res.first_failure()
    if first:
        raise as_host_error(*first)
    return dict(res.succeeded)


# ---- the node side (the node program ``clusterddp/node/lease.py``; moved from plan.py) ----

NODE_HOSTNAME = "%h"  # in a lease folder's path: the node's own hostname, filled in on the node


def lease_dir(host: Host) -> str:
    """The node's lease folder: the host's ``lease_dir``, or ``<workdir>/leases/%h``, where ``%h``
    (:data:`NODE_HOSTNAME`) is the node's hostname: hosts that share a workdir (NFS homes) keep
    their slots apart, and every inventory naming the machine finds the same folder."""
    return host.lease_dir or posixpath.join(host.workdir, "leases", NODE_HOSTNAME)


def _qlease(path: str) -> str:
    """A lease folder path (or one below it) as one shell word, ``%h`` as the node's hostname."""
    head, sep, tail = path.partition(NODE_HOSTNAME)
    if not sep:
        return qpath(path)
    return (qpath(head) if head else "") + '"$(hostname)"' + (_qlease(tail) if tail else "")


def lease_command(host: Host, mode: str) -> str:
    """Run node program ``lease`` in ``mode`` (``hold``, ``queue`` or ``list``); its request, JSON,
    goes on stdin (a setup line's stdin is /dev/null, so none can eat it)."""
    lines = preamble(host, (), stdout_to=">/dev/null 2>&1 </dev/null", on_fail=lambda line: "true")
    return "\n".join([*lines, python_command(host.python, "lease", [mode])])


def lease_release_command(host: Host, run_id: str, control_dir: str) -> str:
    """Release the lease of a run whose job was not started: remove its record, which its holder
    watches. A job told to start keeps its lease (the go file exists)."""
    return (f"cd {_qlease(lease_dir(host))} 2>/dev/null || exit 0; "
            f"[ -e {qpath(posixpath.join(control_dir, GO_FILE))} ] || rm -f {q(f'lease-{run_id}.json')}")


def queue_leave_command(host: Host, ticket: str) -> str:
    """Leave the queue: remove the entry, which its waiter process watches (it then ends)."""
    return f"rm -f {_qlease(posixpath.join(lease_dir(host), f'queue-{ticket}.json'))}"
