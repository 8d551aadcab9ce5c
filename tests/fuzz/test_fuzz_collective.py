"""Property-based: ``check --collective``'s events from a node, through ``node.collective.parse_output``.

Events rendered as the node program prints them (among other output lines) parse back to their values;
mutated ones (any JSON value, huge numbers, NaN, 50,000-deep nesting, control characters, invalid UTF-8,
Unicode digits as rank keys) give checked events or a CollectiveReplyError, and a rank accepted as a key
of ``hellos`` or ``pairs`` is the number its ASCII digits say, below the world size.
"""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from clusterddp.node import collective as collective_module
from fuzzing import ANY_TEXT, DEEP_JSON, UNICODE_DIGITS, case, fuzz, hostile_bytes, json_edited, spliced_bytes

# A known bug (issue 23), fixed by engineer C in parallel: Unicode digits as the rank keys of hellos and
# pairs (isdigit() accepts what int() refuses, or reads Arabic-Indic digits as a rank). After the merge set
# this to False: the xfail below goes, and the general test takes those inputs too.
DIGITS_BUG = False
RANK_KEY = re.compile(r'"[^"\x00-\x7f]*[^\x00-\x7f][^"]*"\s*:')  # a key with a non-ASCII character

TEXT = ANY_TEXT
SECONDS = st.floats(0, collective_module.MAX_SECONDS, allow_nan=False)


@st.composite
def sweeps(draw) -> list:
    out = []
    for _ in range(draw(st.integers(0, 4))):
        med = draw(SECONDS)
        out.append(
            [
                draw(st.integers(1, collective_module.MAX_SIZE)),
                draw(st.integers(1, collective_module.MAX_OPS)),
                med,
                draw(st.floats(0, med, allow_nan=False)),
            ]
        )
    return out


@st.composite
def events(draw, world: int) -> dict:
    kind = draw(st.sampled_from(collective_module.EVENTS))
    ev: dict = {"event": kind, "t": draw(SECONDS)}
    for k in draw(st.lists(st.sampled_from(["python", "hostname", "iface", "addr", "torch", "cuda"]), unique=True)):
        ev[k] = draw(st.none() | TEXT)
    if draw(st.booleans()):
        ev["gpu"] = draw(st.booleans())
    if kind in ("connected", "result"):
        ev["backend"] = draw(st.sampled_from(["gloo", "nccl"]))
    if kind == "error":
        ev.update(
            phase=draw(st.sampled_from(collective_module.PHASES)),
            kind=draw(st.sampled_from(collective_module.KINDS)),
            message=draw(TEXT),
            ranks=draw(st.lists(st.integers(0, world - 1), max_size=world)),
            hellos={
                str(r): {"torch": draw(st.none() | TEXT)}
                for r in draw(st.lists(st.integers(0, world - 1), max_size=world, unique=True))
            },
        )
    if kind == "result":
        ev.update(world=draw(sweeps()), pairs={str(p): draw(sweeps()) for p in draw(
            st.lists(st.integers(0, world - 1), max_size=2, unique=True))})
    return ev


def expected(ev: dict) -> dict:
    out = dict(ev, t=float(ev["t"]))
    for k in ("python", "hostname", "iface", "addr", "torch", "cuda", "message"):
        if isinstance(out.get(k), str) and len(out[k]) > collective_module.MAX_TEXT:
            out[k] = out[k][:collective_module.MAX_TEXT] + "..."
    if "hellos" in ev:
        out["hellos"] = {int(r): h for r, h in ev["hellos"].items()}
    if "world" in ev:
        out["world"] = [tuple(m) for m in ev["world"]]
        out["pairs"] = {int(p): [tuple(m) for m in s] for p, s in ev["pairs"].items()}
    return out


def render(evs: list, other: list[str]) -> bytes:
    lines = []
    for i, ev in enumerate(evs):
        lines += other[i:i + 1]
        lines.append(collective_module.MARK + json.dumps(ev))
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")


def parse(data: bytes, world: int):
    got = None
    with case("collective events", collective_module.CollectiveReplyError):
        got = collective_module.parse_output(data, world)
    return got


@fuzz(30, share=0.25)
@given(data=st.data(), world=st.integers(1, 8), other=st.lists(st.sampled_from(["[W] gloo warning", "", "motd"]),
                                                                max_size=3))
def test_rendered_events_parse_back_to_their_values(data, world, other):
    evs = data.draw(st.lists(events(world), max_size=5))
    got = parse(render(evs, other), world)
    assert got is not None
    assert got[0] == [expected(e) for e in evs]
    assert got[1] == [o for o in other[:len(evs)] if o.strip()][-10:]


def valid(events_: list[dict], world: int) -> None:
    for ev in events_:
        assert ev["event"] in collective_module.EVENTS and 0 <= ev["t"] <= collective_module.MAX_SECONDS
        for r in ev.get("hellos", {}):
            assert type(r) is int and 0 <= r < world
        for p in ev.get("pairs", {}):
            assert type(p) is int and 0 <= p < world
        assert all(type(r) is int and 0 <= r < world for r in ev.get("ranks", []))


@st.composite
def mutated(draw) -> tuple[bytes, int]:
    world = draw(st.integers(1, 8))
    evs = draw(st.lists(events(world), min_size=1, max_size=3))
    how = draw(st.sampled_from(["json", "bytes", "deep", "any", "many"]))
    if how == "json":
        return render([draw(json_edited(e)) for e in evs], []), world
    if how == "bytes":
        return draw(spliced_bytes(render(evs, []))), world
    if how == "deep":
        return collective_module.MARK.encode() + draw(st.sampled_from(DEEP_JSON)).encode() + b"\n", world
    if how == "many":
        return render(evs * 10, []), world
    return collective_module.MARK.encode() + draw(hostile_bytes()), world


@fuzz(60)
@given(case_=mutated())
def test_any_output_gives_checked_events_or_a_reply_error(case_):
    data, world = case_
    if DIGITS_BUG:
        assume(not RANK_KEY.search(data.decode("utf-8", "replace")))
    got = parse(data, world)
    if got is not None:
        valid(got[0], world)


@pytest.mark.xfail(DIGITS_BUG, strict=False, reason="fixed by engineer C: Unicode digits as collective rank keys")
@fuzz(30, known_bug=DIGITS_BUG, share=0.05)
@given(key=st.lists(st.sampled_from(UNICODE_DIGITS + ("0", "1")), min_size=1, max_size=3).map("".join),
       where=st.sampled_from(["hellos", "pairs"]))
def test_a_rank_key_is_read_only_from_ascii_digits(key, where):
    ev = ({"event": "error", "t": 1, "phase": "join", "kind": "timeout", "message": "m", "hellos": {key: {}}}
          if where == "hellos" else {"event": "result", "t": 1, "backend": "gloo", "world": [], "pairs": {key: []}})
    got = parse(render([ev], []), 8)
    if got is not None:
        (ev_got,), _ = got
        assert list(ev_got[where]) == [int(key)] and key.isascii(), (key, ev_got)
