"""torch's flight recorder on a failed run: which collective each rank last entered, and the rank(s)
that never entered the one the others wait in.

torch keeps, in every rank, a ring buffer of its last collectives (``FlightRecorder``: op, sequence
number per process group, state, Python frames). On NCCL, a collective that times out makes that rank
write the buffer to ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>`` and tell the other ranks, through the
store, to write theirs (``TORCH_NCCL_DUMP_ON_TIMEOUT``). :func:`env_lines` (in every launch.sh, after the
user's env) points the file into the node's control folder, ``$CTL/flight/rank<N>`` (0700: a dump holds
the script's frames; torch's default, ``/tmp/nccl_trace_rank_<N>``, is shared by every run and user of
the machine). It sets torch's newer names, ``TORCH_FR_BUFFER_SIZE`` and ``TORCH_FR_DUMP_TEMP_FILE``
(read before ``TORCH_NCCL_TRACE_BUFFER_SIZE`` and ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, which torch 2.13
warns are deprecated on every rank when they are set): a torch that knows only the older names
records nothing unless the user sets them. A value the user set (``-e``, the inventory's env, a setup
line, the node's own environment) wins, under either name (an older name's value is copied to the
newer one; dumps written outside the control folder are not fetched). The variables are inert where
no NCCL process group exists (gloo records the same buffer in torch 2.13 by default, 2000 entries,
but never dumps it).

After a failure the node program ``flight`` (``clusterddp/node/flight.py``) sends the dumps;
:func:`parse_reply` checks its answer, :func:`parse_dump` reads one dump (a pickle, from a node: never
``pickle.load``-ed as is: its opcodes are checked first, data only, then it is loaded by an unpickler
that refuses every global; the JSON form is read too) and never raises; :func:`read` says where each rank
stands. :class:`Flight` is what run.json's ``failure.flight`` holds and the summary prints.
"""

from __future__ import annotations

import base64
import binascii
import io
import pickle
import pickletools
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .node import flight as node_flight
from .node.reply import ReplyError, last_marked_json, loads, one_line
from .sizes import ranges

FOLDER = node_flight.FOLDER
BUFFER_ENTRIES = 2000    # torch 2.13's own default (FlightRecorder.hpp); older torch had 0: nothing recorded

# The lines of launch.sh (after the user's env is exported): ${X-default} keeps a value the user set,
# an empty one included.
ENV_LINES = (
    f'(umask 077 && mkdir -p "$CTL/{FOLDER}") 2>/dev/null || true',
    'export TORCH_FR_BUFFER_SIZE='
    f'"${{TORCH_FR_BUFFER_SIZE-${{TORCH_NCCL_TRACE_BUFFER_SIZE-{BUFFER_ENTRIES}}}}}" '
    'TORCH_NCCL_DUMP_ON_TIMEOUT="${TORCH_NCCL_DUMP_ON_TIMEOUT-1}" '
    'TORCH_FR_DUMP_TEMP_FILE='
    f'"${{TORCH_FR_DUMP_TEMP_FILE-${{TORCH_NCCL_DEBUG_INFO_TEMP_FILE-$CTL/{FOLDER}/{node_flight.PREFIX}}}}}"',
)

MOST_BYTES = node_flight.MOST_BYTES
MOST_REPLY = node_flight.MOST_REPLY
MOST_ENTRIES = 100_000   # entries of one dump read (torch keeps TORCH_FR_BUFFER_SIZE of them)
MOST_RANKS = 4096        # ranks a Flight names
MOST_TEXT = 500          # characters of any one text kept from a dump
MOST_NOTES = 16


def env_lines() -> list[str]:
    """launch.sh's flight recorder lines (every backend's node script, after the env's exports)."""
    return list(ENV_LINES)


# ---- the node's answer ----

