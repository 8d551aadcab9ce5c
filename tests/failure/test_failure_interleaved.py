"""The node-log reader of clusterddp/failure.py on what several ranks of one node print at once
(hypothesis): their lines interleaved in any order, torch elastic's agent lines among them, torchrun's
report at the end. Each rank's exception is its own, the last traceback before the exit is the one a
plain script died of, and a rank's log tail holds no other rank's traceback and none of torchrun's words."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from clusterddp import failure as failures

TYPES = st.sampled_from(["ValueError", "RuntimeError", "KeyError", "torch.OutOfMemoryError", "mylib.errors.Bad"])
WORDS = st.text(st.characters(codec="utf-8", categories=["L", "N", "P", "S", "Zs"], exclude_characters="\r\n"),
                min_size=1, max_size=40).map(str.strip).filter(bool)
PRINTS = st.one_of(WORDS.map(lambda w: f"step 3 loss {w}"), st.sampled_from([
    "epoch 0 loss 1.25", "", "  indented output", "*****************************************",
    "[W1201 23:37:02.011 socket.cpp:752] [c10d] The hostname of the client socket cannot be retrieved. err=-3"]))
AGENT = ("W1201 23:37:02.011000 8610 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 11 "
         "closing signal SIGTERM")
TORCHRUN_END = ("E1201 23:37:02.013000 8610 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
                "(exitcode: 1) local_rank: 1 (pid: 12) of binary: /venv/bin/python3\n"
                "Traceback (most recent call last):\n"
                '  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1032, in <module>\n'
                "    main()\n"
                "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
                "============================================================\n"
                "job.py FAILED\n"
                "------------------------------------------------------------\n")


def traceback_lines(rank: int, exc: str, msg: str, chained: tuple[str, str] | None) -> tuple[list[str], str]:
    """What Python prints for an uncaught exception (its cause first, when chained); and its last line."""
    def block(tp: str, text: str, line: int) -> list[str]:
        return ["Traceback (most recent call last):", f'  File "/w/job.py", line {line}, in <module>',
                f"    step_{rank}()", f'  File "/w/job.py", line {line + 5}, in step_{rank}',
                f"    raise {tp}({text!r})", f"{tp}: {text}"]
    out: list[str] = []
    if chained:
        out += block(*chained, 10) + ["", "During handling of the above exception, another exception occurred:", ""]
    return out + block(exc, msg, 40), f"{exc}: {msg}"


def entry(rank: int, local_rank: int, code: int) -> str:
    return (f"[{local_rank}]:\n  time      : 2026-12-01_23:37:02\n  host      : node-2\n"
            f"  rank      : {rank} (local_rank: {local_rank})\n  exitcode  : {code} (pid: {100 + local_rank})\n"
            f"  error_file: <N/A>\n  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/\n")


def table(codes: dict[int, int], base: int, root: int) -> str:
    others = [entry(r, r - base, c) for r, c in codes.items() if r != root]
    return (TORCHRUN_END + "Failures:\n" + ("".join(others) or "  <NO_OTHER_FAILURES>\n")
            + "------------------------------------------------------------\nRoot Cause (first observed failure):\n"
            + entry(root, root - base, codes[root]) + "=" * 60 + "\n")


@st.composite
def interleaved(draw, streams: list[list[str]]) -> list[str]:
    """One merge of ``streams``, each stream's own order kept."""
    left = [list(s) for s in streams if s]
    out: list[str] = []
    while left:
        i = draw(st.integers(0, len(left) - 1))
        out.append(left[i].pop(0))
        left = [s for s in left if s]
    return out


