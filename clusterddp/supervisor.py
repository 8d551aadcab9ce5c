"""Start a plan on its nodes, watch them, fail fast, tear down.

Each node moves through :class:`~clusterddp.record.NodeState`::

    PENDING -> STARTING -> RUNNING -> SUCCEEDED | FAILED | LOST
                                   \\-> STOPPED (teardown after another node failed, or Ctrl-C)

The main loop waits for node events (a node's log stream ended, or a heartbeat missed);
the first node to end badly makes every other node's job be ended (SIGTERM, then SIGKILL).
The jobs run detached on the nodes, so this process dying does not end them: a later
command reconnects through the run record.
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field
from threading import Thread
from typing import Callable

from . import plan as P
from .errors import HostError, NodeOutcome
from .fleet import fan_out  # the one parallel layer
from .record import NodeState, RunStatus, from_report
from .transport import Transport
from .transport import connect as default_connect


ACTIVE = (NodeState.STARTING, NodeState.RUNNING)


@dataclass
class Node:
    launch: P.NodeLaunch
    transport: Transport | None = None
    state: NodeState = NodeState.PENDING
    exit_code: int | None = None
    error: str | None = None
    misses: int = 0

    @property
    def name(self) -> str:
        return self.launch.host.name


@dataclass(frozen=True)
class RunOutcome:
    """How a run ended (a terminal :class:`RunStatus`), with every node's outcome."""

    status: RunStatus
    nodes: tuple[NodeOutcome, ...]
    first_failed: str | None = None

    @property
    def exit_code(self) -> int:
        code = self.status.exit_code
        assert code is not None, "a run outcome is never `running`"
        return code


def parse_status(text: str) -> tuple[str, int | None]:
    """Parse :func:`plan.status_command` output: (``running``|``exited``|``lost``|``missing``, exit code).

    :func:`clusterddp.record.from_report` says which :class:`NodeState` that is.
    """
    word, _, rest = text.strip().partition(" ")
    if word == "exit":
        try:
            return "exited", int(rest)
        except ValueError:
            return "exited", None
    return (word if word in ("running", "lost", "missing") else "lost"), None


