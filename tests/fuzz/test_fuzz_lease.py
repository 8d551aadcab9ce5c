"""Property-based: a node's lease reply (``hold``, ``queue``, ``list``), through ``node.lease.parse_reply``.

A reply rendered as the node program writes it parses back to its values; mutated ones (any JSON value
in any field, huge numbers, control characters, Unicode digits, invalid UTF-8, 50,000-deep nesting)
give checked values or a ValueError (what the launcher turns into a per-host error); whatever is
accepted is in range: slot numbers and counts whole and bounded, texts short and printable.
"""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from clusterddp.node import lease
from fuzzing import DEEP_JSON, case, fuzz, hostile_text, json_edited, spliced

# A known bug (issue 23), fixed by engineer C in parallel: 50,000-deep JSON in a lease reply is a
# RecursionError, not a refusal. After the merge set this to False: the xfail below goes, and the
# general test takes those inputs too.
DEEP_BUG = False
DEEP_RUN = re.compile(r"(?:\[\s*|\{\s*\"[^\"]*\"\s*:\s*){500}")

RUNS = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,30}", fullmatch=True)
TEXTS = st.from_regex(r"[ -~]{1,40}", fullmatch=True)  # printable, as the node writes them
SLOTS = st.lists(st.integers(0, lease.MAX_SLOTS - 1), max_size=8, unique=True).map(sorted)
HOLDER = st.fixed_dictionaries({"run": RUNS, "slots": SLOTS}, optional={
    "user": TEXTS, "since": TEXTS, "host": TEXTS, "name": TEXTS, "port": st.integers(1, 65535),
    "state": st.sampled_from(["starting", "running"])})
WAITER = st.fixed_dictionaries({"ticket": st.builds(lambda n, r: f"{n:019d}-{r}", st.integers(0, 10 ** 19 - 1), RUNS)},
                               optional={"run": RUNS, "user": TEXTS, "since": TEXTS, "host": TEXTS, "name": TEXTS,
                                         "need": st.integers(1, lease.MAX_SLOTS)})


@st.composite
def replies(draw) -> dict:
    kind = draw(st.sampled_from(["granted", "refused", "queued", "list"]))
    r: dict = {"capacity": draw(st.integers(1, lease.MAX_SLOTS))}
    if kind == "granted":
        r.update(ok=True, slots=draw(SLOTS.filter(bool)), port=draw(st.none() | st.integers(1, 65535)))
    elif kind in ("refused", "queued"):
        r.update(ok=False, **({"queued": True} if kind == "queued" else {}))
        if draw(st.booleans()):
            r.update(why=draw(TEXTS), never=draw(st.booleans()))
    r["holders"] = draw(st.lists(HOLDER, max_size=3))
    r["waiting"] = draw(st.lists(WAITER, max_size=3))
    return r


def expected(r: dict) -> dict:
    out = {k: r[k] for k in ("ok", "capacity", "slots", "port") if k in r}
    if "queued" in r:
        out["queued"] = True
    out["holders"] = [{"garbled": False, "run": h["run"], "name": h.get("name"),
                       "user": h.get("user", "?"), "since": h.get("since", "?"),
                       "host": h.get("host", "?"), "slots": h["slots"], "port": h.get("port"),
                       "state": h.get("state", "?")} for h in r["holders"]]
    out["waiting"] = [{"garbled": False, "ticket": w["ticket"], "run": w.get("run", "?"), "name": w.get("name"),
                       "user": w.get("user", "?"),
                       "since": w.get("since", "?"), "host": w.get("host", "?"), "need": w.get("need"),
                       "slots": None} for w in r["waiting"]]
    out["never"] = r.get("never") is True
    out["why"] = r["why"] if "why" in r else None
    return out


def parse(text: str):
    got = None
    with case("lease reply", ValueError):
        got = lease.parse_reply(text)
    return got


def short(v) -> None:
    assert isinstance(v, str) and len(v) <= 128 and (v == "?" or v.isprintable()), v


def valid(got: dict) -> None:
    if "capacity" in got:
        assert type(got["capacity"]) is int and 1 <= got["capacity"] <= lease.MAX_SLOTS
    if got.get("ok"):
        assert got["slots"] and all(type(s) is int and 0 <= s < lease.MAX_SLOTS for s in got["slots"])
        assert got["port"] is None or (type(got["port"]) is int and 1 <= got["port"] <= 65535)
    for h in got["holders"] + got["waiting"]:
        if h["garbled"]:
            continue
        for k in ("user", "since", "host"):
            short(h[k])
        assert h["name"] is None or short(h["name"]) is None
        assert all(type(s) is int and 0 <= s < lease.MAX_SLOTS for s in h["slots"] or [])
    assert len(got["holders"]) <= lease.MAX_ENTRIES and len(got["waiting"]) <= lease.MAX_ENTRIES
    if got["why"] is not None:
        short(got["why"])


@fuzz(30, share=0.25)
@given(r=replies(), tail=st.sampled_from(["", "\n", "\nmore output\n", "\r\n"]))
def test_a_rendered_reply_parses_back_to_its_values(r, tail):
    assert parse("Welcome to the node\n" + lease.MARK + json.dumps(r) + tail) == expected(r)


@st.composite
def mutated(draw) -> str:
    r = draw(replies())
    how = draw(st.sampled_from(["json", "text", "any"]))
    if how == "json":
        return lease.MARK + json.dumps(draw(json_edited(r)))
    if how == "text":
        return draw(spliced(lease.MARK + json.dumps(r)))
    return draw(hostile_text())


@fuzz(60)
@given(text=mutated())
def test_any_reply_gives_checked_values_or_a_value_error(text):
    if DEEP_BUG:
        assume(not DEEP_RUN.search(text[:lease.MAX_REPLY]))
    got = parse(text)
    if got is not None:
        valid(got)


@pytest.mark.xfail(DEEP_BUG, strict=False, reason="fixed by engineer C: deep JSON in a lease reply (RecursionError)")
@fuzz(20, known_bug=DEEP_BUG, share=0.05)
@given(deep=st.sampled_from(range(len(DEEP_JSON))), where=st.sampled_from(["{}", '{"ok": true, "slots": {}}',
                                                                 '{"holders": [{}]}']))
def test_deep_nesting_in_a_reply_is_refused(deep, where):
    parse(where.replace("{}", DEEP_JSON[deep], 1))
