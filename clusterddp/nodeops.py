"""The operations on a node's running job, each written once: the command :mod:`clusterddp.plan`
renders, run over one connection, and its answer read into the run record's words.

`up`'s supervisor, `status`, `stop`, `logs` and `collect` all go through these, so a node's
state reads the same whoever asks. :func:`each` applies one of them to several nodes through a
:class:`~clusterddp.fleet.Fleet`, which opens the connections.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO, Protocol, TypeVar

from . import plan as ssh_plan
from .fleet import Fleet, GroupResult
from .node import follow as node_follow
from .node import reply as node_reply
from .record import NodeRecord, NodeState, RunRecord, from_report
from .transport import Tail, Transport

if TYPE_CHECKING:
    from .inventory import RunNode

R = TypeVar("R")

STATUS_TIMEOUT = 30.0    # a status after a teardown: the node answered the teardown just now
FOLLOW_STATUS_TIMEOUT = 60.0
LOG_TIMEOUT = 120.0


def nodes_of(rec: RunRecord, hosts: list[str] | None = None) -> list[ssh_plan.NodeLaunch]:
    """The NodeLaunch of each node (or only of ``hosts``), rebuilt from a run record (no launch
    script: it already ran)."""
    return [launch_of(n) for n in rec.nodes if not hosts or n.host in hosts]


def launch_of(n: NodeRecord) -> ssh_plan.NodeLaunch:
    """The NodeLaunch of one recorded node (a run's, or a lost one of an earlier attempt's)."""
    return ssh_plan.NodeLaunch(n.settings, n.node_rank, n.nproc, n.run_dir, n.control_dir, n.marker, (), (), "")


# ---- a run's nodes, as its backend reaches them ----

class Reach(Protocol):
    """A run's nodes as its backend reaches them, for the verbs that send each node one command of
    their own (``top``; ``prune``). ``nodes``: each node as that command sees it (its host's python and
    setup lines, its run and control folders, its marker); ``connect(node.host)``: a transport that
    runs a command on that node (an SSH host: a connection; a Slurm node: a job step beside the
    job's own), raising HostError when it cannot; ``key``: reaches with one key connect alike, so a
    verb may share one connection per host among their runs. Closed when the verb is done."""

    @property
    def key(self) -> str: ...

    @property
    def nodes(self) -> tuple[ssh_plan.NodeLaunch, ...]: ...

    def connect(self, host: RunNode) -> Transport: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class HostsReach:
    """The :class:`Reach` of a run on hosts an inventory lists (SSH, `local`): the recorded nodes,
    reached as their hosts' transports say."""

    nodes: tuple[ssh_plan.NodeLaunch, ...]
    key: str = "hosts"

    def connect(self, host: RunNode) -> Transport:
        from .transport import connect
        return connect(host)

    def close(self) -> None:
        pass


def each(fleet: Fleet, nodes: Sequence[ssh_plan.NodeLaunch], fn: Callable[[ssh_plan.NodeLaunch, Transport], R],
         on_done: Callable[[str, R | Exception], None] | None = None) -> GroupResult[str, R]:
    """``fn(node, its connection)`` on every node in parallel, through ``fleet``; results by host name
    (and to ``on_done`` as each node's ends: :meth:`Fleet.each`)."""
    by_name = {n.host.name: n for n in nodes}
    return fleet.each(lambda h, t: fn(by_name[h.name], t), [n.host for n in nodes], on_done)


# ---- status ----

@dataclass(frozen=True)
class Status:
    """A node's answer to :func:`plan.status_command`, as a state of the record's vocabulary."""

    state: NodeState
    exit_code: int | None
    why: str | None = None    # why the state, when no exit code says it
    ended: int | None = None  # when the job ended (epoch seconds, the node's clock), when it says


STATUS_MAX_CHARS = node_reply.STATUS_MAX_CHARS
parse_status = node_reply.parse_status  # the reader beside the node-reply helpers it uses


def status(t: Transport, node: ssh_plan.NodeLaunch, timeout: float) -> Status:
    """Ask the node how its job stands. Raises HostError when it does not answer within ``timeout``."""
    text = t.run(ssh_plan.status_command(node), timeout=timeout).text
    st = _read_status(text)
    if st is None:
        shown = text[-STATUS_MAX_CHARS:].encode("ascii", "backslashreplace").decode("ascii")
        return Status(NodeState.LOST, None, f"unreadable status reply from the node: {shown!r}")
    return st


def _read_status(text: str) -> Status | None:
    """:func:`plan.status_command`'s answer in ``text`` as a Status; None when there is none to read."""
    kind, code, ended = node_reply.read_status(text)
    if kind == "garbled":
        return None
    state, why = from_report(kind, code)
    return Status(state, code, why, ended if kind == "exited" else None)


# ---- follow ----

@dataclass(frozen=True)
class Whole:
    """What the follower sent, by its own count, when it sent the whole log of a job that ended
    (:data:`clusterddp.node.follow.WHOLE_MARK`): its size in bytes and its sha256, hex."""

    size: int
    sha256: str


@dataclass(frozen=True)
class Followed:
    """How :func:`follow` ended: the job's status, and the whole log's :class:`Whole` when the
    follower says it sent it all (None: it did not, or its line was unreadable)."""

    status: Status
    whole: Whole | None = None


_WHOLE = re.compile(r"([0-9]{1,19}) ([0-9a-f]{64})", re.ASCII)


def read_whole(text: str) -> Whole | None:
    """The follower's :data:`~clusterddp.node.follow.WHOLE_MARK` line in ``text`` (its standard error);
    None when there is none, several, or one that is not exactly a size and a sha256. Never raises."""
    try:
        line = node_reply.marked(text, node_follow.WHOLE_MARK, 100)
    except node_reply.ReplyError:
        return None
    m = _WHOLE.fullmatch(line) if line is not None else None
    return Whole(int(m[1]), m[2]) if m else None


def follow(t: Transport, node: ssh_plan.NodeLaunch, on_output: Callable[[bytes], None], from_line: int = 1) -> Followed:
    """Stream the node's log from line ``from_line`` until its job ends, then ask how it ended.

    The status can still be RUNNING when the follower stopped early (the log was rotated away). It comes
    on the follower's standard error (:func:`plan.follow_status_command`), with the whole log's size and
    hash when it was all sent; whatever else is there (the follower's own complaints) is passed on after
    the log. No readable status there: asked for again.
    """
    err = Tail()
    t.stream(ssh_plan.follow_status_command(node, from_line), on_output, stderr_to=err)
    text = err.decode("utf-8", "replace")
    ours = (node_reply.STATUS_MARK, node_follow.WHOLE_MARK)
    said = "".join(line for line in text.splitlines(keepends=True) if not line.startswith(ours))
    if said.strip():
        on_output(said.encode())
    st = _read_status(text)
    return Followed(st if st is not None else status(t, node, FOLLOW_STATUS_TIMEOUT), read_whole(text))


# ---- teardown ----

@dataclass(frozen=True)
class Teardown:
    """What :func:`plan.teardown_command` printed (``word``: ``clean``, ``terminated``, ``killed`` or
    ``survivors`` with the pids in ``detail``; anything else is unexpected), and the status after it."""

    said: str
    status: Status

    @property
    def word(self) -> str:
        return self.said.partition(" ")[0]

    @property
    def detail(self) -> str:
        return self.said.partition(" ")[2]

    @property
    def ended_it(self) -> bool:
        """The teardown found processes of the job and they are gone."""
        return self.word in ("terminated", "killed")


def teardown(t: Transport, node: ssh_plan.NodeLaunch, grace: float, mark_stop: bool = False) -> Teardown:
    """End every process of the node's job (SIGTERM, then SIGKILL after ``grace`` s), then ask its
    status, so the exit code the signal left is known. ``mark_stop``: `clusterddp stop` (the run's end
    is then told as stopped: :func:`plan.teardown_command`)."""
    said = last_line(t.run(ssh_plan.teardown_command(node, grace, mark_stop), timeout=grace + 30).text)
    return Teardown(said, status(t, node, STATUS_TIMEOUT))


def last_line(text: str) -> str:
    """The last non-empty line of a node command's output: its answer, after whatever the login
    shell printed first (a banner)."""
    lines = text.strip().splitlines()
    return lines[-1].strip() if lines else ""


def end_marked(fleet: Fleet, marker: str, grace: float) -> GroupResult[str, str]:
    """End, on every host ``fleet`` is connected to, the processes carrying ``marker`` (an ``exec``
    interrupted by Ctrl-C: closing a connection does not end a command that has no terminal);
    each host's answer as :func:`plan.teardown_command` words it."""
    command = ssh_plan.kill_marked_command(marker, grace)
    return fleet.each(lambda h, t: last_line(t.run(command, timeout=grace + 10).text), fleet.connected())


# ---- the whole log ----

def fetch_log(t: Transport, node: ssh_plan.NodeLaunch, out: BinaryIO) -> bool:
    """Write the node's whole log to ``out`` as it arrives (a log may be far larger than memory);
    False when the node has none (its run folder is gone), and ``out`` then holds nothing useful."""
    def write(chunk: bytes) -> None:
        out.write(chunk)
    code = t.stream(ssh_plan.node_log_command(node), write, timeout=LOG_TIMEOUT, stderr_to=Tail())
    return code == 0
