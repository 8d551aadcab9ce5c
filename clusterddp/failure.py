"""Why a run failed: the rank that failed first and how, from what the nodes left behind. Pure.

The evidence, all of it untrusted (a node, or the job on it, wrote it):

- per-rank error files (``TORCHELASTIC_ERROR_FILE``, torch elastic's JSON: ``{"message": {"message":
  "Type: text", "extraInfo": {"py_callstack": ..., "timestamp": "<seconds>"}}}``), written by
  ``torch.distributed.elastic.multiprocessing.errors.record`` or by :func:`clusterddp.train.init`'s
  hook, which adds ``extraInfo.clusterddp = {"rank", "time"}`` (a float time: torch's is whole seconds);
- torchrun's own failure table in the node's log (``Root Cause (first observed failure)``: rank,
  local rank, exit code, pid), the only record of a rank killed by a signal;
- the node's kernel log lines about the OOM killer and NVIDIA GPU errors (Xid), its nvidia-smi output,
  and what the supervisor saw (lost, never joined).

:func:`diagnose` orders every rank's failure by time (ties: the node the supervisor saw end first,
then the rank) and describes the first; every other node gets one line. Two findings outrank that
order: a GPU error of the machine's kind during the job (:func:`gpu_error`) makes its node the root
cause (``gpu``: the others failed because that GPU did), and a first failure whose words say a collective
timed out (:func:`collective_timeout`) is a ``timeout``. What each kind leads to: :mod:`clusterddp.policy`.
"""

from __future__ import annotations

import json
import math
import re
import signal
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from .flight import Flight
from .noise import without_noise, without_teardown
from .sizes import ranges

# Bounds on what is kept: a record and a terminal summary stay small whatever a node sent.
MAX_TYPE = 200
MAX_MESSAGE = 2000
MAX_MESSAGE_LINES = 10
MAX_FRAMES = 3
MAX_FRAME = 500
MAX_LOG_LINES = 15
MAX_LOG_LINE = 300
MAX_NOTE = 240
MAX_OTHERS = 1024
MAX_ERROR_FILE = 1 << 20        # bytes of an error file parsed; longer is refused
MAX_TABLE_SCAN = 256 << 10      # bytes at the end of a node log searched for torchrun's failure table

KINDS = ("exception", "signal", "oom", "exit", "never_joined", "lost", "unknown", "hang", "gpu", "timeout", "diverged",
         "idle")
MAX_HANG_GROUPS = 64            # groups of ranks a hang keeps (the odd ones out first)
MAX_HANG_RANKS = 1024           # ranks named in one group


_UNWRITABLE = re.compile("[\x00\ud800-\udfff]")  # NUL and lone surrogates: run.json refuses them (record.py)


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, without what no run record may hold (shown as U+FFFD)."""
    text = _UNWRITABLE.sub("\ufffd", text[:limit + 1])
    return text if len(text) <= limit else text[:limit - 3] + "..."


@dataclass(frozen=True)
class RankError:
    """One rank's failure as its node recorded it."""

    local_rank: int
    rank: int | None              # the global rank, when known
    kind: str                     # "exception", "signal" or "exit"
    exc_type: str | None = None
    message: str | None = None
    frames: tuple[str, ...] = ()
    time: float = math.inf        # seconds since the epoch; whole seconds when torch wrote it
    precise: bool = False         # time to the sub-second (clusterddp's hook wrote it)
    exit_code: int | None = None
    pid: int | None = None

    @property
    def signal(self) -> str | None:
        if self.exit_code is None or self.exit_code >= 0:
            return None
        try:
            return signal.Signals(-self.exit_code).name
        except ValueError:
            return f"signal {-self.exit_code}"

    def text(self) -> str:
        if self.kind == "exception":
            return f"{self.exc_type}: {self.message}" if self.message else str(self.exc_type)
        if self.kind == "signal":
            return f"killed by {self.signal}"
        if self.message:  # what the rank said as it exited (argparse's usage error)
            return f"exited with code {self.exit_code}: {self.message}"
        return f"exited with code {self.exit_code} without a Python exception"


_TYPE_RE = re.compile(r"[A-Za-z_][\w.]{0,199}")
_FRAME_RE = re.compile(r'^ {2}File "(.{1,4096}?)", line (\d{1,9}), in (.{1,500})$')


def _int(v: Any, lo: int = -(2 ** 63), hi: int = 2 ** 63 - 1) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi else None


def frames_of(callstack: str) -> tuple[str, ...]:
    """The last :data:`MAX_FRAMES` frames of a Python traceback, each as ``file:line in func: code``."""
    lines = callstack.splitlines()
    out = []
    for i, line in enumerate(lines):
        m = _FRAME_RE.match(line)
        if m:
            code = lines[i + 1].strip() if i + 1 < len(lines) and not _FRAME_RE.match(lines[i + 1]) and \
                lines[i + 1].startswith("    ") else ""
            out.append(clip(f"{m.group(1)}:{m.group(2)} in {m.group(3)}" + (f": {code}" if code else ""), MAX_FRAME))
    return tuple(out[-MAX_FRAMES:])


def _split_head(msg: str) -> tuple[str, str]:
    """An exception's ``Type: message`` line(s) as (type, message)."""
    head, sep, rest = msg.partition(": ")
    if sep and _TYPE_RE.fullmatch(head):
        exc_type, message = head, rest
    elif _TYPE_RE.fullmatch(msg.strip()):
        exc_type, message = msg.strip(), ""
    else:
        exc_type, message = "Error", msg
    return exc_type, "\n".join(message.splitlines()[:MAX_MESSAGE_LINES])


