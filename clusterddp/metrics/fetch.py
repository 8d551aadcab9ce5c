"""Bring each node's sample files back into the run folder (:mod:`.samples` says where), one command a node:
with the logs at a run's end and on `clusterddp collect` (:func:`clusterddp.artifacts.collect_nodes`), and on
`clusterddp metrics` / `report` of a run still going, for its latest samples. Best effort: a node that does not
answer keeps what was brought back before, and is named."""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from pathlib import Path

from .. import nodeops
from .. import plan as ssh_plan
from ..fleet import Fleet
from ..transport import Transport
from .samples import MOST, fetch_command, save, split_answer

ANSWER_MOST = 4 * (MOST + 4096)  # bytes of one node's answer kept (its last attempt and a few earlier ones)


def fetch_node(t: Transport, node: ssh_plan.NodeLaunch, run_dir: Path) -> int:
    """One node's sample files saved under ``run_dir``; how many."""
    buf = bytearray()

    def take(b: bytes) -> None:
        if len(buf) < ANSWER_MOST:
            buf.extend(b[:ANSWER_MOST - len(buf)])
    t.stream(fetch_command(node.control_dir), take, timeout=60, stderr_to=bytearray())
    # the answer names each file by its control folder: the host's name, or `node` for `up local`
    folder = posixpath.basename(node.control_dir.rstrip("/"))
    return len(save(run_dir, node.host.name, split_answer(bytes(buf), folder)))


def fetch_nodes(fleet: Fleet, nodes: Sequence[ssh_plan.NodeLaunch], run_dir: Path) -> dict[str, str]:
    """:func:`fetch_node` on every node in parallel; what went wrong, by host (empty: all answered)."""
    res = nodeops.each(fleet, nodes, lambda n, t: fetch_node(t, n, run_dir))
    return {h: f"{type(e).__name__}: {e}" if not str(e).startswith(h) else str(e)
            for h, e in res.failed.items()}
