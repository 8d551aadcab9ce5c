"""Hosts set aside after a machine-side failure: the launching machine's list of them.

A machine whose GPU failed during a run (an Xid of the machine's kind: :mod:`clusterddp.policy`) is
quarantined at once; one lost twice in a row (its link or power gone, a kernel panic: lost in an
attached run, and lost again, or its GPU failing, in its next run within :data:`STRIKE_S`) too; with the
inventory's ``quarantine_stragglers: true``, a host named a straggler in an attached run
(:mod:`clusterddp.stragglers`) takes a strike as a lost one does (:func:`strike_slow`). It stays
so for the inventory's ``quarantine:`` (default :data:`DEFAULT_S`, 2 h): later runs and schedules of
any inventory naming that machine refuse it (exit 75), naming it and until when, and ``check`` and
``leases`` show it. ``clusterddp quarantine list/add/release`` manage the list by hand.

The list is one JSON file, ``$XDG_STATE_HOME/clusterddp/quarantine.json`` (default
``~/.local/state/clusterddp/``; folder 0700, file 0600), keyed by the machine's address and SSH port
(the same machine under two inventory names is one machine). Every change is made under an
``flock`` of ``quarantine.lock`` beside it and written whole, then renamed (:func:`files.write_private`),
so launchers at once never lose each other's entries. The file is read as untrusted: bounded,
every entry checked; a damaged file is refused by name (exit 2, by ``up`` too: nothing in it is
dropped or overwritten), except after a run, where it never changes the run's outcome.

Pure logic (:func:`decide`) is separate from the file, for tests.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from . import files
from .errors import FileRefused, Quarantined, QuarantineError
from .inventory import DEFAULT_QUARANTINE_S

DEFAULT_S = DEFAULT_QUARANTINE_S  # the inventory's `quarantine:` when it gives none
MOST_BYTES = 1 << 20
MOST_ENTRIES = 10_000
MOST_TEXT = 500
LOCK_WAIT_S = 10.0
FILE_NAME = "quarantine.json"
LAST_TIME = 253402300799.0  # 9999-12-31 23:59:59 UTC: no time in the file is later (nor before 1970)
MOST_FOR_S = 100 * 365 * 86400.0  # `quarantine add --for`: at most 100 years


def state_dir() -> Path:
    """The launching machine's clusterddp state: ``$XDG_STATE_HOME/clusterddp`` (``~/.local/state/clusterddp``)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "clusterddp"


@dataclass(frozen=True)
class Entry:
    """One quarantined machine."""

    machine: str          # "address:port": the key
    host: str             # the inventory name it had when it was set aside
    since: float          # epoch seconds
    until: float
    why: str              # one line
    run_id: str | None    # the run whose failure set it aside (None: by hand)

    def to_json(self) -> dict:
        return asdict(self)


def machine(address: str, port: int | None) -> str:
    """A machine's key: its address and SSH port (22 when the inventory leaves it to ssh)."""
    return f"{address}:{port or 22}"


_MACHINE = re.compile(r"[^\s:]+(?::[^\s:]+)*:\d{1,5}|\[[0-9A-Fa-f:.]+\]:\d{1,5}")


def _entry(d: object, where: str) -> Entry:
    """A checked entry of the file (``where``: its place, for the error)."""
    if not isinstance(d, dict):
        raise ValueError(f"{where}: not an object")
    out: dict = {}
    for key, types in (("machine", (str,)), ("host", (str,)), ("since", (int, float)), ("until", (int, float)),
                       ("why", (str,)), ("run_id", (str, type(None)))):
        v = d.get(key)
        if not isinstance(v, types) or isinstance(v, bool):
            raise ValueError(f"{where}.{key}: missing or of the wrong type")
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{where}.{key}: not a finite number")
        if key in ("since", "until") and isinstance(v, int | float) and not 0 <= v <= LAST_TIME:
            raise ValueError(f"{where}.{key}: not a time between 1970 and 9999 (epoch seconds)")
        if isinstance(v, str) and (len(v) > MOST_TEXT or "\n" in v or "\r" in v):
            raise ValueError(f"{where}.{key}: longer than {MOST_TEXT} characters or more than one line")
        out[key] = v
    if not _MACHINE.fullmatch(out["machine"]):
        raise ValueError(f"{where}.machine: {out['machine']!r} is not address:port")
    return Entry(**out)


def _strike(d: object, where: str) -> Strike:
    if not isinstance(d, dict):
        raise ValueError(f"{where}: not an object")
    e = _entry({**d, "since": d.get("at"), "until": d.get("at"), "why": "", "run_id": d.get("run_id")}, where)
    if e.run_id is None:
        raise ValueError(f"{where}.run_id: missing")
    return Strike(e.machine, e.host, e.run_id, e.since)