def parse_error_file(text: str, local_rank: int) -> RankError | None:
    """An error file's content as a :class:`RankError`, or None when it is not one. Never raises."""
    if len(text) > MAX_ERROR_FILE:
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    msg = data.get("message")
    extra: Any = {}
    if isinstance(msg, dict):
        extra = msg.get("extraInfo")
        extra = extra if isinstance(extra, dict) else {}
        stamp = extra.get("timestamp")
        msg = msg.get("message")
    else:
        stamp = data.get("timestamp")
    if not isinstance(msg, str):
        return None
    exc_type, message = _split_head(msg)
    callstack = extra.get("py_callstack")
    frames = frames_of(callstack[-(256 << 10):]) if isinstance(callstack, str) else ()
    time, precise, rank = math.inf, False, None
    try:
        t = float(stamp) if isinstance(stamp, (str, int, float)) and not isinstance(stamp, bool) else math.inf
        time = t if math.isfinite(t) and 0 <= t < 1e11 else math.inf
    except (ValueError, OverflowError):
        pass
    ours = extra.get("clusterddp")
    if isinstance(ours, dict):
        t2 = ours.get("time")
        if isinstance(t2, (int, float)) and not isinstance(t2, bool) and math.isfinite(t2) and 0 <= t2 < 1e11:
            time, precise = float(t2), True
        rank = _int(ours.get("rank"), 0, 10 ** 7)
    return RankError(local_rank=local_rank, rank=rank, kind="exception", exc_type=clip(exc_type, MAX_TYPE),
                     message=clip(message, MAX_MESSAGE), frames=frames, time=time, precise=precise)


# torchrun's ChildFailedError table (torch.distributed.elastic.multiprocessing.errors), one entry:
#   time      : 2026-11-30_14:50:01
#   host      : node2
#   rank      : 3 (local_rank: 1)
#   exitcode  : -9 (pid: 1234)  (SIGKILL)
#   error_file: <N/A>
_ENTRY_RE = re.compile(
    r"time\s*: (\S{1,40})\n[^\n]{0,300}\n\s*rank\s*: (\d{1,7}) \(local_rank: (\d{1,7})\)\n"
    r"\s*exitcode\s*: (-?\d{1,4}) \(pid: (\d{1,10})\)[^\n]{0,100}\n\s*error_file: ([^\n]{0,4096})",
    re.ASCII)  # \d: ASCII digits only (torchrun writes those; int() would read Arabic-Indic ones too)


def torchrun_failures(log: bytes) -> list[RankError]:
    """The ranks torchrun reported failed, from the end of a node's log, without an error file
    (a signal, or an exit without a Python exception): those with one are read from the file."""
    text = log[-MAX_TABLE_SCAN:].decode("utf-8", "replace").replace("\r\n", "\n")
    out: dict[int, RankError] = {}
    for m in _ENTRY_RE.finditer(text):
        when, rank, local_rank, code, pid, error_file = m.groups()
        if error_file.strip() != "<N/A>":
            continue
        try:
            t = datetime.strptime(when, "%Y-%m-%d_%H:%M:%S").timestamp()
        except (ValueError, OverflowError):
            t = math.inf
        exit_code = int(code)
        out[int(rank)] = RankError(local_rank=int(local_rank), rank=int(rank),
                                   kind="signal" if exit_code < 0 else "exit", time=t, exit_code=exit_code,
                                   pid=int(pid))
    return list(out.values())


def torchrun_root(log: bytes) -> int | None:
    """The global rank torchrun's table names as the root cause (its first observed failure), or None."""
    text = log[-MAX_TABLE_SCAN:].decode("utf-8", "replace").replace("\r\n", "\n")
    at = text.rfind("Root Cause (first observed failure):")
    m = _ENTRY_RE.search(text, at) if at >= 0 else None
    return int(m.group(2)) if m else None


# ---- what a rank printed, from its node's log ----
# A script without torch's @record or clusterddp.train leaves no error file: what it raised is only in
# the log its node's torchrun shares among all its ranks. Once a rank's process group exists, torch's
# excepthook prefixes each line of its uncaught exception with ``[rank<N>]: `` (in one write, so the
# lines stay together); before that (argparse, imports, setup), nothing tells the ranks apart.

LOG_SCAN = 256 << 10  # bytes at the end of a node's log searched for what its ranks printed
ATTEMPT_START = "[clusterddp] node "  # the line launch.sh and node.sh print before torchrun starts
_TRACEBACK = "Traceback (most recent call last):"
_RANK_PREFIX = re.compile(r"\[rank(\d{1,7})\]: ", re.ASCII)
# torch elastic's agent logs ("W1201 23:37:02.011000 8610 torch/distributed/elastic/...:1028] Sending
# process 8775 closing signal SIGTERM"): torchrun's words, not a rank's
AGENT_LINE = re.compile(r"[IWEF]\d{4} [\d:.]{8,20} +\d{1,10} \S{0,400}torch/distributed/\S{0,400}\] ", re.ASCII)
_USAGE_ERROR = re.compile(r"(\S{1,400}): error: (.{1,2000})")  # argparse's last line (then exit 2)


