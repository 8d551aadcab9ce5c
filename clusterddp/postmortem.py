"""After a run failed: ask every node what it knows (``clusterddp/node/diagnose.py``), keep the GPU
forensics, and say which rank failed first and why (:mod:`clusterddp.failure`).

Used by `up` once the job has ended everywhere and by `status` when it finds a run failed.
Never raises for what a node does or sends: a node that cannot answer is named in the summary.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence

from . import nodeops
from . import plan as P
from .failure import MAX_ERROR_FILE, Failure, NodeFacts, diagnose, torchrun_failures
from .fleet import Fleet
from .node.diagnose import MAX_ANSWER, AnswerError, read_answer
from .record import NodeState, RunRecord
from .store import RunStore
from .transport import Transport

REPORT_TIMEOUT = 60.0   # seconds of silence before a node's report is given up (nvidia-smi may be slow)
LOCAL_LOG_TAIL = 128 << 10


class _Bounded(bytearray):
    """Keeps the first MAX_ANSWER + 1 bytes written with ``+=`` (enough to know an answer is too long)."""

    def __iadd__(self, data):  # type: ignore[misc]  # returns the _Bounded itself
        room = MAX_ANSWER + 1 - len(self)
        if room > 0:
            super().__iadd__(data[:room])
        return self


def report(t: Transport, node: P.NodeLaunch, mode: str = "report", master: tuple[str, int] | None = None) -> dict:
    """The node's diagnose answer, checked (:func:`clusterddp.node.diagnose.read_answer`)."""
    out, err = _Bounded(), _Bounded()

    def take(b: bytes) -> None:
        nonlocal out
        out += b
    code = t.stream(P.diagnose_command(node, mode, master), take, timeout=REPORT_TIMEOUT, stderr_to=err)
    if code != 0:
        lines = err.decode("utf-8", "replace").strip().splitlines()
        raise AnswerError(f"diagnose exited {code}: {lines[-1][:200] if lines else ''}")
    return read_answer(bytes(out))