@st.composite
def node_logs(draw):
    """A node's log whose ranks (2 to 4 of them) each print, and some raise (the prefixed traceback torch's
    hook writes once the process group exists) or are ended by torchrun's SIGTERM."""
    n = draw(st.integers(2, 4))
    base = draw(st.sampled_from([0, 2, 4, 8]))
    fates = draw(st.lists(st.sampled_from(["raise", "sigterm", "exit"]), min_size=n, max_size=n).filter(
        lambda fs: "raise" in fs))
    streams, raised, codes = [], {}, {}
    for i, fate in enumerate(fates):
        rank = base + i
        lines = draw(st.lists(PRINTS, max_size=4))
        if fate == "raise":
            chained = draw(st.none() | st.tuples(TYPES, WORDS))
            tb, last = traceback_lines(rank, draw(TYPES), draw(WORDS), chained)
            # torch's hook prefixes every line but the empty ones
            lines += [f"[rank{rank}]: {line}" if line else "" for line in tb]
            raised[rank], codes[rank] = last, 1
        elif fate == "sigterm":
            codes[rank] = -15
        streams.append(lines)
    streams.append([AGENT] * draw(st.integers(0, 2)))
    body = draw(interleaved(streams))
    root = draw(st.sampled_from(sorted(raised)))
    log = "[clusterddp] node 1/2 on node-2 iface=eth0\n" + "".join(line + "\n" for line in body)
    return (log + table(codes, base, root)).encode(), base, n, raised, root


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(node_logs())
def test_each_rank_of_interleaved_output_gets_its_own_exception_and_its_own_tail(case):
    log, base, n, raised, root = case
    lines = failures.attempt_lines(log)
    for rank in range(base, base + n):
        got = failures.rank_traceback(lines, rank)
        assert (got[0] if got else None) == raised.get(rank), (rank, got)
        tail = failures.rank_tail(lines, rank)
        foreign = [line for line in tail if line.startswith("[rank") and not line.startswith(f"[rank{rank}]: ")]
        torchruns = [line for line in tail if "torch/distributed/elastic" in line or "=====" in line
                     or "exitcode" in line or "ChildFailedError" in line]
        assert not foreign and not torchruns, tail
    node = failures.NodeFacts("node-2", 1, n, "failed", 1, None, log, {"errors": [], "kernel_lines": []})
    errors = {r.rank: r for r in failures.rank_errors(node)}
    for rank, last in raised.items():
        assert errors[rank].kind == "exception" and f"{errors[rank].exc_type}: {errors[rank].message}" == last
    f = failures.diagnose([node], "node-2")
    assert f.kind == "exception" and f.rank in raised


@st.composite
def plain_logs(draw):
    """A node's log of a plain script whose rank 1 died before any process group existed: its unprefixed
    traceback (after one it printed itself and caught, maybe, which the other rank printed too, maybe
    after rank 1 died), other ranks' prefixed lines and torch's agent lines between its lines, every
    rank's prints before and after it."""
    prints = draw(st.lists(PRINTS, max_size=5))
    caught, again = [], []
    if draw(st.booleans()):
        caught = traceback_lines(0, draw(TYPES), draw(WORDS), None)[0]
        again = caught if draw(st.booleans()) else []  # rank 0 printed the same, after rank 1 died
    died, last = traceback_lines(1, draw(TYPES), draw(WORDS), draw(st.none() | st.tuples(TYPES, WORDS)))
    between = [f"[rank5]: {w}" for w in draw(st.lists(WORDS, max_size=3))] + [AGENT] * draw(st.integers(0, 2))
    own = draw(interleaved([caught + ["rank 1 carries on"] + died, between]))
    after = draw(st.lists(PRINTS, max_size=2))
    log = "[clusterddp] node 0/1 on vm\n" + "".join(line + "\n" for line in prints + own + again + after)
    return (log + table({1: 1, 0: -15}, 0, 1)).encode(), last


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(plain_logs())
def test_without_a_prefix_the_last_traceback_before_the_exit_is_taken(case):
    log, last = case
    got = failures.bare_traceback(failures.attempt_lines(log), 2)
    assert got is not None and got[0] == last, got
    f = failures.diagnose(
        [failures.NodeFacts("vm", 0, 2, "failed", 1, None, log, {"errors": [], "kernel_lines": []})], "vm"
    )
    assert (f.kind, f.rank, f"{f.exc_type}: {f.message}") == ("exception", 1, last)
