"""Start a plan on its nodes, watch them, fail fast, tear down.

Each node moves through :class:`~clusterddp.record.NodeState`::

    PENDING -> STARTING -> RUNNING -> SUCCEEDED | FAILED | LOST
                                   \\-> STOPPED (teardown after another node failed, or Ctrl-C)

The main loop handles node events one at a time: a node's log stream ended (one thread per
node follows its log), or a heartbeat answered or missed (one heartbeat thread per node, so a
host that hangs delays no other node's event). A node that has not answered a heartbeat for
``lost_after_s`` is LOST. The first node to end badly makes every other node's job be ended
(SIGTERM, then SIGKILL); a LOST node is not waited for: its connection is closed, and its job
runs on there, detached, until a later `stop` (or `status`) reaches it. (`up local` has no
heartbeats: no link to lose.)
The jobs run detached on the nodes, so this process dying does not end them: a later
command reconnects through the run record.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from ... import nodeops
from ... import plan as ssh_plan
from ...errors import HostError, NodeOutcome
from ...fleet import Fleet, GroupResult, as_host_error
from ...inventory import Host
from ...record import NodeState, RunStatus
from ...transport import CommandResult, Transport
from ...transport import connect as default_connect
from ..base import RunOutcome

R = TypeVar("R")

ACTIVE = (NodeState.STARTING, NodeState.RUNNING)

# A dead link is noticed within LOST_AFTER_S (+ the main loop's 1 s tick) of the node's last
# answer, whatever the phase of the heartbeats when it died: the rule is "no answer for that long",
# not "N misses in a row", so a beat hanging on a dead link does not add its own timeout on top.
# A slow but alive node answers every HEARTBEAT_S + its reply time, far inside LOST_AFTER_S.
# A heartbeat is an SSH request asking for a reply (Transport.ping), which the node's sshd answers
# without starting anything; paramiko's own keepalives ask for none, so a dead link never fails
# them (they only keep NAT and firewall state alive).
HEARTBEAT_S = 2.0
LOST_AFTER_S = 8.0
# A node whose torchrun has not joined the rendezvous this long after the run started is named
# (with whether it can reach the master's port) and the run ends, instead of hanging until
# torch's own rendezvous timeout (many minutes). Loading torch on a busy node takes seconds;
# setup lines that install things take longer: `up --join-timeout` raises it (0: never).
JOIN_TIMEOUT_S = 120.0
# Ctrl-C while the nodes start: a start command already sent runs on there (its job would start after
# the teardown and run unwatched), so the teardown waits this long for those in flight to return first.
# A start still in flight then has its connection closed (an upload cut short starts nothing) and is
# named in the record: `clusterddp stop` ends what it may have started.
START_DRAIN_S = 60.0


@dataclass
class Node:
    launch: ssh_plan.NodeLaunch
    state: NodeState = NodeState.PENDING
    exit_code: int | None = None
    error: str | None = None
    answered_at: float = 0.0          # the supervisor's clock when it last heard from the node
    last_miss: str | None = None      # why the latest heartbeat got no answer
    whole: nodeops.Whole | None = None  # the whole log, as its follower sent it (then the collect need not)
    finished: bool = False            # its torchrun said its ranks all finished (it waits for the others)
    restarts: int = 0                 # how many times its torchrun said it restarts its ranks
    tail: bytes = b""                 # the end of its output so far (a line cut between two chunks)

    @property
    def name(self) -> str:
        return self.launch.host.name


@dataclass(frozen=True)
class _Ended:
    """A node's log stream ended: its job's exit code, or why there is none."""

    host: str
    exit_code: int | None
    error: str | None


@dataclass(frozen=True)
class _Beat:
    """A node answered a heartbeat (``error`` None) or did not (why)."""

    host: str
    error: str | None


@dataclass(frozen=True)
class _Said:
    """A node's torchrun said its ranks finished, or that it restarts them (:meth:`Supervisor._scan`)."""

    host: str