@dataclass
class Supervisor:
    """Runs one plan. ``on_output(host, bytes)`` gets every node's output as it arrives."""

    plan: P.LaunchPlan
    on_output: Callable[[str, bytes], None]
    on_state: Callable[[str, NodeState, Node], None] = lambda host, state, node: None
    connect: Callable = default_connect
    source_tar: bytes | None = None
    heartbeat_s: float = 10.0
    max_misses: int = 2
    grace_s: float = P.DEFAULT_GRACE
    clock: Callable[[], float] = time.monotonic
    nodes: list[Node] = field(init=False)

    def __post_init__(self) -> None:
        self.nodes = [Node(n) for n in self.plan.nodes]
        self._events: queue.Queue = queue.Queue()
        self._threads: list[Thread] = []

    def _set(self, node: Node, state: NodeState) -> None:
        node.state = state
        self.on_state(node.name, state, node)

    # ---- start ----
    def start(self) -> None:
        """Connect to every node and start its job; on any failure end what started and raise."""
        def connect(node: Node) -> None:
            node.transport = self.connect(node.launch.host)
        limit = self.plan.inventory.fanout
        errors = [(n, e) for n, e in zip(self.nodes, fan_out(self.nodes, connect, limit))
                  if isinstance(e, Exception)]
        if not errors:
            errors = [(n, e) for n, e in zip(self.nodes, fan_out(self.nodes, self._start_node, limit))
                      if isinstance(e, Exception)]
        if errors:
            for n, e in errors:
                n.error = str(e)
                self._set(n, NodeState.FAILED)
            self.teardown()
            self.close()
            first = errors[0][1]
            raise first if isinstance(first, HostError) else HostError(errors[0][0].name, str(first))

    def _start_node(self, node: Node) -> None:
        t, n = node.transport, node.launch
        assert t is not None
        self._set(node, NodeState.STARTING)
        self._check(node, t.run(P.prepare_command(n), timeout=60), "cannot create the run folder")
        if self.plan.upload and self.source_tar is not None:
            self._check(node, t.run(P.upload_command(n.control_dir + "/source.tar.gz"), stdin=self.source_tar,
                                    timeout=600), "cannot upload the script folder")
            self._check(node, t.run(P.unpack_command(n), timeout=600), "cannot unpack the script folder")
        self._check(node, t.run(P.upload_command(n.control_dir + "/launch.sh"),
                                stdin=n.launch_script.encode(), timeout=60), "cannot write launch.sh")
        self._check(node, t.run(P.start_command(n), timeout=60), "cannot start the job")
        self._set(node, NodeState.RUNNING)

    def _check(self, node: Node, res, what: str) -> None:
        if res.exit_code != 0:
            detail = res.stderr.decode("utf-8", "replace").strip() or f"exit {res.exit_code}"
            raise HostError(node.name, f"{what}: {detail}")

    # ---- watch ----
    def follow(self) -> RunOutcome:
        """Stream every node's output until the run ends; end everything on the first failure.

        KeyboardInterrupt (Ctrl-C, or SIGTERM mapped to it by the CLI) ends every node's job and
        re-raises after the outcome is recorded in ``self.outcome``.
        """
        for node in self.nodes:
            th = Thread(target=self._stream, args=(node,), name=f"stream-{node.name}", daemon=True)
            th.start()
            self._threads.append(th)
        first_failed: str | None = None
        next_beat = self.clock() + self.heartbeat_s
        try:
            while any(n.state in ACTIVE for n in self.nodes):
                try:
                    name, code, error = self._events.get(timeout=min(1.0, self.heartbeat_s))
                except queue.Empty:
                    if self.clock() >= next_beat:
                        self._heartbeat()
                        next_beat = self.clock() + self.heartbeat_s
                        first_failed = first_failed or self._first_bad()
                    if first_failed:
                        break
                    continue
                node = self._node(name)
                if node.state not in ACTIVE:
                    continue
                node.exit_code, node.error = code, error
                self._set(node, NodeState.of_exit_code(code))
                if node.state is not NodeState.SUCCEEDED:
                    first_failed = name
                    break
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

    def _node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def _first_bad(self) -> str | None:
        return next((n.name for n in self.nodes if n.state == NodeState.LOST), None)

    def _stream(self, node: Node) -> None:
        t, n = node.transport, node.launch
        assert t is not None
        try:
            t.stream(P.follow_command(n), lambda b: self.on_output(node.name, b))
            kind, code = parse_status(t.run(P.status_command(n), timeout=60).text)
            state, why = from_report(kind, code)
            if state is NodeState.RUNNING:  # the follower ended early (e.g. log rotated); count it as lost
                self._events.put((node.name, None, "log stream ended while the job still runs"))
            else:
                self._events.put((node.name, code, why))
        except HostError as e:
            self._events.put((node.name, None, str(e)))
        except Exception as e:  # noqa: BLE001 - e.g. the log disk is full: the run must not wait forever
            self._events.put((node.name, None, f"following the log failed here: {e}"))

    def _heartbeat(self) -> None:
        """Ask every running node whether it still answers; mark it LOST after ``max_misses`` misses."""
        running = [n for n in self.nodes if n.state == NodeState.RUNNING]

        def beat(node: Node) -> None:
            assert node.transport is not None
            node.transport.run(P.status_command(node.launch), timeout=node.launch.host.connect_timeout)
        for node, res in zip(running, fan_out(running, beat, self.plan.inventory.fanout)):
            if isinstance(res, Exception):
                node.misses += 1
                if node.misses >= self.max_misses:
                    node.error = f"stopped answering: {res}"
                    self._set(node, NodeState.LOST)
            else:
                node.misses = 0

    # ---- stop ----
    def teardown(self) -> None:
        """End the job on every node that may still run something of it; record final exit codes."""
        targets = [n for n in self.nodes if n.transport is not None]

        def end(node: Node) -> None:
            assert node.transport is not None
            node.transport.run(P.teardown_command(node.launch, self.grace_s), timeout=self.grace_s + 30)
            if node.state in ACTIVE:
                kind, code = parse_status(node.transport.run(P.status_command(node.launch), timeout=30).text)
                node.exit_code = code
                self._set(node, NodeState.STOPPED)
        for node, res in zip(targets, fan_out(targets, end, self.plan.inventory.fanout)):
            if isinstance(res, Exception) and node.state in ACTIVE:
                node.error = f"teardown failed: {res}"
                self._set(node, NodeState.LOST)
        for node in self.nodes:
            if node.state is NodeState.LOST and node.transport is not None:
                node.transport.close()  # a dead host's log stream would otherwise wait for TCP to give up
        self._join()

    def _join(self, timeout: float = 10.0) -> None:
        deadline = self.clock() + timeout
        for th in self._threads:
            th.join(max(0.0, deadline - self.clock()))

    def close(self) -> None:
        for n in self.nodes:
            if n.transport is not None:
                n.transport.close()

    def outcomes(self) -> tuple[NodeOutcome, ...]:
        """Every node's outcome so far."""
        return tuple(NodeOutcome(n.name, n.launch.node_rank, n.exit_code, n.error) for n in self.nodes)

    def _outcome(self, status: RunStatus, first_failed: str | None) -> RunOutcome:
        return RunOutcome(status, self.outcomes(), first_failed)