def parse_reply(stdout: bytes) -> list[tuple[int, bytes | None, str]]:
    """The node program's answer: (global rank, the dump's bytes or None, why none); ReplyError else."""
    if len(stdout) > MOST_REPLY:
        raise ReplyError(f"a reply of over {MOST_REPLY} bytes")
    r = last_marked_json(stdout, node_flight.MARK)
    if not isinstance(r, dict) or not isinstance(r.get("dumps"), list):
        raise ReplyError(f"no {node_flight.MARK.strip()} line with a list of dumps in the node's answer")
    if len(r["dumps"]) > node_flight.MOST_FILES:
        raise ReplyError(f"over {node_flight.MOST_FILES} dumps")
    out: list[tuple[int, bytes | None, str]] = []
    for i, d in enumerate(r["dumps"]):
        rank, data, note = (d.get(k) for k in ("rank", "data", "note")) if isinstance(d, dict) else (None,) * 3
        if (type(rank) is not int or not 0 <= rank < 1 << 24 or not isinstance(note, str)
                or not isinstance(data, str | None)):
            raise ReplyError(f"dumps[{i}] is not a rank, data and note")
        out.append((rank, None if data is None else _inflate(data, i), one_line(note[:MOST_TEXT])))
    return out


def _inflate(text: str, i: int) -> bytes:
    try:
        z = zlib.decompressobj()
        data = z.decompress(base64.b64decode(text, validate=True), MOST_BYTES + 1)
    except (binascii.Error, ValueError, zlib.error) as e:
        raise ReplyError(f"dumps[{i}].data is not base64 of zlib data ({e})") from None
    if len(data) > MOST_BYTES or not z.eof:
        raise ReplyError(f"dumps[{i}].data: over {MOST_BYTES} bytes, or cut short")
    return data


# ---- one dump ----

# The opcodes of data: what torch's pickler writes (dicts, lists, tuples, texts, numbers, booleans, None),
# and nothing that names a global, calls, builds an object or reads a buffer.
_DATA_OPS = frozenset("""PROTO FRAME STOP MARK POP POP_MARK DUP NONE NEWTRUE NEWFALSE INT BININT BININT1 BININT2
    LONG LONG1 LONG4 FLOAT BINFLOAT STRING BINSTRING SHORT_BINSTRING UNICODE BINUNICODE SHORT_BINUNICODE
    BINUNICODE8 BINBYTES SHORT_BINBYTES BINBYTES8 EMPTY_DICT DICT SETITEM SETITEMS EMPTY_LIST LIST APPEND
    APPENDS EMPTY_TUPLE TUPLE TUPLE1 TUPLE2 TUPLE3 EMPTY_SET ADDITEMS FROZENSET PUT BINPUT LONG_BINPUT
    MEMOIZE GET BINGET LONG_BINGET""".split())
_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a global ({module[:50]}.{name[:50]}): not data")


def _unpickle(data: bytes) -> Any:
    """``data`` as a value if it is a pickle of data only; ValueError else. The opcodes are checked
    before anything is built (the C unpickler sizes its memo by the largest index it is given: a
    memo index is allowed only as one of the indices already put)."""
    puts = 0
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name not in _DATA_OPS:
                raise ValueError(f"opcode {op.name}: not data")
            if op.name in _PUTS:
                if not isinstance(arg, int) or not 0 <= arg <= puts:
                    raise ValueError("a memo index out of order")
                puts += 1
            elif op.name == "MEMOIZE":
                puts += 1
    except ValueError:
        raise
    except Exception as e:  # noqa: BLE001 - pickletools raises what the bytes make it raise
        raise ValueError(f"not a pickle ({type(e).__name__})") from None
    try:
        return _NoGlobals(io.BytesIO(data)).load()
    except Exception as e:  # noqa: BLE001 - an unpickler raises what the bytes make it raise
        raise ValueError(f"not a pickle ({type(e).__name__}: {str(e)[:100]})") from None


