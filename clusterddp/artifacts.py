"""Bring a run's logs and ``collect`` globs back, verified.

One command per node (``plan.collect_command``; the node program and its receiver are in
:mod:`clusterddp.node.collect`) does the whole job, since every remote command pays for a shell
start: the launcher sends the sizes of the local copies it already has; the node sends its log,
then each file whose local copy differs in size, streamed and hashed in one pass, and only a
sha256 for each file whose local copy has the same size. The launcher hashes what it receives
into a temporary file and renames it into ``artifacts/<host>/<path>`` only when size and hash
agree with the node's; a same-size local copy is whole when its hash matches, else it is fetched
again in a second command. So re-collecting a run whose artifacts are already whole
re-downloads nothing. A file that changes while it is read (a running job still writing it) is
not taken half-written: it is reported as skipped.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

from . import nodeops
from . import plan as P
from .errors import HostError
from .fleet import Fleet
from .node.collect import Receiver
from .store import RunStore
from .transport import Transport


@dataclass(frozen=True)
class CollectResult:
    """Per-host outcome: files fetched, already whole, skipped (changing while read), error."""

    host: str
    fetched: tuple[str, ...] = ()
    whole: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    error: str | None = None
    bytes: int = 0


class Progress(Protocol):
    def start(self, host: str, total: int) -> None: ...
    def advance(self, host: str, n: int) -> None: ...


class _Quiet:
    def start(self, host: str, total: int) -> None:
        pass

    def advance(self, host: str, n: int) -> None:
        pass


def local_sizes(base: Path) -> dict[str, int]:
    """{relative posix path: size} of the files already collected under ``base``."""
    out = {}
    for root, _, names in os.walk(base):
        for n in names:
            if not n.endswith(".part"):
                p = Path(root, n)
                out[p.relative_to(base).as_posix()] = p.stat().st_size
    return out


def collect_nodes(fleet: Fleet, nodes: Sequence[P.NodeLaunch], store: RunStore, run_id: str,
                  globs: tuple[str, ...], progress: Progress | None = None) -> list[CollectResult]:
    """:func:`collect_node` on every node through ``fleet``, in parallel; one result per node, in node
    order, a node that cannot be reached included."""
    res = nodeops.each(fleet, nodes, lambda n, t: collect_node(t, n, store, run_id, globs, progress))
    return list(res.or_else(lambda h, e: CollectResult(h, error=_why(e))).values())


def _why(e: Exception) -> str:
    # A host the fleet could not reach says so itself; anything else is a surprise: name its type.
    return str(e) if isinstance(e, HostError) else f"{type(e).__name__}: {e}"


def collect_node(t: Transport, node: P.NodeLaunch, store: RunStore, run_id: str, globs: tuple[str, ...],
                 progress: Progress | None = None) -> CollectResult:
    """Fetch the node's log and the files its run folder holds under ``globs``."""
    name = node.host.name
    bar = progress or _Quiet()
    rx = Receiver(lambda rel: store.artifact_path(run_id, name, rel),
                  on_total=lambda n: bar.start(name, n), on_bytes=lambda n: bar.advance(name, n))
    try:
        have = local_sizes(store.artifacts_dir(run_id, name))
        _exchange(t, node, rx, {"log": True, "globs": list(globs), "have": have})
        if rx.log is not None:
            store.write_log(run_id, name, bytes(rx.log))
        if rx.differ:  # same size, other content (a damaged copy): send them whatever their size
            again, rx.differ = rx.differ, []
            _exchange(t, node, rx, {"paths": again, "have": {}})
            done = set(rx.fetched) | set(rx.skipped)
            rx.skipped += [p for p in again if p not in done]
    except HostError as e:
        rx.errors.insert(0, str(e))
    finally:
        rx.discard()
    error = "; ".join(rx.errors) or None
    return CollectResult(name, tuple(rx.fetched), tuple(rx.whole), tuple(rx.skipped), error, rx.bytes)


def _exchange(t: Transport, node: P.NodeLaunch, rx: Receiver, request: dict) -> None:
    err = bytearray()
    code = t.stream(P.collect_command(node), rx.feed, timeout=120, stderr_to=err,
                    stdin=json.dumps(request).encode())
    if code != 0:
        lines = err.decode("utf-8", "replace").strip().splitlines()
        raise HostError(node.host.name, f"collect failed on the node: {lines[-1] if lines else f'exit {code}'}")