def parse(data: bytes, path: str = FILE_NAME) -> tuple[list[Entry], list[Strike]]:
    """The entries and strikes of a quarantine file's bytes. Raises QuarantineError naming ``path``
    and what is wrong."""
    fix = f"fix or remove {path} (it lists the hosts set aside; nothing was changed)"
    try:
        doc = json.loads(data.decode("utf-8"))
        if not isinstance(doc, dict) or not isinstance(doc.get("hosts"), list) or not isinstance(
                doc.get("strikes", []), list):
            raise ValueError("not an object with a 'hosts' list (and a 'strikes' list)")
        hosts, strikes = doc["hosts"], doc.get("strikes", [])
        if len(hosts) + len(strikes) > MOST_ENTRIES:
            raise ValueError(f"more than {MOST_ENTRIES} entries")
        return ([_entry(d, f"hosts[{i}]") for i, d in enumerate(hosts)],
                [_strike(d, f"strikes[{i}]") for i, d in enumerate(strikes)])
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise QuarantineError(f"{path}: damaged quarantine file: {e}", fix) from None


def render(entries: Iterable[Entry], strikes: Iterable[Strike] = ()) -> bytes:
    return (json.dumps({"hosts": [e.to_json() for e in entries], "strikes": [k.to_json() for k in strikes]},
                       indent=1) + "\n").encode()


# ---- the policy (pure) ----

STRIKE_S = 24 * 3600.0  # a loss counts towards "twice in a row" for this long


@dataclass(frozen=True)
class Strike:
    """A machine lost in a run (once): lost again in its next run, it is set aside."""

    machine: str
    host: str
    run_id: str
    at: float

    def to_json(self) -> dict:
        return asdict(self)


def decide(lost: dict[str, str], kept: Iterable[str], strikes: Sequence[Strike], run_id: str, now: float,
           seconds: float, at_once: dict[str, tuple[str, str]] | None = None,
           again: dict[str, tuple[str, str]] | None = None,
           slow: dict[str, str] | None = None) -> tuple[list[Entry], list[Strike]]:
    """After run ``run_id``: ``lost`` maps each machine lost in it to its host name, ``kept`` are the
    run's other machines (they answered to the end: their strike, if any, is wiped), ``at_once`` maps each
    machine whose failure sets it aside at once (a GPU error) to (host, why), ``again`` each machine that
    failed for a reason that counts only as a second failure in a row to (host, why). A machine lost, or
    in ``again``, with a strike from an earlier run is set aside for ``seconds``, as is one in
    ``at_once``; one lost without gets a strike (one loss alone can be a passing network fault, which the
    run already reports; two in a row is the machine). ``slow`` maps each machine named a straggler in the
    run to its host (``quarantine_stragglers: true``): :func:`strike_slow`, unless it failed as above (one
    strike a run); it is not ``kept`` then. Returns the new entries and the strikes that remain."""
    kept, at_once, again = set(kept), at_once or {}, again or {}
    slow = {m: h for m, h in (slow or {}).items() if m not in lost and m not in at_once and m not in again}
    kept -= set(slow)
    earlier = {k.machine: k for k in strikes if k.at + STRIKE_S > now and k.run_id != run_id}
    added, left = [], [k for k in earlier.values() if k.machine not in kept and k.machine not in lost
                       and k.machine not in at_once and k.machine not in again]
    for m, (host, what) in at_once.items():
        before = earlier.get(m)
        why = f"{what} in run {run_id}" + (f" (lost in run {before.run_id} before)" if before else "")
        added.append(Entry(m, host, now, now + seconds, _one_line(why), run_id))
    for m, (host, what) in again.items():
        before = earlier.get(m)
        if before is not None and m not in at_once:
            why = f"lost in run {before.run_id}, then failed in run {run_id}: {what}"
            added.append(Entry(m, host, now, now + seconds, _one_line(why), run_id))
    for m, host in lost.items():
        if m in at_once:
            continue
        before = earlier.get(m)
        if before is None:
            left.append(Strike(m, host, run_id, now))
            continue
        why = f"lost in runs {before.run_id} and {run_id}, one after the other"
        added.append(Entry(m, host, now, now + seconds, _one_line(why), run_id))
    more, left = strike_slow(slow, left, run_id, now, seconds)
    return added + more, left