@dataclass(frozen=True)
class Entry:
    """One collective of a rank's flight recorder, as read (every field checked)."""

    record: int       # record_id: the order in which this rank entered its collectives, all groups together
    group: str        # the process group: its name and, when it has one, its description
    seq: int          # collective_seq_id (p2p_seq_id for a send/recv) within that group
    op: str           # profiling_name: nccl:all_reduce, gloo:broadcast, ...
    state: str        # scheduled, started or completed
    p2p: bool
    where: str        # the innermost frame of the user's own code, file:line function ("" when none)


@dataclass(frozen=True)
class Dump:
    """One rank's flight recorder: its entries, oldest first, and the ranks of its process groups."""

    version: str
    entries: tuple[Entry, ...]
    members: tuple[tuple[str, tuple[int, ...]], ...]   # (group, its global ranks), from pg_config


_NOT_USERS = re.compile(r"(/site-packages/|/dist-packages/|/lib/python\d[\d.]*/|^<)")


def _text(v: Any) -> str:
    return one_line(v[:MOST_TEXT])[:MOST_TEXT] if isinstance(v, str) else ""


def _int(v: Any) -> int | None:
    return v if type(v) is int and 0 <= v < 1 << 63 else None


def _group(name: Any, desc: Any = "") -> str:
    name, desc = _text(name), _text(desc)
    return f"{name} ({desc})" if desc and desc != name else name or desc or "?"


def _where(frames: Any) -> str:
    if not isinstance(frames, list):
        return ""
    for f in frames[:200]:
        if isinstance(f, dict) and isinstance(f.get("filename"), str) and not _NOT_USERS.search(f["filename"]):
            line = _int(f.get("line"))
            name = _text(f["filename"]).rsplit("/", 1)[-1]
            return f"{name}:{line if line is not None else '?'} {_text(f.get('name'))}"
    return ""


def _entry(e: Any) -> Entry | None:
    if not isinstance(e, dict):
        return None
    pg = e.get("process_group")
    pg = pg if isinstance(pg, tuple | list) and len(pg) == 2 else (pg, "")
    p2p = e.get("is_p2p") is True
    record, seq = _int(e.get("record_id")), _int(e.get("p2p_seq_id" if p2p else "collective_seq_id"))
    if record is None or seq is None:
        return None
    return Entry(record, _group(*pg), seq, _text(e.get("profiling_name")) or "?", _text(e.get("state")) or "?",
                 p2p, _where(e.get("frames")))


def _members(config: Any) -> tuple[tuple[str, tuple[int, ...]], ...]:
    out = []
    for key, c in list(config.items())[:1000] if isinstance(config, dict) else ():
        if not isinstance(c, dict) or not isinstance(c.get("ranks"), str) or len(c["ranks"]) > 100_000:
            continue
        if not re.fullmatch(r"\[[0-9, ]*\]", c["ranks"]):
            continue
        ranks = tuple(int(x) for x in re.findall(r"[0-9]{1,7}", c["ranks"]))
        out.append((_group(c.get("name", key), c.get("desc", "")), ranks))
    return tuple(out)


def parse_dump(data: bytes) -> Dump | str:
    """One rank's dump (torch's pickle, or the JSON of ``_dump_fr_trace_json``) as a :class:`Dump`, or
    why it is not one. Never raises; nothing in it is run."""
    if len(data) > MOST_BYTES:
        return f"over {MOST_BYTES} bytes"
    try:
        if data[:1] == b"{":
            value = loads(data.decode("utf-8"))
        else:
            value = _unpickle(data)
    except (ValueError, UnicodeDecodeError) as e:
        return f"not a flight recorder dump: {one_line(str(e)[:200])}"
    if not isinstance(value, dict) or not isinstance(value.get("entries", []), list):
        return "not a flight recorder dump: no entries"
    entries = [x for x in map(_entry, value.get("entries", [])[:MOST_ENTRIES]) if x is not None]
    entries.sort(key=lambda x: x.record)
    return Dump(_text(value.get("version")), tuple(entries), _members(value.get("pg_config")))


