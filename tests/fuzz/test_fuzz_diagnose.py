"""Property-based: a node's ``diagnose`` answer and what it carries (torchrun's error files, the end of
its log with torchrun's failure table), through ``node.diagnose.read_answer`` and ``failure.diagnose``.

An answer rendered as the node program writes it reads back with its values; an error file
``{"message": "ValueError: boom", ...}`` gives that exception type and message; a failure table entry
gives its rank, local rank, exit code and pid, as its ASCII digits say. Mutated answers (any JSON value,
50,000-deep nesting, huge numbers, control characters, Unicode digits, invalid UTF-8, cut bytes) give an
answer or an AnswerError, and the diagnosis of whatever was accepted never raises.
"""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from clusterddp import failure
from clusterddp.node import diagnose
from fuzzing import (
    ANY_TEXT,
    DEEP_JSON,
    UNICODE_DIGITS,
    case,
    fuzz,
    hostile_bytes,
    hostile_text,
    json_edited,
    spliced,
    spliced_bytes,
)

TYPES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.]{0,30}", fullmatch=True)
MESSAGES = st.from_regex(r"[ -~]{0,60}", fullmatch=True).map(str.strip)


def error_file(exc: str, msg: str, stamp: int, rank: int | None) -> str:
    extra: dict = {"py_callstack": f'Traceback (most recent call last):\n  File "t.py", line 3, in <module>\n'
                                   f"    boom()\n{exc}: {msg}\n", "timestamp": str(stamp)}
    if rank is not None:
        extra["clusterddp"] = {"time": stamp + 0.25, "rank": rank}
    return json.dumps({"message": {"message": f"{exc}: {msg}" if msg else exc, "extraInfo": extra}})


def table(rank: str, local_rank: str, code: str, pid: str) -> str:
    return ("[0]:\n  time      : 2026-11-30_14:50:01\n  host      : node2\n"
            f"  rank      : {rank} (local_rank: {local_rank})\n  exitcode  : {code} (pid: {pid})\n"
            "  error_file: <N/A>\n")


ERRORS = st.lists(st.builds(lambda a, lr, e, m, s, r: {"attempt": a, "local_rank": lr, "data": error_file(e, m, s, r),
                                                        "truncated": False},
                            st.integers(0, 5), st.integers(0, 16), TYPES, MESSAGES, st.integers(10 ** 9, 2 * 10 ** 9),
                            st.none() | st.integers(0, 1000)), max_size=4)


@st.composite
def answers(draw) -> dict:
    a = {"joined": draw(st.booleans()), "reach": draw(st.none() | st.sampled_from(["ok", "refused", "timed out"])),
         "errors": draw(ERRORS), "log": draw(st.none() | ANY_TEXT),
         "kernel": draw(st.sampled_from([{"lines": ["Out of memory: Killed process 1234 (python)"]},
                                         {"error": "dmesg: read kernel buffer failed"}, {"lines": []}]))}
    if draw(st.booleans()):
        a["nvidia_smi"] = draw(ANY_TEXT)
    return a


def read(data: bytes):
    got = None
    with case("diagnose answer", diagnose.AnswerError):
        got = diagnose.read_answer(data)
    return got


def diagnosis(report: dict | None, log: bytes) -> failure.Failure:
    node = failure.NodeFacts("node2", 1, 2, "failed", 1, None, log, report)
    other = failure.NodeFacts("node1", 0, 2, "stopped", 143, None, b"", None, "unreachable")
    got = None
    with case("failure diagnosis"):
        got = failure.diagnose([other, node], "node2")
        assert isinstance(got, failure.Failure) and got.kind in failure.KINDS
        got.lines()
        json.dumps(got.to_json())
    assert got is not None
    return got


@fuzz(30, share=0.25)
@given(a=answers(), banner=st.sampled_from([b"", b"Welcome\n", b'{"joined": 1}\n']))
def test_a_rendered_answer_reads_back_with_its_values(a, banner):
    got = read(banner + json.dumps(a).encode() + b"\n")
    assert got is not None
    assert got["joined"] is a["joined"] and got["reach"] == a["reach"] and got["log"] == a["log"]
    assert got["errors"] == a["errors"]
    assert got["kernel_lines"] == a["kernel"].get("lines", []) and got["kernel_error"] == a["kernel"].get("error")
    assert got["nvidia_smi"] == a.get("nvidia_smi")
    diagnosis(got, (a["log"] or "").encode())


@fuzz(30)
@given(exc=TYPES, msg=MESSAGES, stamp=st.integers(10 ** 9, 2 * 10 ** 9), rank=st.none() | st.integers(0, 1000),
       lr=st.integers(0, 16))
def test_an_error_file_gives_its_exception_type_and_message(exc, msg, stamp, rank, lr):
    with case("torchrun error file"):
        r = failure.parse_error_file(error_file(exc, msg, stamp, rank), lr)
    assert r is not None and r.kind == "exception" and r.local_rank == lr and r.rank == rank
    assert (r.exc_type, r.message) == (exc, msg)
    assert r.frames == ("t.py:3 in <module>: boom()",)
    assert r.time == (stamp + 0.25 if rank is not None else stamp)


DIGITS = st.lists(st.sampled_from(tuple("0123456789") + UNICODE_DIGITS), min_size=1, max_size=4).map("".join)


@fuzz(30)
@given(rank=DIGITS, lr=DIGITS, code=st.one_of(DIGITS, DIGITS.map("-".__add__)), pid=DIGITS,
       before=st.sampled_from(["", "noise\n", "\r\n"]))
def test_a_failure_table_entry_gives_the_numbers_its_ascii_digits_say(rank, lr, code, pid, before):
    log = (before + table(rank, lr, code, pid)).encode()
    with case("torchrun failure table"):
        got = failure.torchrun_failures(log)
    ascii_ok = all(x.isascii() for x in (rank, lr, code, pid))
    if not ascii_ok:
        assert got == [], got  # not a table torchrun wrote: no rank read from it
    elif got:
        (r,) = got
        assert (r.rank, r.local_rank, r.exit_code, r.pid) == (int(rank), int(lr), int(code), int(pid))


@st.composite
def mutated(draw) -> tuple[bytes, bytes]:
    a = draw(answers())
    log = table("3", "1", "-9", "1234").encode()
    how = draw(st.sampled_from(["json", "bytes", "deep", "any", "error file", "log"]))
    if how == "json":
        data = json.dumps(draw(json_edited(a))).encode()
    elif how == "bytes":
        data = draw(spliced_bytes(json.dumps(a).encode()))
    elif how == "deep":
        data = draw(st.sampled_from(DEEP_JSON)).encode()
    elif how == "any":
        data = draw(hostile_bytes())
    elif how == "error file":  # the answer is well formed; the error file inside it is not
        good = error_file("E", "m", 1, 0)
        bad = st.one_of(spliced(good), hostile_text(), st.builds(json.dumps, json_edited(json.loads(good))))
        a["errors"] = [{"attempt": 0, "local_rank": 0, "truncated": False, "data": draw(bad)}]
        data = json.dumps(a).encode()
    else:
        data = json.dumps(a).encode()
        log = draw(st.one_of(spliced_bytes(log), hostile_bytes()))
    return data, log


@fuzz(60)
@given(case_=mutated())
def test_any_answer_gives_an_answer_or_an_answer_error_and_a_diagnosis(case_):
    data, log = case_
    got = read(data)
    diagnosis(got, log)
