"""`logs --follow` into a pipe whose reader left: every node's stream ends at once, not only the one
that printed (a node that prints nothing kept the command waiting for its job's end)."""

from __future__ import annotations

import threading
import time

import pytest

from clusterddp.backends.ssh import control
from clusterddp.errors import StdoutClosed
from clusterddp.inventory import Host
from clusterddp.store import RunStore
from clusterddp.transport.base import CommandResult
from helpers import make_record


@pytest.mark.parametrize("talker", ["a", "b"])
def test_a_closed_stdout_ends_every_nodes_stream_whichever_node_printed(tmp_path, talker):
    store = RunStore(tmp_path / "runs")
    store.create(make_record("r1"))
    closed: dict[str, threading.Event] = {}

    class Node:
        def __init__(self, host: Host) -> None:
            self.name = host.name
            closed[self.name] = threading.Event()

        def run(self, command: str, **kw) -> CommandResult:
            raise AssertionError("no status asked of a stream that was ended")

        def stream(self, command, on_data, **kw) -> int:
            if self.name == talker:
                on_data(b"a line\n")
            if not closed[self.name].wait(60):  # the silent node's job runs on: only closing ends its stream
                raise AssertionError("never closed")
            raise OSError("connection closed")

        def close(self) -> None:
            closed[self.name].set()

    def reader_gone(host: str, data: bytes) -> None:
        raise StdoutClosed
    t0 = time.monotonic()
    with pytest.raises(StdoutClosed):
        control.follow(store, "r1", reader_gone, None, {}, connect=Node)
    assert time.monotonic() - t0 < 30 and all(e.is_set() for e in closed.values())