# ---- where each rank stands ----

@dataclass(frozen=True)
class Entered:
    """The collective a rank entered last (its newest entry), as run.json and the summary show it."""

    host: str
    rank: int
    op: str
    seq: int
    state: str
    group: str
    where: str = ""

    def text(self) -> str:
        at = f", at {self.where}" if self.where else ""
        return f"{self.op} #{self.seq} of group {self.group}, {self.state}{at}"


@dataclass(frozen=True)
class Flight:
    """What the flight recorder dumps of a failed run say: each rank's last collective, the ranks
    that never entered the one other ranks wait in (``behind``), and why some rank has none."""

    summary: str
    behind: tuple[int, ...]
    ranks: tuple[Entered, ...]
    notes: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        out = [f"  flight recorder: {self.summary}"]
        groups: dict[tuple[str, str], list[Entered]] = {}
        for e in self.ranks:
            groups.setdefault((e.host, Entered("", 0, e.op, e.seq, e.state, e.group, e.where).text()), []).append(e)
        for (host, text), es in list(groups.items())[:32]:
            who = f"rank {es[0].rank}" if len(es) == 1 else f"ranks {ranges(e.rank for e in es)}"
            out.append(f"    {who} ({host}): last entered {text}")
        out += [f"    {n}" for n in self.notes]
        return out

    def to_json(self) -> dict[str, Any]:
        return {"summary": self.summary, "behind": list(self.behind), "notes": list(self.notes),
                "ranks": [{"host": e.host, "rank": e.rank, "op": e.op, "seq": e.seq, "state": e.state,
                           "group": e.group, "where": e.where} for e in self.ranks]}

    @classmethod
    def from_json(cls, data: Any) -> Flight:
        """run.json's ``failure.flight``, checked; ValueError naming the field."""
        if not isinstance(data, dict):
            raise ValueError("flight: must be an object")

        def text(d: dict, key: str, where: str) -> str:
            v = d.get(key)
            if not isinstance(v, str) or len(v) > 4 * MOST_TEXT:
                raise ValueError(f"{where}{key}: must be a text of at most {4 * MOST_TEXT} characters")
            return v

        def number(v: Any, where: str) -> int:
            if type(v) is not int or not 0 <= v < 1 << 63:
                raise ValueError(f"{where}: must be a whole number >= 0")
            return v
        ranks, behind, notes = data.get("ranks"), data.get("behind"), data.get("notes", [])
        if not isinstance(ranks, list) or len(ranks) > MOST_RANKS:
            raise ValueError(f"flight.ranks: must be a list of at most {MOST_RANKS}")
        if not isinstance(behind, list) or len(behind) > MOST_RANKS:
            raise ValueError(f"flight.behind: must be a list of at most {MOST_RANKS}")
        if not isinstance(notes, list) or len(notes) > MOST_NOTES or not all(
                isinstance(n, str) and len(n) <= 4 * MOST_TEXT for n in notes):
            raise ValueError(f"flight.notes: must be a list of at most {MOST_NOTES} texts")
        read = []
        for i, e in enumerate(ranks):
            w = f"flight.ranks[{i}]."
            if not isinstance(e, dict):
                raise ValueError(f"flight.ranks[{i}]: must be an object")
            read.append(Entered(text(e, "host", w), number(e.get("rank"), w + "rank"), text(e, "op", w),
                                number(e.get("seq"), w + "seq"), text(e, "state", w), text(e, "group", w),
                                text(e, "where", w)))
        return cls(text(data, "summary", "flight."), tuple(number(b, f"flight.behind[{i}]") for i, b in
                                                             enumerate(behind)), tuple(read), tuple(notes))


