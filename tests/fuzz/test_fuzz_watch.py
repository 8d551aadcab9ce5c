"""Property-based: the stall watcher's line scanner (``node.watch.Lines``) with a user's progress regex,
and the follower's whole-log line (``nodeops.read_whole``), fed any bytes a job or a node may write.

The scanner: any bytes, cut into any chunks, with any regex the validators accept (the default, a
leading ``.*``, any text escaped, hostile text that happens to compile), never raise and cost bounded
CPU per byte; lines no longer than its bound count the same however the chunks fall; a progress line
after any output counts exactly once. The whole-log line: a size and a lowercase sha256 read exactly,
anything else (hostile text, the mark spliced in anywhere) None, never a traceback.
"""

from __future__ import annotations

import re

from hypothesis import assume, example, given
from hypothesis import strategies as st

from clusterddp import nodeops, noise
from clusterddp.errors import UsageError
from clusterddp.failure import AGENT_LINE
from clusterddp.node import watch as watcher
from clusterddp.node.follow import WHOLE_MARK
from clusterddp.top import DEFAULT_PROGRESS, check_progress_regex
from fuzzing import ANY_TEXT, case, fuzz, hostile_bytes, hostile_text, spliced

SKIP = [p for p, tail in noise.LINES if not tail] + ["^" + AGENT_LINE.pattern]
TAILS = [p for p, tail in noise.LINES if tail]
REGEXES = st.one_of(
    st.sampled_from([DEFAULT_PROGRESS, r"step (\d+)", r".*step (\d+)", r".*?epoch", r"(?i)loss[:=]\s*\S+", r"^it",
                     r"\d+x", r"(?:\d{1,3},)*\d+ samples", r"$", r"", r"[\r\n]", r"\x00", r"é+"]),
    ANY_TEXT.map(re.escape), hostile_text(2, big=False).map(re.escape), ANY_TEXT)


def user_regex(text: str) -> str | None:
    """``text`` as `up --progress-regex` would take it, or None where it refuses it."""
    try:
        return check_progress_regex(text)
    except UsageError:
        return None


def lines(regex: str | None) -> watcher.Lines:
    return watcher.Lines(regex, SKIP, TAILS)


@fuzz(40)
@given(data=hostile_bytes(8), regex=REGEXES, cuts=st.lists(st.integers(0, 1 << 20), max_size=8))
@example(data=b"x" * (256 << 10), regex=r".*step (\d+)", cuts=[])  # quadratic per line, unbounded: 9.4 s a line
@example(data=b"9" * (60 << 10), regex=r"\d+x", cuts=[1000])
def test_the_watchers_line_scanner_with_a_user_regex(data, regex, cuts):
    rx = user_regex(regex)
    assume(rx is not None or not regex)
    at = sorted({c % (len(data) + 1) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *at], [*at, len(data)], strict=True)]
    with case("watch line scanner", size=len(data)):
        whole = lines(rx).feed(data + b"\n")
        ls = lines(rx)
        pieces = sum(ls.feed(c) for c in chunks) + ls.feed(b"\n")
        if max(map(len, re.split(rb"[\r\n]", data)), default=0) <= watcher.MAX_LINE:
            assert pieces == whole, (pieces, whole)  # however the log arrives in chunks
        assert ls.pos == len(data) + 1 and ls.rest == b""
        # a progress line after any output counts once, found by any accepted regex that finds it alone
        after = ls.feed(b"step 12345 loss=0.5 epoch 3 it 4 1,000 samples 7x\n")
        assert after == (1 if lines(rx).feed(b"step 12345 loss=0.5 epoch 3 it 4 1,000 samples 7x\n") else 0)
        assert ls.last_end == (ls.pos if after else ls.last_end)


@fuzz(40)
@given(noise_text=hostile_text(4, big=False), size=st.integers(0, 1 << 70),
       digest=st.text("0123456789abcdef", min_size=64, max_size=64) | st.text("0123456789abcdefABCDEF -x", max_size=70))
def test_the_followers_whole_log_line(noise_text, size, digest):
    line = f"{WHOLE_MARK}{size} {digest}"
    with case("follower whole-log line"):
        got = nodeops.read_whole(f"{noise_text}\n{line}\n")
        good = size < 10 ** 19 and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)
        if WHOLE_MARK not in noise_text:
            assert got == (nodeops.Whole(size, digest) if good else None)
            assert nodeops.read_whole(noise_text) is None
        assert got is None or (0 <= got.size < 10 ** 19 and re.fullmatch("[0-9a-f]{64}", got.sha256))


@fuzz(40, share=0.5)
@given(text=spliced(f"{WHOLE_MARK}1234 {'ab' * 32}\n", big=True))
def test_the_followers_whole_log_line_spliced(text):
    with case("follower whole-log line"):
        got = nodeops.read_whole(text)
        assert got is None or (0 <= got.size < 10 ** 19 and re.fullmatch("[0-9a-f]{64}", got.sha256))