def _blocks(lines: Sequence[str]) -> list[tuple[int, str, str]]:
    """Every Python traceback in ``lines``: (where it starts, its exception line, its text)."""
    out = []
    for i, line in enumerate(lines):
        if line.rstrip() != _TRACEBACK:
            continue
        j = i + 1
        while j < len(lines) and lines[j].startswith((" ", "\t")):
            j += 1
        if j < len(lines) and _TYPE_RE.fullmatch(lines[j].partition(":")[0]):
            out.append((i, lines[j].rstrip(), "\n".join(lines[i:j + 1])))
    return out


def _torchruns(head: str) -> bool:
    return head.startswith("torch.distributed.elastic.")  # its ChildFailedError, once a rank failed


def attempt_lines(log: bytes) -> list[str]:
    """What the ranks printed in the last attempt of a node's log: the lines after the last one launch.sh
    printed before torchrun started, up to torchrun's own failure report (its ChildFailedError traceback
    and table), without torch elastic's agent lines."""
    text = log[-LOG_SCAN:].decode("utf-8", "replace").replace("\r\n", "\n")
    lines = text.split("\n")
    start = max((i for i, line in enumerate(lines) if line.startswith(ATTEMPT_START)), default=-1)
    lines = lines[start + 1:]
    end = next((i for i, head, _ in _blocks(lines) if _torchruns(head)), len(lines))
    return [line for line in lines[:end] if not AGENT_LINE.match(line)]


def _unprefixed(lines: Sequence[str]) -> list[str]:
    return [line for line in lines if not _RANK_PREFIX.match(line)]


def rank_traceback(lines: Sequence[str], rank: int) -> tuple[str, str] | None:
    """The exception global rank ``rank`` died of, as (its exception line, the traceback), from its
    ``[rank<N>]: ``-prefixed lines: the last block (a chained exception's cause is printed first)."""
    prefix = f"[rank{rank}]: "
    found = _blocks([line[len(prefix):] for line in lines if line.startswith(prefix)])
    return found[-1][1:] if found else None


def bare_traceback(lines: Sequence[str], nproc: int = 1) -> tuple[str, str] | None:
    """The last traceback no rank prefix claims (printed before the rank's process group existed),
    torchrun's own excepted: the one printed last before the exit. One that each of the node's ``nproc``
    ranks printed (a caught one that every rank printed and carried on from, such as an optional import)
    counts only when every traceback is such a one (every rank died of the same): a slower rank may
    print it after the failing rank died."""
    found = [b[1:] for b in _blocks(_unprefixed(lines)) if not _torchruns(b[1])]
    own = [b for b in found if found.count(b) < nproc]
    return (own or found)[-1] if found else None


def usage_error(lines: Sequence[str]) -> str | None:
    """argparse's ``prog: error: ...`` line (it exits 2, with no traceback) after its usage, or None.
    Ranks print theirs as they fail, so the first is the one torchrun saw first (its root cause)."""
    bare = _unprefixed(lines)
    usage = next((i for i, line in enumerate(bare) if line.startswith("usage: ")), None)
    if usage is None:
        return None
    return next((line.rstrip() for line in bare[usage + 1:] if _USAGE_ERROR.fullmatch(line.rstrip())), None)


def rank_tail(lines: Sequence[str], rank: int | None) -> tuple[str, ...]:
    """The last lines of ``lines`` that may be rank ``rank``'s: without the other ranks' prefixed ones."""
    mine = [line.rstrip() for line in without_noise(lines) if line.strip() and
            ((m := _RANK_PREFIX.match(line)) is None or rank is None or int(m.group(1)) == rank)]
    return tuple(clip(line, MAX_LOG_LINE) for line in mine[-MAX_LOG_LINES:])


def with_output(failures: Sequence[RankError], log: bytes, nproc: int | None = None) -> list[RankError]:
    """torchrun's table entries (:func:`torchrun_failures`) with what the ranks printed: a rank that
    exited with code 1 becomes the exception its traceback shows (its own prefixed one; the last
    unprefixed one goes to one rank of the node only, torchrun's root cause where it is one of them),
    and one that exited with code 2 carries argparse's usage error."""
    if not any(r.kind == "exit" for r in failures):
        return list(failures)
    lines = attempt_lines(log)
    ones = [r.rank for r in failures if r.kind == "exit" and r.exit_code == 1 and r.rank is not None]
    found = {rank: rank_traceback(lines, rank) for rank in ones}
    bare = [rank for rank in ones if found[rank] is None]
    if bare:
        root = torchrun_root(log)
        found[root if root in bare else min(bare)] = bare_traceback(lines, nproc or len(failures))
    usage = usage_error(lines) if any(r.kind == "exit" and r.exit_code == 2 for r in failures) else None
    out = []
    for r in failures:
        tb = found.get(r.rank) if r.kind == "exit" and r.exit_code == 1 and r.rank is not None else None
        if tb is not None:
            head, callstack = tb
            exc_type, message = _split_head(head)
            r = replace(r, kind="exception", exc_type=clip(exc_type, MAX_TYPE), message=clip(message, MAX_MESSAGE),
                        frames=frames_of(callstack))
        elif r.kind == "exit" and r.exit_code == 2 and usage:
            r = replace(r, message=clip(usage, MAX_MESSAGE))
        out.append(r)
    return out


_OOM_PID_RE = re.compile(r"Killed process (\d+)|oom-kill:.*?,pid=(\d+)")


