"""A node's sample file (``$CTL/metrics.jsonl``, written by :mod:`clusterddp.node.sampler`), read back.

Everything in it came from a node and is untrusted: :func:`parse` reads at most :data:`MOST` bytes, takes
each line that is a JSON object of the sampler's shape and drops the rest (counted: ``bad``), a line cut
mid-way included, keeps numbers only when finite (NaN, inf and 1e400 are dropped and counted:
``not_finite``), and bounds names, GPUs, ranks and metrics. It never raises. An event line (the idle policy
found the run idle: :class:`IdleFound`) is kept apart from the samples.

The files come back with the run (:func:`fetch_command`, :func:`save`): ``<run>/metrics/<host>/samples.jsonl``
for the host's last attempt and ``attempt-<N>.jsonl`` for an earlier attempt N on the same host (a spare's
samples are under its own name).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ..nodescript import SAMPLES, qpath

MOST = 8 << 20            # bytes of one sample file read (the sampler keeps it under 2 MiB)
MAX_LINE = 64 << 10       # bytes of one line; longer lines are dropped
MAX_GPUS = 64
MAX_METRICS = 32
MAX_RANKS = 256
MARK = "CLUSTERDDP_SAMPLES"  # in fetch_command's answer: the line before each file
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]{0,63}$")
HOST_FIELDS = ("cpu", "mem", "mem_total", "net_rx", "net_tx", "disk_r", "disk_w")
GPU_FIELDS = ("util", "mem", "mem_total", "power", "temp", "sm_clock")


@dataclass(frozen=True)
class Sample:
    """One sample: ``t`` (node clock, epoch seconds), ``dt`` (seconds it covers), ``progress`` (progress lines
    in it), the host's numbers, each GPU's (by index), the parsed metrics, and each rank's."""

    t: float
    dt: float
    progress: int
    host: dict[str, float] = field(default_factory=dict)
    gpus: dict[int, dict[str, float]] = field(default_factory=dict)
    throttle: dict[int, int] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    ranks: dict[int, dict[str, float]] = field(default_factory=dict)

    @property
    def rate(self) -> float | None:
        """Progress lines a second."""
        return self.progress / self.dt if self.dt > 0 else None


@dataclass(frozen=True)
class IdleFound:
    """The sampler's event line when the idle policy found the run idle: when (node clock, epoch seconds),
    the policy (``below`` %, ``seconds``, ``stop``), the run's nodes and the node that decided."""

    t: float
    below: float
    seconds: float
    stop: bool
    nnodes: int
    decided_by: str | None

    def to_json(self) -> dict:
        return {"at": self.t, "below": self.below, "seconds": self.seconds, "stop": self.stop,
                "nnodes": self.nnodes, "decided_by": self.decided_by}


MAX_EVENTS = 16  # event lines kept a file (the sampler writes one)


def parse_idle(rec: dict) -> IdleFound | None:
    """An event line's object (``{"event": "idle", "t": ..., "idle": {...}}``), checked; None when it is not one."""
    d = rec.get("idle")
    if rec.get("event") != "idle" or not isinstance(d, dict):
        return None
    count = _Count()
    t, below, seconds = count.num(rec.get("t")), count.num(d.get("below")), count.num(d.get("seconds"))
    nnodes, by = d.get("nnodes"), d.get("decided_by")
    if t is None or t < 0 or below is None or not 0 <= below <= 100 or seconds is None or not 0 <= seconds < 1e9:
        return None
    if not (type(nnodes) is int and 1 <= nnodes < 1 << 20):
        return None
    by = by if isinstance(by, str) and NAME_OK.match(by) else None
    return IdleFound(t, below, seconds, d.get("stop") is True, nnodes, by)


