"""Property-based: torch's flight recorder dumps as a node sends them (``clusterddp.flight``): the node
program's answer through ``parse_reply``, each dump through ``parse_dump`` (a pickle from a node: any bytes),
where each rank stands through ``read``, and run.json's ``failure.flight`` through ``Flight.from_json``.

A dump pickled as torch writes it (any protocol) parses back to its entries; real torch 2.13 dumps cut,
spliced or fed hostile pieces, pickles of any data, hostile bytes and edited JSON give a Dump or a reason,
never a traceback, and nothing in them runs; what ``read`` makes of any set of them prints one line per
line and round-trips through run.json's form; a mutated answer gives checked values or a ReplyError.
"""

from __future__ import annotations

import base64
import json
import pickle
import zlib

from hypothesis import given
from hypothesis import strategies as st

from clusterddp import flight
from clusterddp.node import flight as node_flight
from clusterddp.node.reply import ReplyError
from fuzzing import ANY_TEXT, JSON_VALUES, case, fuzz, hostile_bytes, hostile_text, json_edited, spliced_bytes
from helpers import REPO

REAL = [(REPO / "tests" / "fixtures" / "flight" / f"rank{r}").read_bytes() for r in (0, 1)]
NAME = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FFF, exclude_categories=("Cs",)), max_size=20)
TEXT = st.one_of(ANY_TEXT, hostile_text(3, big=False))
OPS = st.sampled_from(["nccl:all_reduce", "nccl:broadcast", "gloo:barrier", "nccl:send", "nccl:recv"])
STATES = st.sampled_from(["scheduled", "started", "completed"])


@st.composite
def entries(draw, n: int) -> list[dict]:
    out = []
    for record in range(n):
        out.append({"record_id": record, "pg_id": 0, "process_group": (draw(st.sampled_from(["0", "1"])), "default_pg"),
                    "collective_seq_id": draw(st.integers(0, 10 ** 6)), "p2p_seq_id": draw(st.integers(0, 9)),
                    "op_id": record, "profiling_name": draw(OPS), "state": draw(STATES),
                    "is_p2p": draw(st.booleans()), "retired": draw(st.booleans()), "timeout_ms": 600000,
                    "time_created_ns": draw(st.integers(0, 2 ** 62)), "input_sizes": [[4]],
                    "frames": [{"name": draw(NAME), "filename": "/w/" + draw(NAME).replace("/", "") + ".py",
                                "line": draw(st.integers(0, 10 ** 6))}]})
    return out


@st.composite
def dumps(draw) -> dict:
    n = draw(st.integers(0, 8))
    return {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}},
            "pg_status": {}, "entries": draw(entries(n))}


def expected(e: dict) -> flight.Entry:
    f = e["frames"][0]
    return flight.Entry(e["record_id"], f"{e['process_group'][0]} (default_pg)",
                        e["p2p_seq_id"] if e["is_p2p"] else e["collective_seq_id"], e["profiling_name"], e["state"],
                        e["is_p2p"], flight._where([f]))


def parse(data: bytes) -> flight.Dump | str:
    got: flight.Dump | str = ""
    with case("flight dump"):
        got = flight.parse_dump(data)
        assert isinstance(got, flight.Dump | str)
        if isinstance(got, flight.Dump):
            assert len(got.entries) <= flight.MOST_ENTRIES
            for e in got.entries:
                assert 0 <= e.record < 2 ** 63 and 0 <= e.seq < 2 ** 63 and isinstance(e.p2p, bool)
                assert all("\n" not in t and "\r" not in t and len(t) <= 2 * flight.MOST_TEXT + 20
                           for t in (e.op, e.state, e.group, e.where))
    return got


@fuzz(30, share=0.25)
@given(d=dumps(), protocol=st.integers(0, pickle.HIGHEST_PROTOCOL), as_json=st.booleans())
def test_a_dump_as_torch_writes_it_parses_back_to_its_entries(d, protocol, as_json):
    data = json.dumps(d).encode() if as_json else pickle.dumps(d, protocol=protocol)
    got = parse(data)
    want = tuple(sorted(map(expected, d["entries"]), key=lambda e: e.record))
    assert isinstance(got, flight.Dump) and got.entries == want, got
    assert ("0 (default_pg)", (0, 1, 2, 3)) in got.members