def oom_killed(kernel_lines: Sequence[str], pid: int | None) -> str | None:
    """The kernel log line that says the OOM killer killed ``pid``, or None."""
    if pid is None:
        return None
    for line in kernel_lines:
        for m in _OOM_PID_RE.finditer(line):
            if int(m.group(1) or m.group(2)) == pid:
                return line
    return None


# ---- GPU errors (NVIDIA Xid lines in the kernel log, nvidia-smi) ----
# The Xids NVIDIA's catalogue puts on the GPU, its memory or its link, not on the job's code (13, 31, 43
# and 45 are usually the application's own illegal access or its teardown): the machine needs a reset or
# a repair, so a run moved to another one can carry on. 63 and 92 (a page retired, a high corrected-error
# rate) are warnings the job survives.
MACHINE_XIDS = {
    48: "double-bit ECC error", 62: "GPU micro-controller halted", 64: "ECC page retirement or row remapping failed",
    74: "NVLink error", 79: "GPU has fallen off the bus", 94: "contained ECC error", 95: "uncontained ECC error",
    119: "GSP RPC timeout", 120: "GSP error", 140: "unrecovered ECC error",
}
LOG_SCAN_LINES = 2000   # a failing rank's last lines searched for a timeout's words
XID_SCAN = 2000         # characters of a kernel line the parser reads (the node sends at most 1000)
JOB_SLACK_S = 5.0       # a kernel stamp (seconds since boot) as wall time is this close to the job's start/end
# "[  890.431249] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
# (older drivers: "(0000:3b:00)", no name=, pid='<unknown>'). ASCII digits only.
_STAMP_RE = re.compile(r"\[\s{0,12}(\d{1,10}(?:\.\d{1,9})?)\]", re.ASCII)
_XID_RE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\): "
                     r"(\d{1,6})\b,?(.{0,1000})", re.ASCII)
_XID_PID_RE = re.compile(r"\bpid=(\d{1,10})\b", re.ASCII)
# nvidia-smi's words for a GPU it cannot reach or read (the node writes "nvidia-smi failed: <why>" when it
# exits non-zero); "No devices were found" is a node without GPUs, a timeout may be load: neither counts.
_SMI_BROKEN = re.compile(r"couldn't communicate with the NVIDIA driver|Unable to determine the device handle|"
                         r"GPU is lost|Unknown Error|ERR!")


@dataclass(frozen=True)
class Xid:
    """One NVIDIA Xid line of a node's kernel log."""

    code: int
    pci: str
    pid: int | None                     # the process it names, if any
    stamp: float | None                 # seconds since the node booted, from the line's prefix
    line: str

    @property
    def machine(self) -> bool:
        return self.code in MACHINE_XIDS

    def text(self) -> str:
        what = MACHINE_XIDS.get(self.code)
        return f"NVIDIA Xid {self.code}" + (f" ({what})" if what else "") + f" on GPU PCI:{self.pci}"


def parse_xid(line: str) -> Xid | None:
    """A kernel log line as an :class:`Xid`, or None when it is not one. Never raises; reads at most
    :data:`XID_SCAN` characters."""
    text = line[:XID_SCAN]
    m = _XID_RE.search(text)
    if m is None:
        return None
    stamp = _STAMP_RE.match(text)
    pid = _XID_PID_RE.search(m.group(3))
    return Xid(code=int(m.group(2)), pci=m.group(1).lower(), pid=int(pid.group(1)) if pid else None,
               stamp=float(stamp.group(1)) if stamp and stamp.end() <= m.start() else None,
               line=clip(text.strip(), MAX_LOG_LINE))