@dataclass(frozen=True)
class NodeSamples:
    """One host's samples of one attempt, and what was wrong with its file."""

    host: str
    attempt: int | None            # None: the host's last attempt
    samples: tuple[Sample, ...] = ()
    interval: float | None = None
    bad: int = 0                   # lines that were not a sample (garbage, cut mid-way, too long)
    not_finite: int = 0            # numbers dropped for being NaN, inf or out of range
    cut: bool = False              # the file was longer than MOST: the rest was not read
    idle: tuple[IdleFound, ...] = ()  # the idle policy found the run idle (its event line)

    @property
    def key(self) -> str:
        """The series' name: the host, ``host@attempt-N`` for an earlier attempt."""
        return self.host if self.attempt is None else f"{self.host}@attempt-{self.attempt}"

    def notes(self) -> list[str]:
        out = []
        if self.bad:
            out.append(f"{self.key}: {self.bad} line(s) of its sample file were not samples and were skipped")
        if self.not_finite:
            out.append(f"{self.key}: {self.not_finite} value(s) were NaN, infinite or out of range and are not shown")
        if self.cut:
            out.append(f"{self.key}: its sample file was longer than {MOST >> 20} MiB; the rest was not read")
        return out


class _Count:
    def __init__(self) -> None:
        self.not_finite = 0

    def num(self, v: object) -> float | None:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        try:
            f = float(v)
        except OverflowError:  # an int past a float's range
            self.not_finite += 1
            return None
        if not math.isfinite(f):
            self.not_finite += 1
            return None
        return f

    def named(self, d: object, most: int) -> dict[str, float]:
        out: dict[str, float] = {}
        if not isinstance(d, dict):
            return out
        for k, v in list(d.items())[:most * 4]:
            if isinstance(k, str) and NAME.match(k) and len(out) < most:
                f = self.num(v)
                if f is not None:
                    out[k] = f
        return out


def _constant(name: str) -> float:
    return math.nan  # NaN, Infinity, -Infinity in the file: counted as not finite where a number was wanted


def parse_sample(line: bytes, count: _Count | None = None) -> Sample | None:
    """One line as a :class:`Sample`, or None when it is not one."""
    count = count or _Count()
    if len(line) > MAX_LINE:
        return None
    try:
        rec = json.loads(line.decode("utf-8"), parse_constant=_constant)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(rec, dict) or "t" not in rec:
        return None
    t, dt = count.num(rec.get("t")), count.num(rec.get("dt"))
    progress = rec.get("progress")
    if t is None or dt is None or dt < 0 or not (type(progress) is int and 0 <= progress < 1 << 40):
        return None
    host = {k: f for k in HOST_FIELDS if k in rec and (f := count.num(rec[k])) is not None}
    gpus: dict[int, dict[str, float]] = {}
    throttle: dict[int, int] = {}
    raw = rec.get("gpus")
    for g in raw[:MAX_GPUS] if isinstance(raw, list) else ():
        if not isinstance(g, dict) or type(g.get("index")) is not int or not 0 <= g["index"] < 1024:
            continue
        gpus[g["index"]] = {k: f for k in GPU_FIELDS if k in g and (f := count.num(g[k])) is not None}
        if type(g.get("throttle")) is int and 0 <= g["throttle"] < 1 << 64:
            throttle[g["index"]] = g["throttle"]
    ranks: dict[int, dict[str, float]] = {}
    raw = rec.get("ranks")
    if isinstance(raw, dict):
        for r, v in list(raw.items())[:MAX_RANKS]:
            if isinstance(r, str) and r.isascii() and r.isdigit() and len(r) < 8:
                ranks[int(r)] = count.named(v, MAX_METRICS)
    return Sample(t, dt, progress, host, gpus, throttle, count.named(rec.get("m"), MAX_METRICS), ranks)


def parse(data: bytes, host: str, attempt: int | None = None) -> NodeSamples:
    """A sample file's bytes (see the module docstring). Never raises."""
    cut = len(data) > MOST
    data = data[:MOST]
    lines = data.split(b"\n")
    if not data.endswith(b"\n"):
        lines.pop()  # a line cut mid-way (a running sampler, a short read): not a sample yet
    count, samples, bad, interval = _Count(), [], 0, None
    idle: list[IdleFound] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        if line.startswith(b'{"event": ') and len(line) <= MAX_LINE:
            found = _event(line)
            if found is None:
                bad += 1
            elif len(idle) < MAX_EVENTS:
                idle.append(found)
            continue
        if i == 0 and b'"clusterddp-samples"' in line[:4096]:
            try:
                head = json.loads(line.decode("utf-8"))
                v = head.get("interval") if isinstance(head, dict) else None
                interval = float(v) if isinstance(v, (int, float)) and 0 < v < 1e6 else None
            except (ValueError, UnicodeDecodeError, RecursionError):
                pass
            continue
        s = parse_sample(line, count)
        if s is None:
            bad += 1
        else:
            samples.append(s)
    if not data.endswith(b"\n") and data:
        bad += 1
    samples.sort(key=lambda s: s.t)
    return NodeSamples(host, attempt, tuple(samples), interval, bad, count.not_finite, cut,
                       tuple(sorted(idle, key=lambda e: e.t)))


