"""torchrun's teardown on a failure or a stop is not echoed on `up`'s terminal (issue 39 §5): its
agent's log lines and its own ChildFailedError / SignalException traceback (with ChildFailedError's
table) are hidden and counted; a rank's own traceback, and any other line, is shown as it came.
The fixtures are real node output of a 3-node bed run (tests/fixtures/teardown/README.md)."""

from __future__ import annotations

import io
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from clusterddp.cli.common import PrefixPrinter
from clusterddp.noise import Teardown, without_teardown

FIXTURES = Path(__file__).parent.parent / "fixtures" / "teardown"
MARKERS = ("ChildFailedError", "SignalException", "closing signal", "death signal", "torch/distributed/run.py",
           "Root Cause (first observed failure)", "failed (exitcode: ", "=" * 60)


def _lines(name: str) -> list[str]:
    return (FIXTURES / name).read_text(encoding="utf-8").splitlines()


def test_a_one_rank_crash_keeps_the_ranks_tracebacks_and_hides_torchruns():
    lines = _lines("crash-node2.log")
    shown = without_teardown(lines)
    assert not [s for s in shown if any(m in s for m in MARKERS)], shown
    assert "[rank3]: ValueError: boom" in shown and any("Connection closed by peer" in s for s in shown)
    assert [s for s in lines if s in shown] == shown  # nothing added, the order kept
    assert len(lines) - len(shown) >= 40  # the teardown of one node: ~43 lines


def test_an_interrupt_hides_every_nodes_signal_exception_and_the_agents_lines():
    lines = _lines("interrupt-node1.log")
    shown = without_teardown(lines)
    assert not [s for s in shown if any(m in s for m in MARKERS)], shown
    assert shown[-1] == "[clusterddp] stop signal received" and "Terminated" not in shown


def test_a_users_own_traceback_is_shown_whole_and_in_order():
    mine = ["Traceback (most recent call last):", '  File "train.py", line 3, in <module>', "    main()",
            "ValueError: not torchrun's", "after it"]
    assert without_teardown(mine) == mine
    # a traceback right after torchrun's: the first hidden, the second shown
    theirs = ["Traceback (most recent call last):", '  File "run.py", line 1, in <module>',
              "torch.distributed.elastic.multiprocessing.api.SignalException: Process 1 got signal: 15"]
    assert without_teardown(theirs + mine) == mine
    # a traceback whose end never comes (the node was lost mid-write) is shown at the end
    assert without_teardown(mine[:3]) == mine[:3]
    # ChildFailedError with no table after it (another torch): the next line is shown
    assert without_teardown(["Traceback (most recent call last):", "  x",
                             "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", "next"]) == ["next"]


def test_a_held_traceback_is_bounded():
    t = Teardown()
    long = [b"Traceback (most recent call last):"] + [b"  frame"] * (Teardown.MOST + 5)
    shown = [s for line in long for s in t.feed("a", line)]
    assert shown == long and t.hidden == 0  # past MOST lines it is shown: a user's, however deep


def test_the_printer_shows_each_hosts_lines_counts_the_hidden_and_flushes_a_held_traceback():
    out = io.StringIO()
    t = Teardown()
    p = PrefixPrinter(["node1", "node2"], stream=out, teardown=t)
    crash = "\n".join(_lines("crash-node2.log")).encode() + b"\n"
    for i in range(0, len(crash), 97):  # in chunks that split lines, interleaved with another host
        p("node2", crash[i:i + 97])
        p("node1", b"Epoch 1 | rank 0\n")
    p("node1", b"Traceback (most recent call last):\n  File \"t.py\", line 1\n")
    p.flush()
    text = out.getvalue()
    assert not any(m in text for m in MARKERS)
    assert "[node2] [rank3]: ValueError: boom" in text and text.endswith('[node1]   File "t.py", line 1\n')
    assert t.hidden >= 40 and "teardown not shown" in (t.summary("runs/x/logs/") or "")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([
    "Traceback (most recent call last):", '  File "x.py", line 1', "    y()", "ValueError: v", "", "Epoch 3",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", "=" * 60, "[0]:", "  rank : 1",
    "torch.distributed.elastic.multiprocessing.api.SignalException: Process 1 got signal: 15",
    "W1206 04:19:29.924000 22841 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 1 closing "
    "signal SIGTERM", "Terminated", "[rank0]: Traceback (most recent call last):"]), max_size=60))
def test_every_line_is_shown_once_or_hidden_and_counted_in_order(lines):
    t = Teardown()
    shown = [s for line in lines for s in t.feed("h", line.encode())] + [s for _, s in t.drain()]
    assert len(shown) + t.hidden == len(lines)
    it = iter(line.encode() for line in lines)
    assert all(any(s == x for x in it) for s in shown)  # a subsequence: in order, never made up
