"""Shared pieces of the property-based tests under tests/fuzz/: how many inputs each parser gets,
the bound on one input, the count of outcomes per parser, and the hostile pieces every parser is fed.

CI (the normal test run) tries a small sample per parser, derandomized: the same cases every run.
``scripts/fuzz.sh`` sets ``FUZZ_EXAMPLES`` (2,000 by default) for the long campaign, which draws new
cases each run, and prints per parser the inputs tried and how many ended in a traceback, a hang or an
accepted-but-wrong answer (``FUZZ_REPORT`` names a JSON file for the same counts).

The three properties, for every parser of bytes from outside:
- no traceback: an input is accepted, or refused with the project's own located error type;
- no hang: each input costs at most :data:`LIMIT_S` of CPU (plus :data:`S_PER_MIB` per MiB of input where
  the test says its size), and one still running after :data:`HANG_S` of wall time is interrupted. CPU time,
  not wall time, for the bound: on this shared 2-core machine (load 10 and more) a 30 ms parse can take 2 s
  of wall time, while what the bound is for (a quadratic scan, a billion laughs) costs CPU either way; a
  parser that waits (a blocking read) is what the wall-time alarm catches;
- nothing accepted but wrong: where the parser has a right answer, the tests assert it
  (a rendered value parses back equal; a number accepted is the one its ASCII digits say).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

CAMPAIGN = int(os.environ.get("FUZZ_EXAMPLES") or 0)  # 0: the CI sample
LIMIT_S = 2.0   # one input; every parser here answers in milliseconds
S_PER_MIB = 10.0  # and for an input of ``size`` bytes (case's argument), this much more per MiB: linear is no hang
HANG_S = 20.0   # an input still running then is interrupted (and counted a hang), not waited for

OUTCOMES = ("inputs", "accepted", "refused", "tracebacks", "hangs", "wrong")
TALLY: dict[str, Counter[str]] = {}
KNOWN_BUG = [""]  # set by conftest.py while an xfail (known bug) test runs: its inputs are counted apart


def fuzz(ci: int, known_bug: bool = False, share: float = 1.0) -> settings:
    """Hypothesis settings for one property: ``ci`` inputs in the normal run, FUZZ_EXAMPLES in the campaign
    (``share`` of them for a property that only completes a parser's count: its round trip, say).
    No hypothesis deadline: :func:`case` bounds each input itself, and says which parser was slow.
    ``known_bug``: the property is marked xfail for a bug being fixed elsewhere; its first failing input
    ends it (no shrinking, which costs minutes for an outcome already known)."""
    # No explain phase: it traces every line run (sys.settrace on Python < 3.12), which makes a parser that
    # loops in Python over a 256 KiB line (shlex) a hundred times slower than it is, and the bound fail.
    phases = (Phase.explicit, Phase.reuse, Phase.generate) + (() if known_bug else (Phase.target, Phase.shrink))
    return settings(max_examples=max(1, int(CAMPAIGN * share)) if CAMPAIGN else ci, derandomize=not CAMPAIGN,
                    database=None, deadline=None,
                    print_blob=True, phases=phases, report_multiple_bugs=not known_bug, suppress_health_check=[
                        HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                        HealthCheck.large_base_example, HealthCheck.function_scoped_fixture])


class Hang(BaseException):
    """An input ran past HANG_S. A BaseException, so a parser's ``except Exception`` cannot swallow it."""


def _stuck(*_: object) -> None:
    raise Hang(f"still running after {HANG_S:g}s")


@contextlib.contextmanager
def case(parser: str, refused: type[BaseException] | tuple[type[BaseException], ...] = (),
         located: Callable[[BaseException], object] | None = None, size: int = 0) -> Iterator[None]:
    """One input to ``parser``: what the block raises decides the outcome, counted in :data:`TALLY`.

    ``refused`` (the parser's own error types) ends the block quietly, as a refusal; ``located`` then
    checks the error says where and what (an AssertionError there is a wrong answer). ``size``: the input's
    bytes, for a parser whose linear time on a MiB is more than LIMIT_S (YAML). An
    AssertionError is a wrong answer, :class:`Hang` or a slow input a hang, anything else a
    traceback; all three fail the test."""
    tally = TALLY.setdefault(parser + KNOWN_BUG[0], Counter())
    tally["inputs"] += 1
    old = signal.signal(signal.SIGALRM, _stuck)
    signal.setitimer(signal.ITIMER_REAL, HANG_S)
    outcome = "accepted"
    started = time.process_time()
    try:
        try:
            yield
        except refused as e:
            outcome = "refused"
            if located is not None:
                located(e)
    except Hang:
        outcome = "hangs"
        raise
    except AssertionError:
        outcome = "wrong"
        raise
    except Exception:
        outcome = "tracebacks"
        raise
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        took = time.process_time() - started
        limit = LIMIT_S + S_PER_MIB * size / (1 << 20)
        if outcome in ("accepted", "refused") and took > limit:
            outcome = "hangs"
        tally[outcome] += 1
    if outcome == "hangs":
        raise AssertionError(f"{parser}: one input of {size or '?'} bytes took {took:.2f}s of CPU (bound {limit:g}s)")


# ---- hostile pieces ----

DEEP = 50_000
# Digits that str.isdigit() (or regex \d) accepts and int() reads, or refuses: never the user's ASCII number.
UNICODE_DIGITS = ("²", "³", "¹", "⁹", "₃", "٣", "١٢", "۴", "߃", "३", "৫", "௫", "๓", "３", "𝟗", "①", "Ⅻ", "٠")
CONTROLS = ("\x00", "\x01", "\x07", "\x08", "\t", "\n", "\r", "\r\n", "\x0b", "\x0c", "\x1b[31m", "\x1b[2J",
            "\x1b]0;title\x07", "\x7f", "\x85", "\x9b", "\u2028", "\u2029", "\u202e", "\ufeff", "\u200b")
NUMBERS = ("9" * 5000, "1" + "0" * 400, str(2 ** 31), str(2 ** 63), str(2 ** 64), "-" + "9" * 30, "1e999",
           "1e-999", "-1", "-0", "+1", "0", "00", "01", "0x1F", "0o17", "0b1", "1_000", " 1", "1 ", "1.0", ".5",
           "5.", "NaN", "nan", "Infinity", "-inf", "1e3", "9" * 19, "9" * 20)
DEEP_JSON = ("[" * DEEP + "]" * DEEP, '{"a":' * DEEP + "1" + "}" * DEEP, "[" * DEEP, '{"a":[' * (DEEP // 2))
INVALID_UTF8 = (b"\xff", b"\xfe\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80", b"\xe2\x82",
                b"\xf0\x9f\x98")
LONG = ("x" * (256 << 10), "9" * (64 << 10), "\t" * (64 << 10), "é" * (64 << 10))

PIECES = st.sampled_from(UNICODE_DIGITS + CONTROLS + NUMBERS)
# Any code point but lone surrogates (a str decoded from bytes or argv has none; see SURROGATES).
ANY_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=30)
SURROGATES = st.sampled_from(["\ud800", "\udcff", "\udfff"])


def hostile_text(max_pieces: int = 6, big: bool = True) -> st.SearchStrategy[str]:
    """Text made of hostile pieces and any text: Unicode digits, control characters, huge numbers, NUL;
    with ``big``, sometimes 50,000-deep JSON or a very long line."""
    piece = st.one_of(PIECES, ANY_TEXT, *([st.sampled_from(DEEP_JSON + LONG)] if big else []))
    return st.lists(piece, max_size=max_pieces).map("".join)


def hostile_bytes(max_pieces: int = 6, big: bool = True) -> st.SearchStrategy[bytes]:
    """Bytes: hostile text, encoded, with invalid UTF-8 and random bytes among it."""
    piece = st.one_of(hostile_text(2, big).map(str.encode), st.sampled_from(INVALID_UTF8), st.binary(max_size=20))
    return st.lists(piece, max_size=max_pieces).map(b"".join)


@st.composite
def _edited(draw: st.DrawFn, base, piece: st.SearchStrategy):
    """``base`` with up to three edits: a ``piece`` put in, a span replaced by one, or a cut."""
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(base)))
        j = draw(st.integers(i, min(len(base), i + 40)))
        how = draw(st.sampled_from(["insert", "replace", "cut"]))
        if how == "cut":
            base = base[:i]
        else:
            base = base[:i] + draw(piece) + base[j if how == "replace" else i:]
    return base