def _finite(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def gpu_error(report: Mapping[str, Any] | None, pids: Iterable[int] = ()) -> tuple[str, str] | None:
    """(what, the line that says it) when a node's report shows one of its GPUs failing during its job, else None:
    an Xid of :data:`MACHINE_XIDS` stamped while the node's job ran (when the node said when: its boot and its
    job's start and end), naming no process or one of ``pids`` (the node's ranks torchrun reported; another
    process's Xid is that process's GPU, and a node shares its kernel log with every job on it), or
    nvidia-smi's failure to reach a GPU."""
    if not report:
        return None
    boot, start, end = (_finite(report.get(k)) for k in ("kernel_boot", "job_started", "job_ended"))
    mine = set(pids)
    for line in report.get("kernel_lines") or ():
        x = parse_xid(line) if isinstance(line, str) else None
        if x is None or not x.machine or (x.pid is not None and x.pid not in mine):
            continue
        if boot is not None and start is not None and x.stamp is not None:
            at = boot + x.stamp
            if at < start - JOB_SLACK_S or (end is not None and at > end + JOB_SLACK_S):
                continue  # before this job (a GPU since reset) or after it
        return x.text(), x.line
    smi = report.get("nvidia_smi")
    if isinstance(smi, str):
        for line in smi[-MAX_TABLE_SCAN:].splitlines():
            if _SMI_BROKEN.search(line[:XID_SCAN]):
                return "nvidia-smi cannot read a GPU", clip(line.strip(), MAX_LOG_LINE)
    return None


def table_pids(log: bytes) -> set[int]:
    """The pid of every rank torchrun's failure table names, from the end of a node's log."""
    text = log[-MAX_TABLE_SCAN:].decode("utf-8", "replace").replace("\r\n", "\n")
    return {int(m.group(5)) for m in _ENTRY_RE.finditer(text)}


# ---- collective timeouts ----
# torch's own words (torch 2.13; its test suite matches the same: testing/_internal/distributed/
# distributed_test.py): gloo's "Timed out waiting 3000ms for recv operation to complete" (a RuntimeError;
# a later collective then says "Application timeout caused pair closure"), its monitored barrier's "Rank 1
# failed to pass monitoredBarrier in 3000 ms", and NCCL's watchdog, "[Rank 1] Watchdog caught collective
# operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, ...) ran for 600081 milliseconds before timing
# out." (raised, or, with TORCH_NCCL_ASYNC_ERROR_HANDLING's default, logged before the rank aborts:
# SIGABRT, "Some NCCL operations have failed or timed out").
_TIMEOUT_RE = re.compile(
    r"Watchdog caught collective operation timeout|Timed out waiting \d{1,12}ms for (?:send|recv) operation to "
    r"complete|failed to pass monitoredBarrier|timed out in monitoredBarrier|Some NCCL operations have failed or "
    r"timed out|Application timeout caused pair closure", re.ASCII)


def collective_timeout(f: Failure, lines: Sequence[str] = ()) -> str | None:
    """The words that say ``f``'s collective timed out, as one line, or None: in its exception's message,
    else in ``lines``, what its rank printed (NCCL's watchdog line comes before the C++ stack of its abort,
    dozens of lines), else in its log tail."""
    if f.kind not in ("exception", "signal", "exit"):
        return None
    texts = [f.message or ""] if f.kind == "exception" else list(lines)[-LOG_SCAN_LINES:] + list(f.log_tail)
    for text in texts:
        for line in text[:MAX_MESSAGE].splitlines():
            if _TIMEOUT_RE.search(line[:XID_SCAN]):
                return clip(line.strip(), MAX_LOG_LINE)
    return None


def not_joined(late: Mapping[str, str | None], master_host: str, master: tuple[str, int],
               bound_s: float) -> list[tuple[str, str]]:
    """Who to name, and why, when the nodes in ``late`` (host -> what its probe of the master's port
    said: ``ok``, ``refused``, ``timed out``, an error; None if not asked) had not joined the
    rendezvous within ``bound_s``. A node that cannot reach the master is named; the master itself
    never is for that (a host is never "unreachable from itself": a probe of its own port that timed
    out says the host is loaded), unless nothing listens there (``refused``: its torchrun has not
    opened the port, which is why the others cannot reach it). When no node is named so, all are."""
    head = f"never joined the rendezvous within {bound_s:g}s"
    where = f"{master[0]}:{master[1]}"
    named = [(h, f"{head}: nothing listens on the master port {where} there (its torchrun has not opened it)")
             for h, got in late.items() if h == master_host and got == "refused"]
    named += [(h, f"{head}: cannot reach the master {where} from it ({got})")
              for h, got in late.items() if h != master_host and got != "ok"]
    if named:
        return named
    return [(h, f"{head} (it is the master; its torchrun is still starting or waits for the others)"
             if h == master_host else f"{head} (it reaches the master {where}; its torchrun is still starting "
             "or waits for the others)") for h in late]


@dataclass(frozen=True)
class NodeFacts:
    """What is known of one node when its run failed."""

    host: str
    node_rank: int
    nproc: int | None
    state: str                          # a NodeState word
    exit_code: int | None
    error: str | None                   # the supervisor's or status's reason
    log: bytes = b""                    # the end of its log
    report: dict | None = None          # its diagnose answer (clusterddp.node.diagnose.read_answer)
    report_error: str | None = None     # why there is none


@dataclass(frozen=True)
class HangRank:
    """One rank of a hung run where its stacks found it (:mod:`clusterddp.hang` makes these)."""

    host: str
    rank: int | None
    local_rank: int | None
    pid: int
    frames: tuple[str, ...] = ()        # the innermost frames of the user's code: ``function (file:line)``

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "rank": self.rank, "local_rank": self.local_rank, "pid": self.pid,
                "frames": list(self.frames)}


@dataclass(frozen=True)
class HangGroup:
    """Ranks whose main threads stand at the same place (``where``: ``stacks.summary``'s line)."""

    odd: bool                           # not where the most ranks are
    where: str
    ranks: tuple[HangRank, ...]

    def who(self) -> str:
        """``rank 3 (node2 local 1, pid 812)`` or ``ranks 0-2 (node1, node2)``."""
        if len(self.ranks) == 1:
            r = self.ranks[0]
            return f"rank {r.rank} ({r.host} local {r.local_rank}, pid {r.pid})"
        numbers = sorted(r.rank for r in self.ranks if r.rank is not None)
        hosts = ", ".join(dict.fromkeys(r.host for r in self.ranks))
        return f"ranks {ranges(numbers)} ({hosts})"

    def to_json(self) -> dict[str, Any]:
        return {"odd": self.odd, "where": self.where, "ranks": [r.to_json() for r in self.ranks]}