@dataclass(frozen=True)
class _NotJoined:
    """The join deadline passed: ``nodes`` ((host, why), the first to name first) never joined."""

    host: str
    nodes: tuple[tuple[str, str], ...]


@dataclass
class Supervisor:
    """Runs one plan. ``on_output(host, bytes)`` gets every node's output as it arrives.

    Its connections come from ``fleet`` (e.g. the preflight's, still open), or else from a fleet
    of its own that opens them with ``connect``. ``sleep(seconds)`` paces the heartbeats; by
    default it returns early when the run ends.
    """

    plan: ssh_plan.LaunchPlan
    on_output: Callable[[str, bytes], None]
    on_state: Callable[[str, NodeState, Node], None] = lambda host, state, node: None
    on_note: Callable[[str], None] = lambda line: None  # what a Ctrl-C while starting waits for
    connect: Callable[[Host], Transport] = default_connect
    fleet: Fleet | None = None
    source_tar: Path | None = None  # the script folder's tarball (jobs.pack), streamed to each node
    heartbeat_s: float = HEARTBEAT_S
    lost_after_s: float = LOST_AFTER_S
    grace_s: float = ssh_plan.DEFAULT_GRACE
    join_timeout_s: float = 0.0   # 0: no join deadline (see JOIN_TIMEOUT_S)
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], object] | None = None
    nodes: list[Node] = field(init=False)

    def __post_init__(self) -> None:
        self.nodes = [Node(n) for n in self.plan.nodes]
        self._by_name = {n.name: n for n in self.nodes}
        if self.fleet is None:
            self.fleet = Fleet([n.host for n in self.plan.nodes], fanout=self.plan.inventory.fanout,
                               connect=self.connect)
        self._fleet: Fleet = self.fleet
        self._events: queue.Queue[_Ended | _Beat | _NotJoined | _Said] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._done = threading.Event()  # set when the run is over: the heartbeats stop
        self._interrupted = False  # Ctrl-C while starting: no further start command is sent
        self._in_flight: set[str] = set()  # nodes whose start command is on its way (guarded by _flight)
        self._flight = threading.Condition()
        self._sleep = self.sleep or self._done.wait

    def _set(self, node: Node, state: NodeState) -> None:
        node.state = state
        self.on_state(node.name, state, node)

    def _node(self, name: str) -> Node:
        return self._by_name[name]

    def _each(self, nodes: list[Node], fn: Callable[[Node, Transport], R]) -> GroupResult[str, R]:
        """``fn(node, its connection)`` on each of ``nodes`` in parallel, through the fleet."""
        return self._fleet.each(lambda h, t: fn(self._node(h.name), t), [n.launch.host for n in nodes])

    # ---- start ----
    def start(self) -> None:
        """Connect to every node, then start its job; on any failure end what started and raise.
        KeyboardInterrupt (Ctrl-C) while starting: no further start is sent, the starts in flight are
        waited for (:data:`START_DRAIN_S`; a second Ctrl-C stops the wait), every job that started is
        ended, and it is raised again; a node whose start was still in flight has its ``error`` say so."""
        hosts = [n.launch.host for n in self.nodes]
        try:
            failed = self._fleet.open(hosts).failed or self._each(self.nodes, self._start_node).failed
        except KeyboardInterrupt:
            self._interrupt_start()
            raise
        if failed:
            for name, e in failed.items():
                node = self._node(name)
                node.error = str(e)
                self._set(node, NodeState.FAILED)
            self.teardown()
            self.close()
            raise as_host_error(*next(iter(failed.items())))

    def _start_node(self, node: Node, t: Transport) -> None:
        """One command (:func:`~clusterddp.plan.start_node_command`): the run folder made, launch.sh
        and the script folder sent, the job started."""
        n = node.launch
        with self._flight:
            if self._interrupted:
                raise HostError(node.name, "not started: interrupted")
            self._in_flight.add(node.name)
        try:
            self._set(node, NodeState.STARTING)
            tar = self.source_tar if self.plan.upload else None
            script = n.launch_script.encode()
            command, steps = ssh_plan.start_node_command(n, tar is not None, self.plan.leased, len(script))
            stdin = script if tar is None else (script, tar)
            self._check(node, t.run(command, stdin=stdin, timeout=600), steps)
            self._set(node, NodeState.RUNNING)
        finally:
            with self._flight:
                self._in_flight.discard(node.name)
                self._flight.notify_all()

    def _interrupt_start(self, drain_s: float = START_DRAIN_S) -> None:
        """Ctrl-C while starting: send no further start, wait for those in flight, end every job."""
        with self._flight:
            self._interrupted = True
        deadline = self.clock() + drain_s
        with self._flight:
            waiting = sorted(self._in_flight)
        if waiting:
            self.on_note(f"[clusterddp] interrupted: waiting (up to {drain_s:.0f} s) for the starts already sent to "
                         f"{', '.join(waiting)}, to end the jobs they start; Ctrl-C again stops waiting")
        try:
            with self._flight:
                while self._in_flight and self.clock() < deadline:
                    self._flight.wait(min(0.5, max(0.0, deadline - self.clock())))
        except KeyboardInterrupt:
            pass  # Ctrl-C again: stop waiting; what is still in flight is named below
        with self._flight:
            late = set(self._in_flight)
        for node in self.nodes:
            if node.name in late:  # its job may start after the teardown: its connection is closed first
                node.error = ("interrupted while its start command was still on its way: its job may have "
                              "started; `clusterddp stop` ends it")
                self._set(node, NodeState.LOST)  # out of reach from here: teardown skips it, `stop` ends it
                self._fleet.close_host(node.launch.host)
            elif node.state is NodeState.PENDING:
                node.error = "not started: interrupted"
        self.teardown()

    def _check(self, node: Node, res: CommandResult, steps: tuple[str, ...]) -> None:
        if res.exit_code != 0:
            detail = res.stderr.decode("utf-8", "replace").strip() or f"exit {res.exit_code}"
            raise HostError(node.name, f"{ssh_plan.failed_step(steps, res.exit_code)}: {detail}")

    # ---- watch ----
    def follow(self) -> RunOutcome:
        """Stream every node's output until the run ends; end everything on the first failure.

        KeyboardInterrupt (Ctrl-C, or SIGTERM mapped to it by the CLI) ends every node's job and
        re-raises after the outcome is recorded in ``self.outcome``.
        """
        now = self.clock()
        for node in self.nodes:
            node.answered_at = now
            t = self._fleet.transport(node.launch.host)
            self._spawn(self._stream, node, t, name=f"stream-{node.name}")
            if self._beats:
                # Not joined: a heartbeat may hang on a dead host until its connection is closed.
                threading.Thread(target=self._heartbeats, args=(node, t), name=f"heartbeat-{node.name}",
                                 daemon=True).start()
        if self.join_timeout_s > 0 and not self.plan.local:
            threading.Thread(target=self._join_deadline, name="join-deadline", daemon=True).start()
        try:
            try:
                first_failed = self._watch()
            finally:
                self._done.set()
        except KeyboardInterrupt:
            self.teardown()
            self.outcome = self._outcome(RunStatus.STOPPED, None)
            raise
        if first_failed:
            self.teardown()
            self.outcome = self._outcome(RunStatus.FAILED, first_failed)
        else:
            self._join()
            self.outcome = self._outcome(RunStatus.SUCCEEDED, None)
        return self.outcome

    def _watch(self) -> str | None:
        """Handle node events until every node has ended, or one ended badly: then return its name."""
        while any(n.state in ACTIVE for n in self.nodes):
            try:
                event = self._events.get(timeout=1.0)  # wakes up now and then: Ctrl-C and silent nodes are seen
            except queue.Empty:
                event = None
            node = None if event is None else self._node(event.host)
            if isinstance(event, _NotJoined):
                named = [(self._node(h), why) for h, why in event.nodes if self._node(h).state in ACTIVE]
                for n, why in named:
                    n.error = why
                    self._set(n, NodeState.FAILED)
                if named:
                    return named[0][0].name
            elif isinstance(event, _Said):
                split = self._split()
                if split is not None:
                    return split
            elif event is not None and node is not None and node.state in ACTIVE:
                if isinstance(event, _Beat):
                    if event.error is None:
                        node.answered_at = self.clock()
                    else:
                        node.last_miss = event.error
                else:
                    node.exit_code, node.error = event.exit_code, event.error
                    self._set(node, NodeState.of_exit_code(event.exit_code))
                    if node.state is not NodeState.SUCCEEDED:
                        return node.name
            silent = self._silent()
            if silent is not None:
                return silent
        return None

    def _scan(self, node: Node, data: bytes) -> None:
        """Watch a node's output for torchrun's word that its ranks all finished, or that it restarts
        them: one node finished while another restarts is a split (:meth:`_split`)."""
        from ...failure import FINISHED_LINE, RESTART_LINE
        text = (node.tail + data).decode("utf-8", "replace")
        node.tail = (node.tail + data).rsplit(b"\n", 1)[-1][-512:]  # a line cut between two chunks
        lines = text.split("\n")[:-1]  # whole lines only: the last one comes again, whole, with the next chunk
        finished = any(FINISHED_LINE.search(line) for line in lines)
        restarts = sum(1 for line in lines if RESTART_LINE.search(line))
        if (finished and not node.finished) or restarts:
            node.finished, node.restarts = node.finished or finished, node.restarts + restarts
            self._events.put(_Said(node.name))

    def _split(self) -> str | None:
        """A node whose torchrun finished (and waits in its exit barrier, for up to 5 minutes) while
        another node's restarts its ranks: they did not run the same steps, and nothing would end
        the wait. Marked FAILED (its name returned) so the attempt ends now; the root cause says why
        (:func:`clusterddp.failure.diverged`). None when no node is in that state."""
        done = [n for n in self.nodes if n.finished and n.state in ACTIVE]
        if not done:
            return None
        node = done[0]  # a restart of every node at once (a rank failed) is torchrun's own: not a split
        again = [n for n in self.nodes if not n.finished and n.restarts > node.restarts and n.state in ACTIVE]
        if not again:
            return None
        node.error = (f"its ranks finished while {', '.join(n.name for n in again)} restarts its ranks: "
                      "they resumed from different points")
        self._set(node, NodeState.FAILED)
        return node.name

    @property
    def _beats(self) -> bool:
        """Heartbeats watch the links to the nodes. `up local` has none that could die, and each beat
        (a shell and a scan of /proc) would take the CPUs from the job it watches: none there."""
        return not self.plan.local

    def _silent(self) -> str | None:
        """Mark LOST the first running node that has not answered for ``lost_after_s``; its name, or None."""
        if not self._beats:
            return None
        now = self.clock()
        for node in self.nodes:
            if node.state is NodeState.RUNNING and now - node.answered_at >= self.lost_after_s:
                node.error = (f"stopped answering: no answer to heartbeats for {now - node.answered_at:.0f}s"
                              + (f" ({node.last_miss})" if node.last_miss else ""))
                self._set(node, NodeState.LOST)
                return node.name
        return None

    def _spawn(self, target: Callable[..., None], *args: object, name: str) -> None:
        th = threading.Thread(target=target, args=args, name=name, daemon=True)
        th.start()
        self._threads.append(th)

    def _stream(self, node: Node, t: Transport) -> None:
        """A node's thread: follow its log to the end, then post how its job ended."""
        try:
            def output(b: bytes) -> None:
                self._scan(node, b)
                self.on_output(node.name, b)
            followed = nodeops.follow(t, node.launch, output)
            st, node.whole = followed.status, followed.whole  # set before _Ended is posted, read after it
            if st.state is NodeState.RUNNING:  # the follower ended early (e.g. log rotated); count it as lost
                self._events.put(_Ended(node.name, None, "log stream ended while the job still runs"))
            else:
                self._events.put(_Ended(node.name, st.exit_code, st.why))
        except HostError as e:
            self._events.put(_Ended(node.name, None, str(e)))
        except Exception as e:  # noqa: BLE001 - e.g. the log disk is full: the run must not wait forever
            self._events.put(_Ended(node.name, None, f"following the log failed here: {e}"))

    def _join_deadline(self) -> None:
        """After ``join_timeout_s``, ask every running node whether its torchrun joined the
        rendezvous and whether it reaches the master's port; post the ones that did not join.
        Who is named, and why: :func:`clusterddp.failure.not_joined`."""
        if self._done.wait(self.join_timeout_s):
            return
        from ...failure import not_joined
        from ...postmortem import report
        master = (self.plan.master_addr, self.plan.master_port)
        running = [n for n in self.nodes if n.state is NodeState.RUNNING]
        res = self._each(running, lambda node, t: report(t, node.launch, "joined", master))
        late = {h: a for h, a in res.succeeded.items() if not a["joined"]}
        if not late or self._done.is_set():
            return
        named = not_joined({h: a["reach"] for h, a in late.items()}, self.plan.inventory.master.host, master,
                           self.join_timeout_s)
        order = {n.name: i for i, n in enumerate(self.nodes)}
        named.sort(key=lambda hw: order[hw[0]])
        self._events.put(_NotJoined(named[0][0], tuple(named)))

    def _heartbeats(self, node: Node, t: Transport) -> None:
        """A node's heartbeat thread: every ``heartbeat_s`` ping its connection (:meth:`Transport.ping`:
        nothing runs on the node; a ping on a dead link waits until the connection is closed, and the
        main loop has called the node lost ``lost_after_s`` after its last answer) and post the answer
        or the miss. The job's own state comes from its log stream, which ends when the job does."""
        while True:
            self._sleep(self.heartbeat_s)
            if self._done.is_set() or node.state is not NodeState.RUNNING:
                return
            try:
                t.ping()  # runs nothing on the node: a status command there cost a shell and a /proc scan
            except Exception as e:  # noqa: BLE001 - any failure to answer is a miss
                self._events.put(_Beat(node.name, str(e) or type(e).__name__))
            else:
                self._events.put(_Beat(node.name, None))

    # ---- stop ----
    def teardown(self) -> None:
        """End the job on every node that may still run something of it; record final exit codes.

        A LOST node is not waited for: its connection is closed first (ending its log stream and
        heartbeat), and its job is left to a later `stop`."""
        for node in self.nodes:
            if node.state is NodeState.LOST:
                self._fleet.close_host(node.launch.host)
        connected = {h.name for h in self._fleet.connected([n.launch.host for n in self.nodes])}

        def end(node: Node, t: Transport) -> None:
            done = nodeops.teardown(t, node.launch, self.grace_s)
            if node.state in ACTIVE:
                node.exit_code = done.status.exit_code
                self._set(node, NodeState.STOPPED)
        res = self._each([n for n in self.nodes if n.name in connected and n.state is not NodeState.LOST], end)
        for name, e in res.failed.items():
            node = self._node(name)
            if node.state in ACTIVE:
                node.error = f"teardown failed: {e}"
                self._set(node, NodeState.LOST)
                self._fleet.close_host(node.launch.host)  # a dead host's log stream would otherwise wait for TCP
        self._join()

    def _join(self, timeout: float = 10.0) -> None:
        deadline = self.clock() + timeout
        for th in self._threads:
            th.join(max(0.0, deadline - self.clock()))

    def close(self) -> None:
        self._done.set()
        self._fleet.close()

    def outcomes(self) -> tuple[NodeOutcome, ...]:
        """Every node's outcome so far."""
        return tuple(NodeOutcome(n.name, n.launch.node_rank, n.exit_code, n.error) for n in self.nodes)

    def _outcome(self, status: RunStatus, first_failed: str | None) -> RunOutcome:
        return RunOutcome(status, self.outcomes(), first_failed)
