"""Property-based: a node's one-line answers, ``status`` (``nodeops.parse_status``) and ``prune``'s
per-folder lines (``prune.parse_reply``).

Both never raise. A rendered answer parses back to its values; an exit code or a folder index or size
accepted is the number its ASCII digits say (an exit code 0..255, an index below the count asked), and
anything else (Unicode digits, control characters, huge numbers, NUL, very long lines) is ``garbled``,
an unreadable exit, or a line skipped.
"""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from clusterddp import nodeops, prune
from clusterddp.node.reply import STATUS_MARK, read_status
from fuzzing import case, fuzz, hostile_text, spliced

WORDS = ("running", "exited", "lost", "missing", "garbled")


def status(text: str):
    with case("status reply"):
        kind, code = nodeops.parse_status(text)
    return kind, code


@fuzz(30, share=0.25)
@given(word=st.sampled_from(["running", "lost", "missing", "exit"]), code=st.integers(0, 255),
       pad=st.sampled_from(["", "\n", "\r\n", " ", "\t\n"]))
def test_a_status_reply_parses_back(word, code, pad):
    banner = "Welcome...\n"  # a login shell's banner before the marked line
    if word == "exit":
        assert status(f"{banner}{STATUS_MARK}exit {code}{pad}") == ("exited", code)
    else:
        assert status(banner + STATUS_MARK + word + pad) == (word, None)


@fuzz(30, share=0.25)
@given(code=st.integers(0, 255), ended=st.integers(0, 10 ** 12 - 1), pad=st.sampled_from(["", "\n", "\r\n", " "]))
def test_an_exit_reply_with_its_end_time_parses_back(code, ended, pad):
    with case("status reply"):
        assert read_status(f"motd\n{STATUS_MARK}exit {code} {ended}{pad}") == ("exited", code, ended)
        assert read_status(f"{STATUS_MARK}exit {code} {pad}") == ("exited", code, None)  # a node without stat


@fuzz(60)
@given(text=st.one_of(hostile_text(), st.builds("exit {}".format, hostile_text(3, big=False)),
                      st.builds("exit 0 {}".format, hostile_text(2, big=False)),
                      st.builds(lambda w, p: STATUS_MARK + w + p, st.sampled_from(["running", "exit 0", "lost"]),
                                hostile_text(2, big=False))))
def test_any_status_reply_is_a_word_and_an_exit_code_its_ascii_digits_say(text):
    with case("status reply"):
        kind, code, ended = read_status(text)
    assert (kind, code) == status(text) and kind in WORDS
    if code is not None or ended is not None:
        line = next(x for x in reversed(text.split("\n")) if x.startswith(STATUS_MARK))[len(STATUS_MARK):]
        words = line.strip(" \t\r\n").split(" ")
        words = [w for w in words if w]
        assert kind == "exited" and words[0] == "exit" and len(words) in (2, 3)
        if code is not None:
            assert re.fullmatch(r"[0-9]{1,3}", words[1], re.ASCII) and int(words[1]) == code <= 255
        if ended is not None:  # the node's clock, in epoch seconds: only ASCII digits, at most 12
            assert re.fullmatch(r"[0-9]{1,12}", words[2], re.ASCII) and int(words[2]) == ended


LINE_WORDS = ("removed", "would", "missing", "running", "refused", "failed", "shared")


def reply(text: str, count: int):
    with case("prune reply"):
        got = prune.parse_reply(text, count)
    return got


@fuzz(30, share=0.25)
@given(lines=st.lists(st.tuples(st.sampled_from(LINE_WORDS), st.none() | st.integers(0, 10 ** 15 - 1)), max_size=8),
       noise=st.sampled_from(["", "motd\n", "rm: cannot remove\n"]))
def test_prune_lines_parse_back(lines, noise):
    text = noise + "".join(f"{i} {w}" + ("" if k is None else f" {k}") + "\n" for i, (w, k) in enumerate(lines))
    assert reply(text, len(lines)) == {i: (w, k) for i, (w, k) in enumerate(lines)}


@fuzz(60)
@given(count=st.integers(0, 5), text=st.one_of(
    hostile_text(),
    st.builds(lambda i, w, k: f"{i} {w} {k}\n", hostile_text(1, big=False), st.sampled_from(LINE_WORDS),
              hostile_text(1, big=False)),
    st.builds(lambda t: t, spliced("0 removed 12\n1 would -\n2 running\n", big=False))))
def test_any_prune_reply_gives_only_the_numbers_its_ascii_digits_say(count, text):
    got = reply(text, count)
    ours = {}
    for line in text.splitlines():  # the documented rule: "<index> <word>[ <KiB>|-][ <host>]", in ASCII digits
        m = re.fullmatch(r"([0-9]{1,9}) (removed|would|missing|running|refused|failed|shared)(?: ([0-9]{1,15}|-))?"
                         r"(?: \S+)?", line.strip(), re.ASCII)
        if m and int(m.group(1)) < count:
            ours[int(m.group(1))] = (m.group(2), int(m.group(3)) if m.group(3) not in (None, "-") else None)
    assert got == ours