@dataclass(frozen=True)
class Hang:
    """What the stall watchdog found (``failure.kind: hang``): how long no rank made progress, and
    every rank's stacks grouped by where they stand, the odd ones out first."""

    timeout: float                      # the run's stall timeout, seconds
    silent_s: float                     # seconds without progress when it was declared
    decided_by: str | None              # the node that saw it first
    groups: tuple[HangGroup, ...] = ()
    stacks_dir: str | None = None       # where every thread of every rank was saved (the run folder's stacks/)
    missing: tuple[tuple[str, str], ...] = ()  # (host, why it gave no stacks)

    def to_json(self) -> dict[str, Any]:
        return {"timeout": self.timeout, "silent_s": self.silent_s, "decided_by": self.decided_by,
                "groups": [g.to_json() for g in self.groups], "stacks_dir": self.stacks_dir,
                "missing": [{"host": h, "why": w} for h, w in self.missing]}

    def lines(self) -> list[str]:
        """The grouped stacks, as `stacks` shows them: each group in a line, an odd one out with the
        innermost frames of the user's code of each of its ranks."""
        out = []
        for g in self.groups:
            out.append(f"{g.who()}: {g.where}" + ("  <- the odd one out" if g.odd else ""))
            if g.odd:
                for r in g.ranks:
                    if len(g.ranks) > 1:
                        out.append(f"  rank {r.rank} ({r.host} local {r.local_rank}, pid {r.pid}):")
                    out += [f"    {f}" for f in r.frames]
        out += [f"{h}: no stacks: {why}" for h, why in self.missing]
        if self.stacks_dir:
            out.append(f"every thread of every rank: {self.stacks_dir}/")
        return out


@dataclass(frozen=True)
class Failure:
    """The root cause of a failed run, as recorded in run.json's ``failure`` and printed."""

    host: str
    kind: str                           # one of KINDS
    summary: str                        # one line: what happened
    rank: int | None = None
    local_rank: int | None = None
    exc_type: str | None = None
    message: str | None = None
    frames: tuple[str, ...] = ()
    signal: str | None = None
    log_tail: tuple[str, ...] = ()
    others: tuple[tuple[str, str], ...] = field(default_factory=tuple)  # (host, one line)
    hang: Hang | None = None            # kind "hang": what the stall watchdog found
    flight: Flight | None = None        # torch's flight recorder: the collective each rank last entered

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "kind": self.kind, "summary": self.summary, "rank": self.rank,
                "local_rank": self.local_rank, "exc_type": self.exc_type, "message": self.message,
                "frames": list(self.frames), "signal": self.signal, "log_tail": list(self.log_tail),
                "others": [{"host": h, "note": n} for h, n in self.others],
                **({"hang": self.hang.to_json()} if self.hang is not None else {}),
                **({"flight": self.flight.to_json()} if self.flight else {})}

    def lines(self, others: bool = True) -> list[str]:
        """The summary as text lines (unescaped: the CLI escapes what it prints): the root cause, then
        (``others``) every other node in one line."""
        where = self.host
        if self.rank is not None or self.local_rank is not None:
            where += f", rank {self.rank if self.rank is not None else '?'}"
            where += f" (local rank {self.local_rank})" if self.local_rank is not None else ""
        head, *more = self.summary.splitlines() or [""]
        out = [f"root cause: {where}: {head}"] + [f"  {m}" for m in more]
        if self.hang is not None:
            out += [f"  {line}" for line in self.hang.lines()]
        else:
            out += [f"  at {f}" for f in self.frames]
        tail = [line for line in self.log_tail if line.strip()]  # a header over blank lines says nothing
        if tail:
            out.append(f"  last lines of {self.host}'s log:")
            out += [f"  | {line}" for line in tail]
        out += self.flight.lines() if self.flight else []
        out += [f"{h}: {note}" for h, note in self.others] if others else []
        return out


def _tail(log: bytes) -> tuple[str, ...]:
    """The end of a node's whole log (every rank's lines and torchrun's, but its teardown: the summary
    says what that says): :func:`rank_tail` of no one rank."""
    return rank_tail(without_teardown(log[-(64 << 10):].decode("utf-8", "replace").splitlines()), None)


def _rank_tail(node: NodeFacts, r: RankError) -> tuple[str, ...]:
    """The failing rank's own last lines (not torchrun's table, nor another rank's traceback); the end
    of the node's log when the rank printed nothing there."""
    return rank_tail(attempt_lines(node.log), r.rank) or _tail(node.log)


def rank_errors(node: NodeFacts) -> list[RankError]:
    """Every rank failure a node left: its error files (newest attempt), and torchrun's table entries
    without a file. Global ranks are filled in from the node rank when every node has ``nproc`` ranks."""
    out: list[RankError] = []
    if node.report:
        files = node.report.get("errors", [])
        newest = max((e["attempt"] for e in files), default=0)
        for e in files:
            if e["attempt"] == newest:
                r = parse_error_file(e["data"], e["local_rank"])
                if r is not None:
                    out.append(r)
    have = {r.local_rank for r in out}
    out += with_output([r for r in torchrun_failures(node.log) if r.local_rank not in have], node.log, node.nproc)
    return out


def _with_rank(r: RankError, node: NodeFacts, uniform: int | None) -> RankError:
    if r.rank is None and uniform is not None:
        return replace(r, rank=node.node_rank * uniform + r.local_rank)
    return r


def _oom(r: RankError, node: NodeFacts) -> str | None:
    if r.kind != "signal" or r.exit_code != -signal.SIGKILL or not node.report:
        return None
    return oom_killed(node.report.get("kernel_lines", []), r.pid)


