"""Property-based: ``clusterddp stacks``' reply from a node, through ``node.stacks.parse_reply``, and the
dumps in it, through ``parse_dump`` and the grouping and rendering of ``clusterddp.stacks``.

A reply rendered as the node program writes it (after any login banner) parses back to the same values;
mutated replies (values of any JSON type, huge numbers, NaN, 50,000-deep nesting, invalid UTF-8, control
characters, cut or spliced bytes) give checked values or a ReplyError, every value accepted in its
range; any text as a dump gives threads and frames without raising, and what `stacks` prints of it is
one line per line, escaped.
"""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from clusterddp import stacks as stack_dumps
from clusterddp.node import stacks as node_stacks
from clusterddp.node.reply import ReplyError
from fuzzing import ANY_TEXT, DEEP_JSON, case, fuzz, hostile_bytes, hostile_text, json_edited, spliced, spliced_bytes

TEXT = st.one_of(ANY_TEXT, hostile_text(3, big=False))
FRAME_LINE = st.builds(lambda f, ln, fn: f'  File "{f}", line {ln} in {fn}', TEXT,
                       st.integers(0, 10 ** 6) | st.just("???"), TEXT)
DUMP_TEXT = st.lists(st.one_of(FRAME_LINE, st.just("Thread 0x00007f0000000001 (most recent call first):"),
                               st.just("Current thread 0x00007f0000000002 (most recent call first):"), TEXT),
                     max_size=12).map("\n".join)
PROC = st.fixed_dictionaries({
    "pid": st.integers(1, 2 ** 31 - 1), "role": st.sampled_from(["rank", "agent"]),
    "rank": st.none() | st.integers(0, 2 ** 24 - 1), "local_rank": st.none() | st.integers(0, 2 ** 24 - 1),
    "how": st.sampled_from(["faulthandler", "py-spy", "none"]),
    "main": st.none() | st.sampled_from(["1", "7f0000000001"]),
    "dump": DUMP_TEXT, "note": st.sampled_from(["", "no dump within 3s"])})


@st.composite
def replies(draw) -> dict:
    return {"time": draw(st.floats(0, 1e11)), "host": draw(st.sampled_from(["node1", "gpu-02"])),
            "state": draw(st.sampled_from(["running", "ended", "missing"])),
            "exit_code": draw(st.none() | st.integers(0, 255)), "procs": draw(st.lists(PROC, max_size=4))}


def render(r: object, banner: bytes = b"") -> bytes:
    return banner + (node_stacks.MARK + json.dumps(r) + "\n").encode("utf-8", "surrogatepass")


def parse(data: bytes):
    got = None
    with case("stacks reply", ReplyError):
        got = node_stacks.parse_reply(data)
    return got


BANNERS = st.sampled_from([b"", b"Welcome to gpu-01\n", b"\x1b[2J motd\r\n", (node_stacks.MARK + "{}\n").encode(),
                           b"\xff\xfe\n"])


@fuzz(30, share=0.25)
@given(r=replies(), banner=BANNERS)
def test_a_rendered_reply_parses_back_to_its_values(r, banner):
    assert parse(render(r, banner)) == r


def valid(got: dict) -> None:
    assert 0 <= got["time"] <= 1e11 and got["state"] in ("running", "ended", "missing")
    assert got["exit_code"] is None or 0 <= got["exit_code"] <= 255
    assert len(got["procs"]) <= node_stacks.MOST_PROCS
    for p in got["procs"]:
        assert type(p["pid"]) is int and 0 < p["pid"] < 2 ** 31
        assert p["role"] in ("rank", "agent") and p["how"] in ("faulthandler", "py-spy", "none")
        assert all(x is None or (type(x) is int and 0 <= x < 2 ** 24) for x in (p["rank"], p["local_rank"]))
        assert isinstance(p["dump"], str) and len(p["dump"]) <= node_stacks.MOST_DUMP
        assert "\n" not in p["note"] and "\r" not in p["note"]


@st.composite
def mutated(draw) -> bytes:
    r = draw(replies())
    how = draw(st.sampled_from(["json", "bytes", "deep", "any"]))
    if how == "json":
        return render(draw(json_edited(r)), draw(BANNERS))
    if how == "bytes":
        return draw(spliced_bytes(render(r)))
    if how == "deep":
        return node_stacks.MARK.encode() + draw(st.sampled_from(DEEP_JSON)).encode() + b"\n"
    return node_stacks.MARK.encode() + draw(hostile_bytes())


@fuzz(60)
@given(data=mutated())
def test_any_reply_gives_checked_values_or_a_reply_error(data):
    got = parse(data)
    if got is not None:
        valid(got)


@fuzz(40)
@given(text=st.one_of(DUMP_TEXT, spliced('Current thread 0x1 (most recent call first):\n  File "a.py", line 3 in f\n')))
def test_any_dump_gives_threads_and_frames_and_prints_one_line_per_line(text):
    with case("stacks dump"):
        threads = node_stacks.parse_dump(text)
        for tid, current, frames in threads:
            assert 0 <= tid < 2 ** 64 and isinstance(current, bool)
            for f, ln, fn in frames:
                assert isinstance(f, str) and isinstance(fn, str) and (ln is None or 0 <= ln < 10 ** 9)
                assert "\n" not in f + fn
        frames = tuple(threads[0][2]) if threads else ()
        proc = stack_dumps.Proc("node1", 1, "rank", 0, 0, "faulthandler", "", text,
                      tuple((t, c, tuple(fr)) for t, c, fr in threads), frames)
        from clusterddp.cli.common import visible
        from clusterddp.cli.stacks import render
        taken = stack_dumps.Taken("r", 0.0, [proc, proc])
        for line in render(taken, stack_dumps.group(taken.procs)):
            assert "\n" not in line and "\r" not in visible(line) and "\x1b" not in visible(line)