ANY_DATA = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | TEXT | st.binary(max_size=20),
                        lambda kids: st.lists(kids, max_size=4) | st.dictionaries(TEXT, kids, max_size=4)
                        | st.tuples(kids, kids) | st.frozensets(st.integers(), max_size=3), max_leaves=20)


@st.composite
def hostile_dumps(draw) -> bytes:
    how = draw(st.sampled_from(["real", "data", "bytes", "json", "entries"]))
    if how == "real":
        return draw(spliced_bytes(draw(st.sampled_from(REAL)), big=False))
    if how == "data":
        return pickle.dumps(draw(ANY_DATA), protocol=draw(st.integers(0, pickle.HIGHEST_PROTOCOL)))
    if how == "bytes":
        return draw(hostile_bytes(big=False))
    if how == "json":
        return json.dumps(draw(json_edited(json.loads(json.dumps(draw(dumps()), default=list))))).encode()
    return pickle.dumps({"entries": draw(st.lists(st.dictionaries(st.sampled_from(
        ["record_id", "collective_seq_id", "is_p2p", "p2p_seq_id", "profiling_name", "state", "process_group",
         "frames"]), ANY_DATA), max_size=4))}, protocol=2)


@fuzz(80)
@given(data=hostile_dumps())
def test_any_bytes_give_a_dump_or_a_reason_and_nothing_runs(data):
    parse(data)


@fuzz(30)
@given(ds=st.lists(st.tuples(st.sampled_from(["node-1", "gpu-02"]), st.integers(0, 5),
                             st.one_of(st.none(), hostile_dumps(), dumps().map(pickle.dumps), st.sampled_from(REAL)),
                             TEXT), max_size=6))
def test_where_each_rank_stands_prints_one_line_per_line_and_round_trips_through_run_json(ds):
    with case("flight read"):
        f = flight.read(ds)
        if f is None:
            assert not ds
            return
        assert set(f.behind) <= {r for _, r, _, _ in ds}
        for line in f.lines():
            assert "\n" not in line and "\r" not in line
        assert flight.Flight.from_json(json.loads(json.dumps(f.to_json()))) == f


def reply(items: list[tuple[int, bytes | None, str]]) -> bytes:
    body = [{"rank": r, "size": len(d or b""), "note": n,
             "data": None if d is None else base64.b64encode(zlib.compress(d)).decode()} for r, d, n in items]
    return (node_flight.MARK + json.dumps({"dumps": body}) + "\n").encode()


ITEMS = st.lists(st.tuples(st.integers(0, 2 ** 24 - 1), st.none() | st.binary(max_size=64), NAME), max_size=4)


@fuzz(20, share=0.25)
@given(items=ITEMS)
def test_an_answer_parses_back_to_its_dumps(items):
    with case("flight reply", ReplyError):
        assert flight.parse_reply(b"motd\n" + reply(items)) == items


@fuzz(40)
@given(items=ITEMS, how=st.sampled_from(["json", "bytes", "any"]), data=st.data())
def test_any_answer_gives_checked_dumps_or_a_reply_error(items, how, data):
    if how == "json":
        raw = (node_flight.MARK + json.dumps(data.draw(json_edited(json.loads(reply(items)[len(node_flight.MARK):]))))
               ).encode()
    elif how == "bytes":
        raw = data.draw(spliced_bytes(reply(items), big=False))
    else:
        raw = node_flight.MARK.encode() + data.draw(hostile_bytes(big=False))
    with case("flight reply", ReplyError):
        for rank, dump, note in flight.parse_reply(raw):
            assert type(rank) is int and 0 <= rank < 2 ** 24 and "\n" not in note
            assert dump is None or len(dump) <= flight.MOST_BYTES


@fuzz(30)
@given(data=st.data())
def test_a_damaged_flight_in_run_json_is_a_value_error(data):
    good = flight.read([("node-1", r, d, "") for r, d in enumerate(REAL)])
    assert good is not None
    edited = data.draw(json_edited(good.to_json(), JSON_VALUES))
    with case("flight record", ValueError):
        f = flight.Flight.from_json(edited)
        assert all(0 <= e.rank < 2 ** 63 and 0 <= e.seq < 2 ** 63 for e in f.ranks)