def _event(line: bytes) -> IdleFound | None:
    try:
        rec = json.loads(line.decode("utf-8"), parse_constant=_constant)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return parse_idle(rec) if isinstance(rec, dict) else None


# ---- where they are kept ----

DIR = "metrics"
LAST = "samples.jsonl"
ATTEMPT = re.compile(r"^attempt-([0-9]{1,4})\.jsonl$")


def load_run(run_dir: Path) -> list[NodeSamples]:
    """Every sample file kept in ``run_dir`` (``metrics/<host>/``), earlier attempts first, by host."""
    base = run_dir / DIR
    out: list[NodeSamples] = []
    try:
        hosts = sorted(p for p in base.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return out
    for d in hosts:
        for f in sorted(d.iterdir()):
            m = ATTEMPT.match(f.name)
            if f.name != LAST and not m:
                continue
            try:
                with open(f, "rb") as fh:
                    data = fh.read(MOST + 1)
            except OSError:
                continue
            out.append(parse(data, d.name, int(m.group(1)) if m else None))
    out.sort(key=lambda n: (n.attempt is None, n.attempt or 0, n.host))
    return out


def fetch_command(control_dir: str) -> str:
    """A node's sample files, its last attempt's and earlier attempts' on the same host (their control folders
    moved to ``<control>@attempt-N``), each after a ``CLUSTERDDP_SAMPLES <folder>`` line, at most MOST bytes."""
    ctl = qpath(control_dir)
    return (f"for f in {ctl}/{SAMPLES} {ctl}@attempt-*/{SAMPLES}; do [ -f \"$f\" ] || continue; "
            f"d=${{f%/*}}; echo \"{MARK} ${{d##*/}}\"; head -c {MOST} \"$f\"; echo; done")


def split_answer(data: bytes, host: str) -> dict[int | None, bytes]:
    """:func:`fetch_command`'s answer: each file's bytes by attempt (None: the last). ``host``: the name of
    the node's control folder (its host's name; ``node`` for `up local`). Untrusted: a marker line naming
    no folder of ``host`` is skipped with what follows it."""
    out: dict[int | None, bytes] = {}
    current: int | None | bool = False  # False: no file being read
    chunks: dict[int | None, list[bytes]] = {}
    for line in data.split(b"\n"):
        if line.startswith(MARK.encode() + b" "):
            name = line[len(MARK) + 1:].decode("utf-8", "replace").strip()
            if name == host:
                current = None
            elif name.startswith(host + "@attempt-") and name[len(host) + 9:].isdigit():
                current = int(name[len(host) + 9:][:6])
            else:
                current = False
            if current is not False:
                chunks[current] = []
            continue
        if current is not False:
            chunks[current].append(line)
    for k, parts in chunks.items():
        out[k] = b"\n".join(parts).rstrip(b"\n") + b"\n" if any(parts) else b""
    return out


def save(run_dir: Path, host: str, files: dict[int | None, bytes]) -> list[Path]:
    """``files`` (from :func:`split_answer`) kept under ``run_dir/metrics/<host>/``, 0600 in 0700 folders."""
    from ..files import write_private
    if not NAME_OK.match(host):
        return []
    d = run_dir / DIR / host
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    out = []
    for attempt, data in files.items():
        p = d / (LAST if attempt is None else f"attempt-{attempt}.jsonl")
        write_private(p, data, fsync=False)
        out.append(p)
    return out


NAME_OK = re.compile(r"^[A-Za-z0-9_.:-]{1,255}$")  # a host name as a folder name (never .. or a slash)


def hosts_with_files(run_dir: Path) -> Iterable[str]:
    try:
        return sorted(p.name for p in (run_dir / DIR).iterdir() if p.is_dir())
    except OSError:
        return []