def _local_log(store: RunStore, run_id: str, host: str) -> bytes:
    try:
        with open(store.log_path(run_id, host), "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - LOCAL_LOG_TAIL))
            return f.read()
    except OSError:
        return b""


def explain(fleet: Fleet, nodes: Sequence[P.NodeLaunch], rec: RunRecord, store: RunStore) -> Failure:
    """Ask every node that may answer (not lost or unreachable) for its report; keep the forensics of
    GPU nodes under ``<run>/forensics/<host>/``; return the diagnosis."""
    res = nodeops.each(fleet, askable(nodes, rec), lambda n, t: report(t, n))
    return explain_reports(rec, store, res.succeeded, res.failed)


def askable(nodes: Sequence[P.NodeLaunch], rec: RunRecord) -> list[P.NodeLaunch]:
    """The nodes that may answer a report: not lost or unreachable."""
    return [n for n in nodes if rec.node(n.host.name).state not in (NodeState.LOST, NodeState.UNREACHABLE)]


def explain_reports(rec: RunRecord, store: RunStore, reports: Mapping[str, dict],
                    failed: Mapping[str, BaseException]) -> Failure:
    """The diagnosis from each node's report (``reports``: host -> :func:`report`'s answer; ``failed``:
    host -> why it gave none), every backend's: the error files and GPU forensics are kept in the run folder."""
    facts = []
    for nr in rec.nodes:
        rep = reports.get(nr.host)
        why = failed.get(nr.host)
        log = _local_log(store, rec.run_id, nr.host)
        if rep is not None:
            for e in rep["errors"]:
                rel = f"attempt_{e['attempt']}/{e['local_rank']}/error.json"
                store.write_evidence(rec.run_id, "errors", nr.host, rel, e["data"].encode())
            if rep["log"] is not None and len(rep["log"]) >= len(log):
                log = rep["log"].encode()
            if rep["nvidia_smi"] is not None:
                store.write_evidence(rec.run_id, "forensics", nr.host, "nvidia-smi.txt", rep["nvidia_smi"].encode())
                xid = [line for line in rep["kernel_lines"] if "Xid" in line]
                store.write_evidence(rec.run_id, "forensics", nr.host, "xid.txt",
                                      "".join(line + "\n" for line in xid).encode() if xid else
                                      f"no Xid lines ({rep['kernel_error'] or 'kernel log read'})\n".encode())
            rep = with_log_exception(rep, log)
        facts.append(NodeFacts(host=nr.host, node_rank=nr.node_rank, nproc=nr.nproc if isinstance(nr.nproc, int)
                               else None, state=nr.state.value, exit_code=nr.exit_code, error=nr.error, log=log,
                               report=rep, report_error=str(why) if why is not None else None))
    return diagnose(facts, rec.failed_host)


_TRACEBACK = "Traceback (most recent call last):"
_EXC_TYPE = re.compile(r"[A-Za-z_][\w.]{0,199}")
_ATTEMPT_START = "[clusterddp] node "  # the line launch.sh and node.sh print before torchrun starts
LOG_SCAN = 256 << 10  # bytes at the end of a node's log searched for a traceback


def exception_in_log(log: bytes, rank: int) -> tuple[str, str] | None:
    """The first Python traceback global rank ``rank`` printed in the last attempt of a node's log, as
    (the exception line, the traceback text), or None. torch's process group prefixes each line of a
    worker's uncaught exception with ``[rank<N>]: `` (its excepthook); a traceback without it is
    taken only when the log holds exactly one (then it cannot be another rank's)."""
    text = log[-LOG_SCAN:].decode("utf-8", "replace").replace("\r\n", "\n")
    start = text.rfind(_ATTEMPT_START)
    lines = text[start if start >= 0 else 0:].split("\n")
    prefix = f"[rank{rank}]: "
    ours = [line[len(prefix):] for line in lines if line.startswith(prefix)]
    found = _tracebacks(ours)
    if found:
        return found[0]
    bare = _tracebacks(lines)
    return bare[0] if len(bare) == 1 else None


def _tracebacks(lines: list[str]) -> list[tuple[str, str]]:
    out = []
    for i, line in enumerate(lines):
        if line.rstrip() != _TRACEBACK:
            continue
        j = i + 1
        while j < len(lines) and lines[j].startswith((" ", "\t")):
            j += 1
        if j >= len(lines):
            break
        head = lines[j].rstrip()
        exc_type = head.partition(":")[0]
        if _EXC_TYPE.fullmatch(exc_type) and not exc_type.startswith("torch.distributed.elastic."):
            out.append((head, "\n".join(lines[i:j + 1])))  # torchrun's own ChildFailedError is not one
    return out


def with_log_exception(rep: dict, log: bytes) -> dict:
    """A node's report with the exceptions its log shows, for a script without ``@record`` (so no
    error file): each rank torchrun's table says exited with code 1 and no error file, whose traceback
    the log holds, is given to the diagnosis as that rank's error file, in torch's format, so an
    exception reads the same whichever way it was recorded."""
    have = {e["local_rank"] for e in rep["errors"]}
    attempt = max((e["attempt"] for e in rep["errors"]), default=0)
    added = []
    for r in torchrun_failures(log):
        if r.kind != "exit" or r.exit_code != 1 or r.local_rank in have or r.rank is None:
            continue
        found = exception_in_log(log, r.rank)
        if found is None:
            continue
        head, callstack = found
        info: dict = {"py_callstack": callstack[-(64 << 10):]}
        if math.isfinite(r.time):
            info["timestamp"] = str(int(r.time))
        data = json.dumps({"message": {"message": head[:4000], "extraInfo": info}})
        if len(data) <= MAX_ERROR_FILE:
            added.append({"attempt": attempt, "local_rank": r.local_rank, "data": data, "truncated": False})
    return {**rep, "errors": [*rep["errors"], *added]} if added else rep
