"""Property-based: ``clusterddp top``'s reply from a node, through ``node.top.parse_reply``.

A reply rendered as the node program writes it (after any login banner) parses back to the same values
(log lines kept to their last 500 characters); mutated replies (values of any JSON type, huge numbers,
NaN, 50,000-deep nesting, invalid UTF-8, control characters, cut or spliced bytes) give the checked
values or a TopError, and every value accepted lies in its documented range.
"""

from __future__ import annotations

import json
import math

from hypothesis import given
from hypothesis import strategies as st

from clusterddp.node import top
from fuzzing import ANY_TEXT, DEEP_JSON, case, fuzz, hostile_bytes, hostile_text, json_edited, spliced_bytes

WHOLE = {"exit_code": (0, 255), "step": (0, 10 ** 18), "rss": (0, 2 ** 62), "procs": (0, 10 ** 7)}
TEXT = st.one_of(ANY_TEXT, hostile_text(3, big=False), st.just("s" * 900))


def num(lo, hi, whole=False):
    return st.integers(lo, min(hi, 2 ** 63)) if whole else st.floats(lo, hi, allow_nan=False)


WATCH = st.fixed_dictionaries({
    "last_progress": st.none() | num(0, 1e11), "run_last_progress": st.none() | num(0, 1e11),
    "timeout": num(0, 1e9), "state": st.none() | st.sampled_from(top.WATCH_STATES)})
JOB = st.fixed_dictionaries({
    "state": st.sampled_from(top.STATES), "exit_code": st.none() | num(0, 255, True), "last_line": st.none() | TEXT,
    "step": st.none() | num(0, 10 ** 18, True), "cpu_seconds": num(0, 1e15), "rss": num(0, 2 ** 62, True),
    "procs": num(0, 10 ** 7, True), "log_mtime": st.none() | num(0, 1e11), "watch": st.none() | WATCH})
GPU = st.fixed_dictionaries({"index": num(0, 4096, True), "util": st.none() | num(0, 100),
                             "mem_used": st.none() | num(0, 2 ** 40), "mem_total": st.none() | num(0, 2 ** 40)})


@st.composite
def replies(draw) -> dict:
    r = {"time": draw(num(0, 1e11)), "jobs": draw(st.lists(JOB, max_size=4)), "ncpu": draw(num(1, 10 ** 6, True))}
    for k in ("cpu_total", "cpu_idle", "mem_total", "mem_available"):
        r[k] = draw(st.none() | num(0, 2 ** 62, True))
    r["gpus"] = draw(st.none() | st.lists(GPU, max_size=4))
    if draw(st.booleans()):
        r["gpu_error"] = draw(TEXT)
    return r


def render(r: object, banner: bytes = b"") -> bytes:
    return banner + (top.MARK + json.dumps(r) + "\n").encode("utf-8", "surrogatepass")


def expected(r: dict) -> dict:
    out = dict(r)
    out["jobs"] = [dict(j, last_line=None if j["last_line"] is None else j["last_line"][-top.MAX_LINE:],
                        where=j.get("where"))  # the rank sampler's tail: None where the node sent none
                   for j in r["jobs"]]
    out["gpu_error"] = r["gpu_error"][-top.MAX_LINE:] if r.get("gpu_error") is not None else None
    return out


def parse(data: bytes, jobs: int):
    got = None
    with case("top reply", top.TopError):
        got = top.parse_reply(data, jobs)
    return got


def in_range(v, lo, hi, whole=False, null=False):
    if v is None:
        assert null
        return
    assert isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and lo <= v <= hi, v
    assert not whole or isinstance(v, int), v


def valid(got: dict, jobs: int) -> None:
    assert len(got["jobs"]) == jobs
    in_range(got["time"], 0, 1e11)
    in_range(got["ncpu"], 1, 10 ** 6, whole=True)
    for j in got["jobs"]:
        assert j["state"] in top.STATES
        for k, (lo, hi) in WHOLE.items():
            in_range(j[k], lo, hi, whole=True, null=k in ("exit_code", "step"))
        in_range(j["cpu_seconds"], 0, 1e15)
        assert j["last_line"] is None or (isinstance(j["last_line"], str) and len(j["last_line"]) <= top.MAX_LINE)
        in_range(j["log_mtime"], 0, 1e11, null=True)
        w = j["watch"]
        if w is not None:
            in_range(w["last_progress"], 0, 1e11, null=True)
            in_range(w["run_last_progress"], 0, 1e11, null=True)
            in_range(w["timeout"], 0, 1e9)
            assert w["state"] in (None, *top.WATCH_STATES)
    for g in got["gpus"] or []:
        in_range(g["index"], 0, 4096, whole=True)
        in_range(g["util"], 0, 100, null=True)
    assert got["gpus"] is None or len(got["gpus"]) <= top.MAX_GPUS


BANNERS = st.sampled_from([b"", b"Welcome to gpu-01\n", b"\x1b[2J motd\r\n", (top.MARK + "{}\n").encode(),
                           b"\xff\xfe\n"])


@fuzz(30, share=0.25)
@given(r=replies(), banner=BANNERS)
def test_a_rendered_reply_parses_back_to_its_values(r, banner):
    assert parse(render(r, banner), len(r["jobs"])) == expected(r)


@st.composite
def mutated(draw) -> tuple[bytes, int]:
    r = draw(replies())
    jobs = len(r["jobs"]) + draw(st.sampled_from([0, 0, 0, 1, -1]))
    how = draw(st.sampled_from(["json", "bytes", "deep", "any"]))
    if how == "json":
        return render(draw(json_edited(r)), draw(BANNERS)), jobs
    if how == "bytes":
        return draw(spliced_bytes(render(r))), jobs
    if how == "deep":
        return top.MARK.encode() + draw(st.sampled_from(DEEP_JSON)).encode() + b"\n", jobs
    return top.MARK.encode() + draw(hostile_bytes()), jobs


@fuzz(60)
@given(case_=mutated())
def test_any_reply_gives_checked_values_or_a_top_error(case_):
    data, jobs = case_
    got = parse(data, max(jobs, 0))
    if got is not None:
        valid(got, max(jobs, 0))
