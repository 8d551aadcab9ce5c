"""Property-based: the quarantine file (``$XDG_STATE_HOME/clusterddp/quarantine.json``), through
``quarantine.parse``, and the stamps every listing prints (``quarantine list``, ``check``, ``up``'s
refusal). Real files rendered by ``render`` read back equal; edited ones (any JSON value in any field,
huge and negative times, 10^30, infinity, control characters, 50,000-deep nesting, invalid UTF-8) give
checked entries or a QuarantineError naming the file; every entry accepted has times between 1970 and
9999, a machine key ``address:port``, one-line texts, and its listing line is made without an error.
"""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from clusterddp import quarantine as quarantines
from fuzzing import case, fuzz, hostile_bytes, json_edited, spliced_bytes

PATH = "/home/u/.local/state/clusterddp/quarantine.json"
MACHINES = st.sampled_from(["10.0.0.2:22", "gpu-01.lab:2222", "[fe80::1]:22", "node:1"])
WORDS = st.from_regex(r"[ -~]{0,40}", fullmatch=True)
TIMES = st.floats(0, quarantines.LAST_TIME) | st.integers(0, int(quarantines.LAST_TIME))
ENTRIES = st.builds(quarantines.Entry, MACHINES, WORDS, TIMES, TIMES, WORDS, st.none() | WORDS)
STRIKES = st.builds(quarantines.Strike, MACHINES, WORDS, WORDS, TIMES)


def read(data: bytes):
    got = None

    def located(e: BaseException) -> None:
        assert isinstance(e, quarantines.QuarantineError) and e.message.startswith(
            f"{PATH}: damaged quarantine file: "
        ), e
        assert "\n" not in e.message and e.exit_code == 2

    with case("quarantine file", quarantines.QuarantineError, located, size=len(data)):
        got = quarantines.parse(data, PATH)
    return got


def checked(entries: list[quarantines.Entry], strikes: list[quarantines.Strike]) -> None:
    for e in entries:
        assert quarantines._MACHINE.fullmatch(e.machine), e
        for t in (e.since, e.until):
            assert isinstance(t, int | float) and not isinstance(t, bool) and 0 <= t <= quarantines.LAST_TIME, e
        for text in (e.host, e.why, e.run_id or ""):
            assert "\n" not in text and "\r" not in text and len(text) <= quarantines.MOST_TEXT
        line = f"{e.host} ({e.machine}) until {quarantines.stamp(e.until)}: {e.why}"  # what `quarantine list` prints
        assert quarantines.stamp(e.since) and "\n" not in line
    for k in strikes:
        assert 0 <= k.at <= quarantines.LAST_TIME and quarantines.stamp(k.at)
    assert quarantines.parse(quarantines.render(entries, strikes), PATH) == (entries, strikes)


@fuzz(30, share=0.25)
@given(entries=st.lists(ENTRIES, max_size=4), strikes=st.lists(STRIKES, max_size=3))
def test_a_rendered_file_reads_back_equal(entries, strikes):
    got = read(quarantines.render(entries, strikes))
    assert got == (entries, strikes)
    checked(*got)


@st.composite
def files(draw) -> bytes:
    entries, strikes = draw(st.lists(ENTRIES, max_size=3)), draw(st.lists(STRIKES, max_size=2))
    base = quarantines.render(entries, strikes)
    doc = json.loads(base)
    edited = draw(json_edited(doc, odd=st.sampled_from(["10.0.0.2", "x:99999999", "a b:22", "\n", "é" * 600])))
    times = st.sampled_from([1e20, 2 ** 63, -1, -1e20, 10 ** 30, 253402300800, 1e308, float("inf"), float("nan")])
    return draw(st.one_of(
        st.just(json.dumps(edited).encode()),
        st.builds(lambda t, f: base.replace(b'"until": ', b'"until": ' + json.dumps(t).encode() + b", \"x\": ", 1)
                  if f else base.replace(b'"since": ', b'"since": ' + json.dumps(t).encode() + b", \"x\": ", 1),
                  times, st.booleans()),
        spliced_bytes(base), hostile_bytes()))


@fuzz(60)
@given(data=files())
def test_any_file_gives_checked_entries_with_printable_stamps_or_a_located_error(data):
    got = read(data)
    if got is not None:
        checked(*got)


@fuzz(30, share=0.25)
@given(t=st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(10 ** 30), 10 ** 30))
def test_a_stamp_is_said_for_any_time(t):
    with case("quarantine stamp"):
        said = quarantines.stamp(t)
    assert isinstance(said, str) and said and "\n" not in said