def read(dumps: Sequence[tuple[str, int, bytes | None, str]], world: int | None = None) -> Flight | None:
    """Where each rank stands, from every node's dumps ``(host, rank, bytes or None, why none)``;
    None when there is no dump at all. Never raises. ``world``: the run's number of ranks, the members of
    the default group (``0``) where the dumps do not say (gloo names no group in its ``pg_config``).

    For each process group in which some rank's newest collective there has not completed, the front
    is the highest sequence number any rank entered in it: a member of the group whose own highest is
    lower never entered the collective the others wait in (a rank that took another branch, or is stuck
    before it): ``behind``. A member with no dump is named in the notes, not behind."""
    if not dumps:
        return None
    parsed: dict[int, tuple[str, Dump]] = {}
    notes: list[str] = []
    for host, rank, data, why in sorted(dumps, key=lambda d: d[1])[:MOST_RANKS]:
        got = parse_dump(data) if data is not None else _text(why) or "no data"
        if isinstance(got, str):
            notes.append(f"rank {rank} ({host}): its dump is not read: {got}")
        elif rank not in parsed:
            parsed[rank] = (host, got)
    entered = tuple(Entered(h, r, e.op, e.seq, e.state, e.group, e.where)
                    for r, (h, d) in parsed.items() for e in d.entries[-1:])
    members: dict[str, set[int]] = {}
    for _, d in parsed.values():
        for g, rs in d.members:
            members.setdefault(g, set()).update(rs)
    behind: set[int] = set()
    hosts = {r: h for r, (h, _) in parsed.items()}
    verdicts = []
    groups = sorted({e.group for _, d in parsed.values() for e in d.entries if not e.p2p})
    for g in groups:
        last = {r: max((e for e in d.entries if e.group == g and not e.p2p), key=lambda e: e.seq, default=None)
                for r, (_, d) in parsed.items()}
        last_in = {r: e for r, e in last.items() if e is not None}
        front = max(e.seq for e in last_in.values())
        waiting = sorted(r for r, e in last_in.items() if e.seq == front and e.state != "completed")
        if not waiting:
            continue
        default = set(range(min(world, MOST_RANKS))) if world and g.split(" ", 1)[0] == "0" else set()
        group_ranks = members.get(g) or default or set(last_in)
        late = sorted(r for r in group_ranks if r in parsed and (r not in last_in or last_in[r].seq < front))
        op = last_in[waiting[0]].op
        if late:
            behind.update(late)
            theirs = "; ".join(f"rank {r}'s last: " + (f"{last_in[r].op} #{last_in[r].seq}, {last_in[r].state}"
                                                     if r in last_in else "none in this group") for r in late[:8])
            verdicts.append(f"{_who(late, hosts)} never entered {op} #{front} of group {g}, where "
                            f"{_who(waiting, hosts)} {'waits' if len(waiting) == 1 else 'wait'} ({theirs})")
        else:
            verdicts.append(f"{_who(waiting, hosts)} {'waits' if len(waiting) == 1 else 'wait'} in {op} #{front} of "
                            f"group {g}, which every rank with a dump entered")
        missing = sorted(group_ranks - set(parsed))
        if missing:
            notes.append(f"group {g}: no dump from {_who(missing, hosts)} (a node that did not answer, or a rank that "
                         "did not write one)")
    if not verdicts:
        summary = ("no rank waits in a collective: every rank's newest one completed" if entered else
                   "no dump could be read")
    else:
        summary = verdicts[0] + (f" (and {len(verdicts) - 1} more group(s))" if len(verdicts) > 1 else "")
    most = 4 * MOST_TEXT  # what run.json's reader takes
    return Flight(summary[:most], tuple(sorted(behind)), entered,
                  tuple(n[:most] for n in dict.fromkeys(notes))[:MOST_NOTES])


def _who(ranks: Sequence[int], hosts: Mapping[int, str]) -> str:
    """``rank 3 (node-2)`` or ``ranks 0-2 (node-1, node-2)``."""
    where = ", ".join(dict.fromkeys(hosts[r] for r in ranks if r in hosts))
    who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranges(ranks)}"
    return f"{who} ({where})" if where else who