def strike_slow(slow: dict[str, str], strikes: Sequence[Strike], run_id: str, now: float,
                seconds: float) -> tuple[list[Entry], list[Strike]]:
    """After run ``run_id``, in which each machine of ``slow`` (machine -> host) was named a straggler:
    one with a strike from an earlier run (lost, or a straggler, within :data:`STRIKE_S`) is set aside for
    ``seconds`` (its strike used up); one without gets a strike of this run (once, however often it is
    counted). The other strikes stay as they are. Returns the new entries and the strikes that remain."""
    earlier: dict[str, Strike] = {}
    mine: set[str] = set()
    left: list[Strike] = []
    for k in strikes:
        if k.machine not in slow:
            left.append(k)
        elif k.run_id == run_id:
            mine.add(k.machine)
            left.append(k)
        elif k.at + STRIKE_S > now:
            earlier[k.machine] = k
    added = []
    for m, host in slow.items():
        if m in earlier:
            why = (f"named a straggler in run {run_id} (the other ranks waited for it), after a strike in run "
                   f"{earlier[m].run_id} (lost or a straggler there)")
            added.append(Entry(m, host, now, now + seconds, _one_line(why), run_id))
        elif m not in mine:
            left.append(Strike(m, host, run_id, now))
    return added, left


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MOST_TEXT else text[:MOST_TEXT - 3] + "..."


def after_run(rec, seconds: float = DEFAULT_S, q: Quarantine | None = None, now: float | None = None,
              slow: Iterable[str] = ()) -> list[Entry]:
    """After an attached run failed (``rec``: its record, as it ended): update the strikes and set
    aside each machine :func:`decide` says to, for ``seconds`` (the inventory's ``quarantine:``), from the
    machines' failures :func:`clusterddp.policy.machine_faults` finds (the SSH backend's runs: Slurm keeps
    its own nodes' health), and the hosts named stragglers in it (``slow``: host names, with the inventory's
    ``quarantine_stragglers: true``; hosts not in the record are left out). Returns the entries added (to
    be said)."""
    from .policy import machine_faults
    if rec.local:
        return []
    q = q or Quarantine()
    faults = machine_faults(rec, q.struck(rec, now))
    key = {n.host: machine(n.settings.address, n.settings.port) for n in rec.nodes}
    lost = {key[h]: h for h, f in faults.items() if f.kind == "lost"}
    now_out = {key[h]: (h, f.why) for h, f in faults.items() if f.at_once}
    again = {key[h]: (h, f.why) for h, f in faults.items() if f.kind == "again"}
    kept = [key[n.host] for n in rec.nodes if n.host not in faults]
    return q.after(rec.run_id, lost, kept, seconds, now, now_out, again, {key[h]: h for h in slow if h in key})


def after_slow(rec, slow: Iterable[str], seconds: float = DEFAULT_S, q: Quarantine | None = None,
               now: float | None = None) -> list[Entry]:
    """After an attached run that did not fail (``rec``: its record): :func:`strike_slow` for the hosts
    named stragglers in it (``slow``: host names, with ``quarantine_stragglers: true``; hosts not in the
    record are left out), nothing else changed. Returns the entries added (to be said)."""
    if rec.local:
        return []
    key = {n.host: machine(n.settings.address, n.settings.port) for n in rec.nodes}
    named = {key[h]: h for h in slow if h in key}
    return (q or Quarantine()).after_slow(rec.run_id, named, seconds, now) if named else []


def quarantined(hosts, q: Quarantine | None = None, now: float | None = None) -> dict[str, Entry]:
    """The entries in force for ``hosts`` (inventory Hosts), by host name."""
    by_machine = {machine(h.address, h.port): h.name for h in hosts}
    return {by_machine[m]: e for m, e in (q or Quarantine()).of(by_machine, now).items()}


def refuse(hosts, q: Quarantine | None = None, now: float | None = None) -> None:
    """Raise :class:`Quarantined` when any of ``hosts`` (inventory Hosts) is quarantined now, naming
    each with until when and why, and how to let it back or leave it out."""
    found = (q or Quarantine()).of((machine(h.address, h.port) for h in hosts), now)
    if not found:
        return
    by_machine = {machine(h.address, h.port): h.name for h in hosts}
    lines = [f"{by_machine[m]} ({m}) is quarantined until {stamp(e.until)}: {e.why}" for m, e in found.items()]
    names = ",".join(by_machine[m] for m in found)
    raise Quarantined("; ".join(lines),
                      f"leave it out with --exclude {names}, or let it back with "
                      f"`clusterddp quarantine release {by_machine[next(iter(found))]}`")


