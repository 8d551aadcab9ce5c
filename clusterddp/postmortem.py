"""After a run failed: ask every node what it knows (``clusterddp/node/diagnose.py``), keep the GPU
forensics, and say which rank failed first and why (:mod:`clusterddp.failure`).

Used by `up` once the job has ended everywhere and by `status` when it finds a run failed.
Never raises for what a node does or sends: a node that cannot answer is named in the summary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from . import flight, nodeops
from . import plan as ssh_plan
from .failure import Failure, NodeFacts, diagnose
from .fleet import Fleet
from .flight import Flight
from .node.diagnose import MAX_ANSWER, AnswerError, read_answer
from .record import NodeState, RunRecord
from .store import RunStore
from .transport import Transport

REPORT_TIMEOUT = 60.0   # seconds of silence before a node's report is given up (nvidia-smi may be slow)
LOCAL_LOG_TAIL = 128 << 10
MOST_FLIGHT_REPLY = flight.MOST_REPLY


class _Bounded(bytearray):
    """Keeps the first MAX_ANSWER + 1 bytes written with ``+=`` (enough to know an answer is too long)."""

    def __iadd__(self, data):  # type: ignore[misc]  # returns the _Bounded itself
        room = MAX_ANSWER + 1 - len(self)
        if room > 0:
            super().__iadd__(data[:room])
        return self


def report(
    t: Transport, node: ssh_plan.NodeLaunch, mode: str = "report", master: tuple[str, int] | None = None
) -> dict:
    """The node's diagnose answer, checked (:func:`clusterddp.node.diagnose.read_answer`)."""
    out, err = _Bounded(), _Bounded()

    def take(b: bytes) -> None:
        nonlocal out
        out += b
    code = t.stream(ssh_plan.diagnose_command(node, mode, master), take, timeout=REPORT_TIMEOUT, stderr_to=err)
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


def explain(fleet: Fleet, nodes: Sequence[ssh_plan.NodeLaunch], rec: RunRecord, store: RunStore) -> Failure:
    """Ask every node that may answer (not lost or unreachable) for its report; keep the forensics of
    GPU nodes under ``<run>/forensics/<host>/``; return the diagnosis."""
    res = nodeops.each(fleet, askable(nodes, rec), lambda n, t: report(t, n))
    failure = explain_reports(rec, store, res.succeeded, res.failed)
    return replace(failure, flight=flights(fleet, askable(nodes, rec), rec, store))


def flights(fleet: Fleet, nodes: Sequence[ssh_plan.NodeLaunch], rec: RunRecord, store: RunStore) -> Flight | None:
    """The flight recorder dumps torch left on ``nodes`` (:mod:`clusterddp.flight`), kept as they came under
    ``<run>/flight/<host>/rank<N>`` and read; None when there is none (no NCCL timeout, or no node answered)."""
    def fetch(node: ssh_plan.NodeLaunch, t: Transport) -> list[tuple[int, bytes | None, str]]:
        out = bytearray()
        t.stream(ssh_plan.flight_command(node), lambda b: out.extend(b[:MOST_FLIGHT_REPLY + 1 - len(out)]),
                 timeout=REPORT_TIMEOUT, stderr_to=bytearray())
        return flight.parse_reply(bytes(out))
    dumps = []
    for host, got in nodeops.each(fleet, nodes, fetch).succeeded.items():
        for rank, data, why in got:
            if data is not None:
                store.write_evidence(rec.run_id, "flight", host, f"rank{rank}", data)
            dumps.append((host, rank, data, why))
    sizes = [n.nproc for n in rec.nodes if isinstance(n.nproc, int)]
    return flight.read(dumps, sum(sizes) if len(sizes) == len(rec.nodes) else None)


def askable(nodes: Sequence[ssh_plan.NodeLaunch], rec: RunRecord) -> list[ssh_plan.NodeLaunch]:
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
        facts.append(NodeFacts(host=nr.host, node_rank=nr.node_rank, nproc=nr.nproc if isinstance(nr.nproc, int)
                               else None, state=nr.state.value, exit_code=nr.exit_code, error=nr.error, log=log,
                               report=rep, report_error=str(why) if why is not None else None))
    return diagnose(facts, rec.failed_host)