def spliced(base: str, big: bool = True) -> st.SearchStrategy[str]:
    """``base`` with up to three edits: a hostile piece put in, a span replaced by one, or a cut."""
    return _edited(base, hostile_text(2, big))


def spliced_bytes(base: bytes, big: bool = True) -> st.SearchStrategy[bytes]:
    """``base`` with up to three edits, as :func:`spliced`, in bytes (invalid UTF-8 among the pieces)."""
    return _edited(base, hostile_bytes(2, big))


def ascii_int(text: str) -> int | None:
    """What an integer in ``text`` means by the documented rule: ASCII digits only, else None (and None past
    int()'s 4,300 digits: no parser here takes a number that long)."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 4300 else None


# ---- JSON documents, edited ----

LEAVES = (st.none() | st.booleans() | st.integers() | st.integers(-(10 ** 40), 10 ** 40)
          | st.floats(allow_nan=True, allow_infinity=True) | ANY_TEXT | hostile_text(3, big=False))
JSON_VALUES = st.recursive(
    LEAVES, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(ANY_TEXT, kids, max_size=3), max_leaves=8)


def _places(data: object, prefix: tuple = ()) -> Iterator[tuple]:
    """Every place in a JSON tree: tuples of keys and indexes."""
    yield prefix
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _places(v, prefix + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _places(v, prefix + (i,))


def _at(data: object, path: tuple) -> object:
    for k in path:
        data = data[k]  # type: ignore[index]
    return data


@st.composite
def json_edited(draw: st.DrawFn, data: object, values: st.SearchStrategy = JSON_VALUES,
                odd: st.SearchStrategy[str] | None = None) -> object:
    """``data`` (a JSON tree, changed in place) with one to three edits: a value dropped, replaced by any
    JSON value, wrapped, nested hundreds deep, made huge, a bool, or a string replaced by odd text."""
    odd = odd if odd is not None else hostile_text(3, big=False)
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(["odd text", "drop", "value", "wrap", "nest", "huge", "bool"]))
        places = list(_places(data))
        if how == "odd text":  # text where text belongs: mostly still a valid document
            places = [p for p in places if p and isinstance(_at(data, p), str)] or places
        path = draw(st.sampled_from(places))
        if not path:
            data = draw(values)
            continue
        parent: Any = _at(data, path[:-1])
        key, old = path[-1], parent[path[-1]]
        if how == "drop":
            parent.pop(key)
        elif how == "value":
            parent[key] = draw(values)
        elif how == "wrap":
            parent[key] = [old] if draw(st.booleans()) else {"value": old}
        elif how == "nest":
            value = old
            for _ in range(draw(st.integers(2, 300))):
                value = [value]
            parent[key] = value
        elif how == "odd text":
            parent[key] = draw(odd)
        elif how == "huge":
            parent[key] = draw(st.sampled_from([10 ** 30, -(10 ** 30), 2 ** 63, 1e308, float("inf"), float("nan")]))
        else:
            parent[key] = draw(st.booleans())
        if not isinstance(data, (dict, list)):
            break
    return data