def _describe_rank(r: RankError, node: NodeFacts) -> Failure:
    kernel = _oom(r, node)
    if kernel:
        return Failure(node.host, "oom", "killed by the kernel: out of memory\n" + clip(kernel, MAX_LOG_LINE),
                       rank=r.rank, local_rank=r.local_rank, signal=r.signal, log_tail=_rank_tail(node, r))
    if r.kind == "exception":
        return Failure(node.host, "exception", r.text(), rank=r.rank, local_rank=r.local_rank, exc_type=r.exc_type,
                       message=r.message, frames=r.frames)
    if r.kind == "signal":
        return Failure(node.host, "signal", r.text(), rank=r.rank, local_rank=r.local_rank, signal=r.signal,
                       log_tail=_rank_tail(node, r))
    return Failure(node.host, "exit", r.text(), rank=r.rank, local_rank=r.local_rank, message=r.message,
                   log_tail=_rank_tail(node, r))


def _never_joined(node: NodeFacts) -> bool:
    return node.report is not None and node.report.get("joined") is False and node.state in ("failed", "lost")


def _node_only(node: NodeFacts) -> Failure:
    """A node's failure when no rank left a word: never joined, lost, or an exit code and its log."""
    if node.error and node.error.startswith("never joined"):
        return Failure(node.host, "never_joined", clip(node.error, MAX_MESSAGE), log_tail=_tail(node.log))
    if node.state == "lost":
        return Failure(node.host, "lost", clip(f"lost: {node.error or 'no exit code'}", MAX_MESSAGE),
                       log_tail=_tail(node.log))
    if _never_joined(node):
        return Failure(node.host, "never_joined",
                       f"never joined the rendezvous: its job ended (exit {node.exit_code}) before it started "
                       "any worker", log_tail=_tail(node.log))
    what = f"exit {node.exit_code}" if node.exit_code is not None else (node.error or "ended badly")
    if node.exit_code is not None and node.error:
        what += f" - {node.error}"
    return Failure(node.host, "exit" if node.exit_code is not None else "unknown", clip(what, MAX_MESSAGE),
                   log_tail=_tail(node.log))


def _note(node: NodeFacts, errors: list[RankError], nproc: int | None) -> str:
    word = node.state + (f" exit {node.exit_code}" if node.exit_code is not None else "")
    if errors:
        r = min(errors, key=lambda r: (_when(r), r.local_rank))
        r = _with_rank(r, node, nproc)
        rank = f"rank {r.rank}" if r.rank is not None else f"local rank {r.local_rank}"
        desc = _describe_rank(r, node).summary.splitlines()[0]
        return clip(f"{word} - {rank}: {desc}", MAX_NOTE)
    if node.error:
        return clip(f"{word} - {node.error}", MAX_NOTE)
    if node.report_error:
        return clip(f"{word} (no report: {node.report_error})", MAX_NOTE)
    return word


TABLE_LEAD_S = 1.0


# What a rank raises when a peer's end broke the collective it was in (gloo's "Connection closed by peer
# ... typically caused by a remote worker crashing", NCCL's aborted communicator): an echo of another
# rank's failure, never its cause while a rank that failed first-hand is known.
_ECHO = re.compile(r"Connection (?:closed|reset) by peer|typically caused by a remote worker crashing|"
                   r"NCCL communicator was aborted|remote process exited or there was a network error")


def echo(r: RankError) -> bool:
    """Whether ``r`` is a rank's exception caused by a peer's end (:data:`_ECHO`)."""
    return r.kind == "exception" and _ECHO.search(r.message or "") is not None


def _when(r: RankError) -> float:
    """When a rank failed, for ordering. A whole-second time is taken as the middle of its second. A
    time from torchrun's table is when the agent noticed the death (up to its monitor interval later)
    rounded down: it counts a second earlier, since a rank killed by a signal or that exited without
    an exception is rarely the echo of another's failure (those raise: "Connection closed by peer")."""
    if r.precise:
        return r.time
    if r.kind == "exception":
        return r.time + 0.5
    return r.time - TABLE_LEAD_S


# torchrun's agent, once its ranks all ended well: it then waits in its exit barrier for the other nodes
FINISHED_LINE = re.compile(r"torchrun: this node's ranks finished|Local worker group finished \(\S*SUCCEEDED\)")
RESTART_LINE = re.compile(r"torchrun restarts this node's ranks|will restart worker group")  # its agent restarting them
# What a rank says when a peer it shares a collective with has gone (its process ended)
PEER_GONE = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|DistBackendError|"
                       r"NCCL communicator was aborted|ProcessGroupGloo|ProcessGroupNCCL", re.I)


def _last_attempt(log: bytes) -> list[str]:
    """The lines of a node's log from its last attempt's start (torch elastic's agent lines kept)."""
    lines = log[-LOG_SCAN:].decode("utf-8", "replace").replace("\r\n", "\n").split("\n")
    start = max((i for i, line in enumerate(lines) if line.startswith(ATTEMPT_START)), default=-1)
    return lines[start + 1:]


def finished(log: bytes) -> bool:
    """Whether a node's torchrun said its ranks all finished (it then waits for the other nodes)."""
    return any(FINISHED_LINE.search(line) for line in _last_attempt(log))