def stamp(t: float) -> str:
    """``t`` (epoch seconds) as a local date and time; never raises (a time past what the C library can
    say is said as epoch seconds)."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S%z", time.localtime(t))
    except (OverflowError, OSError, ValueError):
        return f"{t:.0f} (epoch seconds)" if math.isfinite(t) else str(t)


# ---- the file ----

class Quarantine:
    """The quarantine file of this machine (``path``: another file, for tests)."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else state_dir() / FILE_NAME

    def entries(self, now: float | None = None) -> list[Entry]:
        """Every entry still in force at ``now`` (default: now). Raises QuarantineError for a damaged file."""
        now = time.time() if now is None else now
        return [e for e in self._read()[0] if e.until > now]

    def strikes(self) -> list[Strike]:
        return self._read()[1]

    def of(self, machines: Iterable[str], now: float | None = None) -> dict[str, Entry]:
        """The entries in force for ``machines`` (``address:port`` each), by machine."""
        want = set(machines)
        return {e.machine: e for e in self.entries(now) if e.machine in want}

    def add(self, new: Sequence[Entry]) -> None:
        """Put ``new`` in (a machine already there gets the later end), dropping entries that expired."""
        if not new:
            return
        with self._locked():
            entries, strikes = self._read()
            self._write(self._merged(entries, new, time.time()), strikes)

    @staticmethod
    def _merged(entries: Iterable[Entry], new: Iterable[Entry], now: float) -> list[Entry]:
        keep = {e.machine: e for e in entries if e.until > now}
        for e in new:
            old = keep.get(e.machine)
            keep[e.machine] = e if old is None or e.until >= old.until else old
        return list(keep.values())

    def struck(self, rec, now: float | None = None) -> set[str]:
        """The hosts of run record ``rec`` that hold a strike from an earlier run (lost in it, within
        :data:`STRIKE_S`): for :func:`clusterddp.policy.after_failure`. A damaged file gives none."""
        now = time.time() if now is None else now
        try:
            strikes = self.strikes()
        except QuarantineError:
            return set()
        marked = {k.machine for k in strikes if k.at + STRIKE_S > now and k.run_id != rec.run_id}
        return {n.host for n in rec.nodes if machine(n.settings.address, n.settings.port) in marked}

    def after(self, run_id: str, lost: dict[str, str], kept: Iterable[str], seconds: float,
              now: float | None = None, at_once: dict[str, tuple[str, str]] | None = None,
              again: dict[str, tuple[str, str]] | None = None, slow: dict[str, str] | None = None) -> list[Entry]:
        """:func:`decide` for run ``run_id``, its result written; the entries added."""
        with self._locked():
            now = time.time() if now is None else now
            entries, strikes = self._read()
            added, left = decide(lost, kept, strikes, run_id, now, seconds, at_once, again, slow)
            if added or left != strikes:
                self._write(self._merged(entries, added, now), left)
            return added

    def after_slow(self, run_id: str, slow: dict[str, str], seconds: float, now: float | None = None) -> list[Entry]:
        """:func:`strike_slow` for run ``run_id``, its result written; the entries added."""
        with self._locked():
            now = time.time() if now is None else now
            entries, strikes = self._read()
            aside = {e.machine for e in entries if e.run_id == run_id}  # set aside by this run already
            added, left = strike_slow({m: h for m, h in slow.items() if m not in aside}, strikes, run_id, now, seconds)
            if added or left != strikes:
                self._write(self._merged(entries, added, now), left)
            return added

    def release(self, who: str) -> list[Entry]:
        """Let ``who`` back (an inventory name as recorded, ``address`` or ``address:port``); the entries removed."""
        with self._locked():
            now = time.time()
            entries, strikes = self._read()
            entries = [e for e in entries if e.until > now]
            gone = [e for e in entries if who in (e.host, e.machine, e.machine.rsplit(":", 1)[0])]
            if gone:
                self._write([e for e in entries if e not in gone], strikes)
            return gone

    def _read(self) -> tuple[list[Entry], list[Strike]]:
        try:
            data, _ = files.read_bounded(self.path, MOST_BYTES, nofollow=True)
        except FileRefused as e:
            if e.reason == "missing":
                return [], []
            raise QuarantineError(f"{self.path}: {e.problem}", f"fix or remove {self.path}") from None
        return parse(data, str(self.path))

    def _write(self, entries: Iterable[Entry], strikes: Iterable[Strike] = ()) -> None:
        try:
            files.write_private(self.path, render(entries, strikes))
        except OSError as e:
            raise QuarantineError(f"cannot write {self.path}: {e.strerror or e}",
                                  f"make {self.path.parent} writable, or set XDG_STATE_HOME elsewhere") from None

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """The quarantine lock, held for a ``with`` block (polled: a hung holder cannot hang us for ever)."""
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            f = open(self.path.parent / "quarantine.lock", "a+b")
        except OSError as e:
            raise QuarantineError(f"cannot use {self.path.parent}: {e.strerror or e}",
                                  "make it writable, or set XDG_STATE_HOME to a folder that is") from None
        with f:
            files.lock_polled(f, time.monotonic() + LOCK_WAIT_S, lambda: QuarantineError(
                f"{self.path}: another clusterddp has held its lock for {LOCK_WAIT_S:.0f}s", "try again"))
            yield
