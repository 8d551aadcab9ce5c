"""Reading what a node command printed, launcher side (this module is never sent to a node).

A node is not trusted, and its login shell may print around a command's answer (a banner, a
motd, ``Welcome...``). So an answer is one *marked* line, found among whatever else came, and
everything in it is checked: its length, its JSON (no NaN, bounded nesting), its texts. The node
programs' readers (``probe``, ``envinfo``, ``top``: :func:`last_marked_json`) import it inside the
reader, which runs only here (a program's module-level code, which runs on the node, imports nothing
of clusterddp); the shell commands' readers (``status``) and the lease reader use it too.
"""

from __future__ import annotations

import json
import re


class ReplyError(ValueError):
    """An answer that is not one the node command gives; the message says why."""


def marked(text: str, mark: str, most: int) -> str | None:
    """The payload of the one line of ``text`` that starts with ``mark`` (its ``\\r`` dropped);
    None when there is none. ReplyError when there are several, or it is over ``most`` characters."""
    found = None
    at = 0
    while (i := text.find(mark, at)) >= 0:
        at = i + len(mark)
        if i and text[i - 1] != "\n":
            continue  # the mark inside another line
        end = text.find("\n", at)
        line = text[at:] if end < 0 else text[at:end]
        if found is not None:
            raise ReplyError(f"more than one {mark.strip()} line")
        if len(line) > most:
            raise ReplyError(f"a {mark.strip()} line of over {most} characters")
        found = line.rstrip("\r")
    return found


MAX_DEPTH = 32  # no node program's answer is nested more than a few levels
# Unrolled (a run of plain characters, then escapes each followed by a run): ``"(?:[^"\\]|\\.)*"`` pushed
# a backtracking frame per character, 128 bytes each: 180 MiB of memory for a 1.5 MB string in a reply.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)


def depth(text: str) -> int:
    """How deeply the JSON ``text`` nests its arrays and objects (linear time, strings skipped)."""
    deepest = level = 0
    for c in re.sub(r"[^\[\]{}]", "", _STRING.sub("", text)):
        level += 1 if c in "[{" else -1
        deepest = max(deepest, level)
    return deepest


def _constant(name: str) -> object:
    raise ReplyError(f"{name} is not a number")


def loads(text: str, max_depth: int = MAX_DEPTH, constant=_constant) -> object:
    """Strict JSON from a node: NaN and Infinity refused, nesting over ``max_depth`` refused before
    parsing (50,000 levels raised RecursionError). ReplyError naming what is wrong."""
    if depth(text) > max_depth:
        raise ReplyError(f"JSON nested over {max_depth} levels deep")
    try:
        return json.loads(text, parse_constant=constant)
    except ReplyError:
        raise
    except (ValueError, RecursionError) as e:
        raise ReplyError(f"not JSON ({e})") from None


def last_marked_json(stdout: bytes, mark: str, constant=_constant) -> object:
    """The JSON of the last line of ``stdout`` that starts with ``mark`` (a login banner may come
    first; its ``\r`` dropped), read by :func:`loads`; None when no line is marked. ReplyError when
    the marked line is not strict JSON (``constant`` says what NaN and Infinity become: refused by
default), or nests too deep."""
    text = stdout.decode("utf-8", "replace")
    for line in reversed(text.split("\n")):
        if line.startswith(mark):
            return loads(line[len(mark):].rstrip("\r"), constant=constant)
    return None


def one_line(text: str) -> str:
    """A node's text as one line: line breaks shown as ``\\n``/``\\r`` (a node must not print a line
    of its own, e.g. a fake ``PASS`` in `check`'s report). Other control characters are the
    printer's to escape (``cli.common.visible``)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r") if (
        "\n" in text or "\r" in text) else text


def one_line_each(value: object) -> object:
    """``value`` (a parsed, checked answer: dicts, lists, texts, numbers) with every text in it
    made :func:`one_line`, keys too (a package name is a key); what a node sent is printed only so."""
    if isinstance(value, str):
        return one_line(value)
    if isinstance(value, dict):
        return {one_line(k) if isinstance(k, str) else k: one_line_each(v) for k, v in value.items()}
    if isinstance(value, list):
        return [one_line_each(v) for v in value]
    return value


# ---- status (plan.status_command) ----

STATUS_MARK = "CLUSTERDDP_STATUS "
STATUS_MAX_CHARS = 64        # the longest honest reply is "exit 255 <12 digits>"; anything longer is not one
STATUS_MAX_REPLY = 1 << 16   # with a login banner around it


def parse_status(text: str) -> tuple[str, int | None]:
    """Parse :func:`plan.status_command` output: (``running``|``exited``|``lost``|``missing``|``garbled``,
    exit code); :func:`read_status` also gives when the job ended."""
    kind, code, _ = read_status(text)
    return kind, code


MAX_EPOCH_DIGITS = 12  # seconds since 1970, for the next 30,000 years


def read_status(text: str) -> tuple[str, int | None, int | None]:
    """Parse :func:`plan.status_command` output: (``running``|``exited``|``lost``|``missing``|``garbled``,
    exit code, when the job ended in epoch seconds by the node's clock).

    The answer is the one :data:`STATUS_MARK` line, whatever the login shell printed around it. The
    exit code must be 1 to 3 ASCII digits, 0..255 (what bash's ``$?`` can be; a signal shows as
    128+N, never negative), else it is unreadable (``exited``, None); the end time 1 to
    :data:`MAX_EPOCH_DIGITS` ASCII digits, else unknown (None: an exit code without it, as a node
    with no ``stat`` answers, is still read). No marked line, several, one that is none of the
    words or too long: ``garbled``. Never raises.
    :func:`clusterddp.record.from_report` says which NodeState that is.
    """
    if len(text) > STATUS_MAX_REPLY:
        return "garbled", None, None
    try:
        line = marked(text, STATUS_MARK, STATUS_MAX_CHARS)
    except ReplyError:
        return "garbled", None, None
    if line is None:
        return "garbled", None, None
    line = line.strip(" \t")
    if line in ("running", "lost", "missing"):
        return line, None, None
    word, sep, rest = line.partition(" ")
    if word == "exit" and sep:
        code, _, at = rest.strip(" ").partition(" ")
        at = at.strip(" ")
        ended = int(at) if re.fullmatch(r"[0-9]{1,%d}" % MAX_EPOCH_DIGITS, at, re.ASCII) else None
        if re.fullmatch(r"[0-9]{1,3}", code, re.ASCII) and int(code) <= 255:
            return "exited", int(code), ended
        return "exited", None, ended
    return "garbled", None, None