def diverged(nodes: Sequence[NodeFacts], per_node: Mapping[str, list[RankError]]) -> Failure | None:
    """The failure when one node's ranks finished their work while another node's did not: they did
    not run the same steps (they resumed from different checkpoints, or one node finished early), and
    what the others then raised or did (a peer gone, a restart, a wait in torchrun's exit barrier) is its
    echo. None when no node finished, a node was lost, or a rank that did not finish failed on its own
    (an exception of the job's, not a peer gone)."""
    done = [n for n in nodes if finished(n.log)]
    rest = [n for n in nodes if n not in done]
    if not done or not rest or any(n.state == "lost" for n in nodes):
        return None
    for n in rest:
        for r in per_node[n.host]:
            if r.kind == "exception" and not PEER_GONE.search(f"{r.exc_type} {r.message} {r.text()}"):
                return None
    first = done[0]
    others = ", ".join(n.host for n in rest)
    what = ("restarting them" if any(RESTART_LINE.search(line) for n in rest for line in _last_attempt(n.log))
            else "still running")
    summary = (f"ranks resumed from different points: {first.host}'s ranks finished their work while "
               f"{others}'s were {what}\nthe nodes' ranks did not run the same steps (they resumed from "
               "different checkpoints, or one node's script finished early), so the others lost their peers; "
               "make every rank load the same checkpoint at start")
    return Failure(first.host, "diverged", clip(summary, MAX_MESSAGE), log_tail=_tail(first.log))


def diagnose(nodes: Sequence[NodeFacts], first_failed: str | None) -> Failure:
    """The failure of the rank that failed first, and a line for every other node."""
    sizes = {n.nproc for n in nodes}
    uniform = next(iter(sizes)) if len(sizes) == 1 and None not in sizes else None
    per_node = {n.host: [_with_rank(r, n, uniform) for r in rank_errors(n)] for n in nodes}
    split = diverged(nodes, per_node)
    if split is not None:
        others = tuple((n.host, _note(n, per_node[n.host], uniform)) for n in nodes if n.host != split.host)
        return replace(split, others=others[:MAX_OTHERS])
    candidates = []
    for n in nodes:
        for r in per_node[n.host]:
            if n.state == "stopped" and r.kind == "signal":
                continue  # we ended that node: its SIGTERMed ranks did not fail on their own
            if r.signal == "SIGTERM" and any(o.signal != "SIGTERM" for o in per_node[n.host]):
                continue  # torchrun's closing signal to the others once one of its ranks failed: an echo
            candidates.append((_when(r), n.host != first_failed, r.rank if r.rank is not None else 10 ** 8, n, r))
    # A node we stopped did not fail on its own: what its ranks raised came after the first failure,
    # unless no node that ended by itself left a word about any rank.
    own = [c for c in candidates if c[3].state != "stopped"]
    first_hand = [c for c in candidates if not echo(c[4])]
    if own and all(echo(c[4]) for c in own):
        # Every rank of the nodes that ended by themselves only echoes a peer's end: the rank whose end
        # it echoes is the cause, on a node recorded stopped too (which node's end came first is a race:
        # Slurm's outcome calls the later ones stopped; issue 40's one run in six).
        own = first_hand or own
    else:
        # An echo never beats a first-hand failure, even in the same second on the same node: a rank in
        # a collective with the failing one raises "Connection closed by peer" and exits 1 before
        # torchrun's monitor looks, so torchrun's table lists both at one whole second (issue 40).
        own = [c for c in own if not echo(c[4])]
    bad = [n for n in nodes if n.state in ("failed", "lost")]
    failed_first = next((n for n in bad if n.host == first_failed), None)
    if own or (candidates and failed_first is None):
        *_, node, first = min(own or first_hand or candidates, key=lambda c: c[:3])
        failure = _describe_rank(first, node)
    else:
        node = failed_first or (bad[0] if bad else nodes[0])
        failure = _node_only(node)
    failure = _timed_out(failure, node)
    # A GPU of the machine's kind failing during the job is why the job failed, wherever the first rank
    # fell: the root cause's node first, then the others in order.
    for n in sorted(nodes, key=lambda n: n.host != node.host):
        gpu = gpu_error(n.report, table_pids(n.log))
        if gpu is None:
            continue
        if n.host != node.host:
            errors = [r for r in per_node[n.host] if not (n.state == "stopped" and r.kind == "signal")]
            node = n
            failure = _timed_out(_describe_rank(min(errors, key=lambda r: (_when(r), r.local_rank)), n)
                                 if errors else _node_only(n), n)
        what, line = gpu
        head, *rest = failure.summary.splitlines() or [""]
        failure = replace(failure, kind="gpu", summary=clip(f"GPU error: {what}\n{line}\nthen {head}", MAX_MESSAGE))
        break
    others = tuple((n.host, _note(n, per_node[n.host], uniform)) for n in nodes if n.host != node.host)
    return replace(failure, others=others[:MAX_OTHERS])


def _timed_out(f: Failure, node: NodeFacts) -> Failure:
    """``f`` (of ``node``) as a ``timeout`` when its words say a collective timed out."""
    lines = [] if f.kind == "exception" else [
        line for line in attempt_lines(node.log)
        if (m := _RANK_PREFIX.match(line)) is None or f.rank is None or int(m.group(1)) == f.rank]
    words = collective_timeout(f, lines)
    if words is None:
        return f
    head = f.summary.splitlines()[0] if f.summary else ""
    return replace(f, kind="timeout", summary=clip(f"a collective timed out: {head}" if words in head
                                                   else f"a collective timed out: {head}\n{words}", MAX_MESSAGE))
