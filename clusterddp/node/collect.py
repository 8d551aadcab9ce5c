"""``collect``: the node program that sends a run's log and files, and the launcher's receiver.

One command per node (``plan.collect_command``), so a collect pays for one remote shell (whose
rc files may take a noticeable time) whatever the number of files. :func:`main` reads a JSON
request on stdin, {"globs": [...] or "paths": [...], "have": {path: size of the local copy},
"log": bool}, and answers on stdout with JSON header lines, some followed by raw bytes:

  {"log": n} + n bytes               the node log
  {"samples": folder, "attempt": N or null, "size": n} + n bytes   a sampler's metrics.jsonl, and
  {"where": folder, "size": n} + n bytes                           the rank sampler's where.jsonl: with
                                     "samples": [folder, ...] in the request (``.``: the log's folder;
                                     :func:`send_samples`), before the file list
  {"file": path, "size": n}          one line per file it will go through (regular files reached
                                     through no link, outside .clusterddp), in order
  {"files": count}                   the end of that list
  {"path", "send": n} + n bytes, then {"path", "sha256", "stable"}   a file whose local copy differs in size
  {"path", "sha256", "stable"}       a file whose local copy has its size: only its hash
  {"path", "error"}                  a listed file it could not read
  {"error"}                          a glob or path it refused, or files beyond MAX_FILES
  {"tick": 1}                        keeps the stream alive while it hashes or looks for files

With "list": true in the request (the checkpoint mirror's look, clusterddp.mirror) the answer is the
file list alone, each line with the file's modification time, and nothing is read or hashed:
  {"file": path, "size": n, "mtime": ns} ... {"files": count}
With "mtimes": true the file lines of a fetch carry "mtime" too (the time of the copy sent: "stable"
says it did not change while read). "quiet": n (ns) reports unstable a file modified less than n ns
before it was opened (a writer may only be pausing: the checkpoint mirror takes no such copy).
"written": true leaves out, of a glob's matches, the files not modified since the script's folder was
unpacked into the run folder (``.clusterddp/unpack/done``): what the job wrote, not what it was sent.

"stable" is false when the file changed while it was read (a job still writing it). A file
that shrank while sent is padded to its announced size so the framing holds; it is unstable.

Paths are relative to the run folder, normalised (no empty, ``.`` or ``..`` part) and reached
through no symbolic link: globs are matched by walking real directories only (``glob`` would
follow a ``checkpoints/dataset -> /`` link), and each file is opened one directory at a time
with ``O_NOFOLLOW``, so a link swapped in after the listing is refused too.

:class:`Receiver` takes that answer on the launcher, chunk by chunk as it arrives, and trusts
none of it: every header is checked (shape, types, sizes, paths, order, line length, number of
files) against the limits below, which the node program keeps too. A bad entry (a path it must
not write, a local write that fails) is skipped and reported with the reason, and the files
after it still arrive; a header that breaks the protocol ends the answer with
:class:`StreamError`, and every listed file not received by then is reported missing.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # for type checkers only: see clusterddp/node/__init__.py
    from pathlib import Path
    from typing import BinaryIO, Callable

CONTROL = ".clusterddp"  # the run's control folder (plan.CONTROL): never sent
BUF = 1 << 20

# Limits both ends keep. A path longer than PATH_MAX cannot be opened anyway; a header line
# holds at most one path, JSON-escaped (6 bytes a character at worst), and a short error text.
MAX_PATH = 4096                # bytes of a path, encoded
MAX_LINE = 64 << 10            # bytes of a header line
MAX_FILES = 100000             # files in one answer
MAX_LISTED = 32 << 20          # characters of all listed paths together
MAX_SIZE = 1 << 50             # bytes of one file or of the log (1 PiB)
MAX_NOTES = 100                # {"error"} lines in one answer
MAX_TEXT = 1000                # characters of an error text the node sends
HEX = frozenset("0123456789abcdef")

# The samplers' files, sent with the log when asked ("samples"), so that the end of a run costs one command
# a node. The bounds are the launcher's readers' (tests/node/test_node_collect.py holds them equal).
SAMPLES_FILE = "metrics.jsonl"   # the metrics sampler's (nodescript.SAMPLES; clusterddp.metrics.samples)
WHERE_FILE = "where.jsonl"       # the rank sampler's (nodescript.WHERE_SAMPLES; clusterddp.stragglers)
SAMPLES_MOST = 8 << 20           # bytes of one metrics.jsonl sent (clusterddp.metrics.samples.MOST)
SAMPLES_BUDGET = 4 * (SAMPLES_MOST + 4096)  # bytes of one folder's metrics.jsonl files together
WHERE_MOST = 8 << 20             # bytes of a where.jsonl sent (clusterddp.node.where.PARSE_MOST)
MAX_SAMPLE_FILES = 100           # metrics.jsonl files of one folder (its attempts')
MAX_SAMPLE_FOLDERS = 1024        # folders asked for in one request (a Slurm job's nodes)
MAX_ATTEMPT = 9999               # ``<folder>@attempt-N``: N at most (clusterddp.metrics.samples.ATTEMPT)


def path_problem(p: object) -> str | None:
    """Why ``p`` may not name a collected file (None: it may): a str, relative, normalised,
    without NUL, at most MAX_PATH bytes, outside the control folder. Both ends check it."""
    if not isinstance(p, str):
        return "not a string"
    if not p:
        return "empty"
    if "\0" in p:
        return "contains NUL"
    if p.startswith("/"):
        return "absolute"
    try:
        n = len(os.fsencode(p))
    except UnicodeError:
        return "not a file name"
    if n > MAX_PATH:
        return "longer than %d bytes" % MAX_PATH
    parts = p.split("/")
    if ".." in parts:
        return "goes up with .."
    if "" in parts or "." in parts:
        return "not normalised"
    if parts[0] == CONTROL:
        return "in the control folder " + CONTROL
    return None


def glob_parts(pattern: str) -> list[str] | None:
    """A glob's parts, with empty and ``.`` parts dropped; None when it is absolute or has ``..``."""
    if pattern.startswith("/") or "\0" in pattern:
        return None
    parts = [c for c in pattern.split("/") if c not in ("", ".")]
    return None if ".." in parts or not parts else parts


def _magic(part: str) -> bool:
    return "*" in part or "?" in part or "[" in part


def _part_matches(part: str, name: str) -> bool:
    """One path part against one glob part, as ``glob`` does: a wildcard never matches a hidden name
    unless the glob part starts with a dot."""
    if not _magic(part):
        return part == name
    if name.startswith(".") and not part.startswith("."):
        return False
    import fnmatch
    return fnmatch.fnmatchcase(name, part)


def matches(parts: list[str], names: list[str]) -> bool:
    """Whether a path (its ``names``) matches a glob (its ``parts``, see :func:`glob_parts`), as
    ``glob(recursive=True)`` would list it: ``**`` is zero or more parts that are not hidden.
    Without recursion: a path may have thousands of parts."""
    def closure(at: set) -> set:
        todo = list(at)
        while todo:
            i = todo.pop()
            if i < len(parts) and parts[i] == "**" and i + 1 not in at:
                at.add(i + 1)
                todo.append(i + 1)
        return at
    at = closure({0})
    for name in names:
        nxt = set()
        for i in at:
            if i == len(parts):
                continue
            if parts[i] == "**":
                if not name.startswith("."):
                    nxt.add(i)
            elif _part_matches(parts[i], name):
                nxt.add(i + 1)
        at = closure(nxt)
        if not at:
            return False
    return len(parts) in at


class _TooMany(Exception):
    pass


def _walk(parts: list[str], found: dict, alive: Callable[[], None]) -> None:
    """Add to ``found`` ({path: stat}) the regular files under "." that ``parts`` match, going
    into real directories only (never through a link). A stack, not recursion: folders may nest deep."""
    def add(rel: str, st: os.stat_result) -> None:
        if rel not in found:
            if len(found) >= MAX_FILES:
                raise _TooMany()
            found[rel] = st

    def entries(rel: str) -> list[tuple[str, str, os.stat_result]]:
        alive()
        out = []
        try:
            with os.scandir(rel or ".") as it:
                for e in it:
                    child = rel + "/" + e.name if rel else e.name
                    if len(child) <= MAX_PATH:
                        try:
                            out.append((e.name, child, e.stat(follow_symlinks=False)))
                        except OSError:
                            pass
        except OSError:  # as glob: a folder it cannot read has no matches
            pass
        return out
    todo, seen = [("", 0)], set()
    while todo:
        rel, i = todo.pop()
        if (rel, i) in seen:  # "a/**/**/b" reaches a folder by several ways
            continue
        seen.add((rel, i))
        part, last = parts[i], i == len(parts) - 1
        if part == "**":
            if not last:
                todo.append((rel, i + 1))
            for name, child, st in entries(rel):
                if name.startswith("."):
                    continue
                if stat.S_ISDIR(st.st_mode):
                    todo.append((child, i))
                elif last and stat.S_ISREG(st.st_mode):
                    add(child, st)
            continue
        if _magic(part):
            kids = [(child, st) for name, child, st in entries(rel) if _part_matches(part, name)]
        else:
            child = rel + "/" + part if rel else part
            try:
                kids = [(child, os.lstat(child))]
            except (OSError, ValueError):
                kids = []
        for child, st in kids:
            if last and stat.S_ISREG(st.st_mode):
                add(child, st)
            elif not last and stat.S_ISDIR(st.st_mode):
                todo.append((child, i + 1))


def _lstat_beneath(p: str) -> os.stat_result | None:
    """The stat of regular file ``p`` if every folder on its way is a real folder (no link); else None."""
    parts = p.split("/")
    try:
        for i in range(1, len(parts)):
            if not stat.S_ISDIR(os.lstat("/".join(parts[:i])).st_mode):
                return None
        st = os.lstat(p)
    except (OSError, ValueError):
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def _open_beneath(root: int, p: str):
    """Open regular file ``p`` below folder ``root`` one part at a time, following no link."""
    parts = p.split("/")
    fd = os.dup(root)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        # O_NONBLOCK: a FIFO swapped in after the listing must not hang the open
        f = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0), dir_fd=fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(f).st_mode):
        os.close(f)
        raise OSError("not a regular file")
    return os.fdopen(f, "rb")


def folder_problem(name: object) -> str | None:
    """Why ``name`` may not name a folder of samples (None: it may): ``.`` (the log's own folder) or a
    relative, normalised path below it, without NUL, at most MAX_PATH bytes. Both ends check it."""
    if name == ".":
        return None
    if not isinstance(name, str) or not name or "\0" in name or name.startswith("/"):
        return "not a relative folder"
    try:
        if len(os.fsencode(name)) > MAX_PATH:
            return "longer than %d bytes" % MAX_PATH
    except UnicodeError:
        return "not a file name"
    if any(p in ("", ".", "..") for p in name.split("/")):
        return "not normalised"
    return None


def _read_most(path: str, most: int) -> bytes | None:
    """At most ``most`` bytes of the regular file at ``path`` (reached through no link at its end); None
    when there is none. Read whole before it is announced: a sampler may still be writing it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            return f.read(most)
    except OSError:
        return None


def _attempts(folder: str) -> list:
    """The earlier attempts' folders beside ``folder`` (``<folder>@attempt-N``): (N, path), newest first."""
    parent, base = os.path.split(folder.rstrip("/"))
    out = {}  # type: dict
    try:
        names = os.listdir(parent or ".")
    except OSError:
        return []
    for name in names:
        tail = name[len(base) + 9:]
        if name.startswith(base + "@attempt-") and tail.isdigit() and len(tail) <= 4 and tail.isascii():
            n = int(tail)
            if 0 < n <= MAX_ATTEMPT and n not in out:
                out[n] = os.path.join(parent, name)
    return sorted(out.items(), reverse=True)


def send_samples(log_dir: str, asked: list, emit: Callable[..., None], write: Callable[[bytes], object]) -> None:
    """The samplers' files of each asked folder (:func:`folder_problem`; ``.``: ``log_dir`` itself):
    ``{"samples": folder, "attempt": N or null, "size": n}`` + n bytes for its metrics.jsonl and each
    earlier attempt's (newest first, within SAMPLES_BUDGET), ``{"where": folder, "size": n}`` + n bytes
    for its where.jsonl. A file that is not there is not named."""
    seen = set()
    for name in asked[:MAX_SAMPLE_FOLDERS]:
        if folder_problem(name) is not None or name in seen:
            continue
        seen.add(name)
        folder = log_dir if name == "." else os.path.join(log_dir, name)
        budget, files = SAMPLES_BUDGET, 0
        for attempt, d in [(None, folder)] + _attempts(folder):
            if budget <= 0 or files >= MAX_SAMPLE_FILES:
                break
            data = _read_most(os.path.join(d, SAMPLES_FILE), min(SAMPLES_MOST, budget))
            if data is not None:
                emit(samples=name, attempt=attempt, size=len(data))
                write(data)
                budget, files = budget - len(data), files + 1
        data = _read_most(os.path.join(folder, WHERE_FILE), WHERE_MOST)
        if data is not None:
            emit(where=name, size=len(data))
            write(data)


def main(argv: list[str], stdin=None, stdout=None) -> int:
    """argv: the run folder, the node log. Request from ``stdin``, answer to ``stdout`` (binary);
    the process's own when not given."""
    run_dir, log_path = argv
    req = json.load(stdin if stdin is not None else sys.stdin)
    if stdout is None:
        stdout = sys.stdout.buffer
        try:  # a 1 MiB pipe to sshd: this side hashes the next chunk while sshd sends the last
            import fcntl
            fcntl.fcntl(1, 1031, BUF)  # F_SETPIPE_SZ (Linux); elsewhere, or over the limit: keep the default
        except (ImportError, OSError):
            pass
    out = stdout
    last = [time.monotonic()]

    def emit(**rec: object) -> None:
        out.write(json.dumps(rec).encode() + b"\n")

    def alive() -> None:
        if time.monotonic() - last[0] > 5:
            emit(tick=1)
            out.flush()
            last[0] = time.monotonic()
    buf = memoryview(bytearray(BUF))  # one buffer for every read: no allocation per MiB

    def send(f, size: int, h=None, write: bool = True) -> int:
        """Read ``size`` bytes of ``f`` into ``h`` and, if ``write``, out; return how many it read.
        What is written is padded with zeros to ``size`` if the file shrank, so the framing holds
        (the file is reported unstable)."""
        n = 0
        while n < size:
            b = buf[:f.readinto(buf[:min(len(buf), size - n)])]
            if not b:
                break
            if h is not None:
                h.update(b)
            if write:
                out.write(b)
            else:
                alive()
            n += len(b)
        padded = n
        while write and padded < size:
            k = min(len(buf), size - padded)
            out.write(bytes(k))
            padded += k
        return n
    if req.get("log"):
        try:
            with open(log_path, "rb") as f:
                size = os.fstat(f.fileno()).st_size  # what is there now: the job may still write
                emit(log=size)
                send(f, size)
        except OSError:
            pass
    if isinstance(req.get("samples"), list):  # the samplers' files: in the log's folder, or below it (Slurm)
        send_samples(os.path.dirname(log_path), req["samples"], emit, out.write)
    os.chdir(run_dir)
    root = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    files = {}  # type: dict
    try:
        if req.get("paths"):
            for p in req["paths"]:
                why = path_problem(p)
                st = None if why else _lstat_beneath(p)
                if why:
                    emit(error=("path %r refused: %s" % (p, why))[:MAX_TEXT])
                elif st is not None and p not in files and len(files) < MAX_FILES:
                    files[p] = st
        else:
            more = False
            for pat in req.get("globs", []):
                parts = glob_parts(pat)
                if parts is None:
                    emit(error=("collect glob %r refused: it must be relative to the run folder, without .."
                                % pat)[:MAX_TEXT])
                    continue
                found = {}  # type: dict
                try:
                    _walk(parts, found, alive)
                except _TooMany:
                    more = True
                for p in sorted(found):
                    if p not in files and path_problem(p) is None:
                        if len(files) >= MAX_FILES:
                            more = True
                            break
                        files[p] = found[p]
            if more:
                emit(error="more than %d files match the collect globs; only %d are sent: narrow the globs"
                     % (MAX_FILES, MAX_FILES))
        if req.get("written") and not req.get("paths"):
            try:
                since = os.stat(os.path.join(CONTROL, "unpack", "done")).st_mtime_ns
            except OSError:
                since = None
            if since is not None:
                files = {p: st for p, st in files.items() if st.st_mtime_ns > since}
        listing = bool(req.get("list"))
        mtimes = listing or bool(req.get("mtimes"))
        quiet = req.get("quiet")
        quiet = quiet if type(quiet) is int and quiet > 0 else 0  # noqa: E721
        for p, st in files.items():
            if mtimes:
                emit(file=p, size=st.st_size, mtime=st.st_mtime_ns)
            else:
                emit(file=p, size=st.st_size)
        emit(files=len(files))
        for p, st in ([] if listing else files.items()):
            want = req["have"].get(p) != st.st_size
            try:
                f = _open_beneath(root, p)
            except OSError as e:
                emit(path=p, error=str(e)[:MAX_TEXT])
                continue
            with f:
                opened = time.time_ns()
                h = hashlib.sha256()
                if want:
                    emit(path=p, send=st.st_size)
                n = send(f, st.st_size, h, write=want)
                now = os.fstat(f.fileno())
            same = [(s.st_ino, s.st_size, s.st_mtime_ns) for s in (st, now)]
            emit(path=p, sha256=h.hexdigest(),
                 stable=n == st.st_size and same[0] == same[1] and opened - st.st_mtime_ns >= quiet)
    finally:
        os.close(root)
    out.flush()
    return 0


# ---- launcher side ----

def sha256_file(path: Path, size: int | None = None) -> str:
    """The sha256 of the file at ``path``, or of its first ``size`` bytes (all there are, if fewer)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while size is None or size > 0:
            b = f.read(BUF if size is None else min(BUF, size))
            if not b:
                break
            h.update(b)
            if size is not None:
                size -= len(b)
    return h.hexdigest()


class StreamError(Exception):
    """A node's answer broke the protocol: the message says how. Nothing after it is read."""


def _shown(p: object) -> str:
    """A refused path, short enough to report."""
    s = p if isinstance(p, str) else repr(p)
    return s if len(s) <= 200 else s[:200] + "..."


def _size(rec: dict, key: str) -> int:
    v = rec[key]
    if type(v) is not int or not 0 <= v <= MAX_SIZE:  # noqa: E721 - a bool is not a size
        raise StreamError("%s: %s is not a size (0 to %d)" % (key, _shown(repr(v)), MAX_SIZE))
    return v


def _text(rec: dict, key: str) -> str:
    v = rec[key]
    if not isinstance(v, str):
        raise StreamError("%s: not a string" % key)
    return v[:MAX_TEXT]


def _refuse_constant(name: str) -> object:
    raise ValueError("%s is not a number here" % name)


# The header lines, by their keys.
_LOG, _FILE, _FILES = frozenset({"log"}), frozenset({"file", "size"}), frozenset({"files"})
_LISTED = frozenset({"file", "size", "mtime"})  # a file line of a "list" answer
_SEND, _HASH = frozenset({"path", "send"}), frozenset({"path", "sha256", "stable"})
_FAILED, _NOTE, _TICK = frozenset({"path", "error"}), frozenset({"error"}), frozenset({"tick"})
_SAMPLE, _WHERE = frozenset({"samples", "attempt", "size"}), frozenset({"where", "size"})


class Receiver:
    """Takes one node's answer to :func:`main` chunk by chunk (:meth:`feed`), as it arrives, then
    :meth:`finish` once the answer has ended.

    A sent file is hashed into ``<dest(path)>.<random>.part`` and renamed to ``dest(path)`` only when its
    size and hash agree with the node's; a file sent only as a hash is compared with the local
    copy at ``dest(path)``. ``on_total(bytes)`` is called once the node has listed its files,
    ``on_bytes(n)`` as they are received or compared.

    ``request`` (the one sent to the node) lets it refuse a listed file that was not asked for.
    Files not brought back are in ``missing`` as (path, why); a bad answer as a whole makes
    :meth:`feed` raise :class:`StreamError` (and again on every later call).
    """

    def __init__(self, dest: Callable[[str], Path], on_total: Callable[[int], object] = lambda n: None,
                 on_bytes: Callable[[int], object] = lambda n: None, request: dict | None = None,
                 clock: Callable[[], float] = time.monotonic, log_to: BinaryIO | None = None) -> None:
        self.dest, self.on_total, self.on_bytes, self.clock = dest, on_total, on_bytes, clock
        self.log_to = log_to  # the node log is written there as it comes (never held whole); else dropped
        self.log: int | None = None  # the node log's size, once wholly received
        self.fetched: list[str] = []
        self.whole: list[str] = []
        self.skipped: list[str] = []
        self.differ: list[str] = []  # same size here, another hash on the node: fetch again
        self.missing: list[tuple[str, str]] = []  # (path, why) of each file not brought back
        self.errors: list[str] = []  # about the answer as a whole
        self.bytes = 0
        self.digests: dict[str, str] = {}  # the sha256 of each fetched file, as the node's and this copy's agree
        self.listing: dict[str, tuple[int, int]] = {}  # with mtimes (a "list"): path -> (size, mtime in ns)
        # the samplers' files, by folder as asked: metrics.jsonl by attempt (None: the last), where.jsonl
        self.samples: dict[str, dict[int | None, bytes]] = {}
        self.where: dict[str, bytes] = {}
        asked = request.get("samples") if request is not None else None
        self._sample_folders = {f for f in asked if folder_problem(f) is None} if isinstance(asked, list) else set()
        self._sample: tuple[str, int | None] | None = None  # the sample file being received: (folder, attempt)
        self._sample_buf = bytearray()
        self._sample_bytes: dict[str, int] = {}  # metrics.jsonl bytes received, by folder
        self._list_only = bool(request is not None and request.get("list"))
        self._mtimes = self._list_only or bool(request is not None and request.get("mtimes"))
        self.broken: str | None = None
        self._globs: list[list[str]] | None = None
        self._paths: set | None = None
        self._named = []  # type: list  # (glob as asked, its parts) of each glob the node walks
        self._matched = set()  # type: set  # those of them that some listed file matched
        if request is not None and request.get("paths"):
            self._paths = set(request["paths"])
        elif request is not None:
            self._named = [(p, g) for p, g in ((p, glob_parts(p)) for p in request.get("globs", [])) if g]
            self._globs = [g for _, g in self._named]
        self._started = clock()
        self._ticks = 0
        self._line = bytearray()
        self._want = 0  # raw bytes still to come after the last header
        self._sink: Callable[[memoryview], object] = lambda b: None
        self._log: int | None = None  # bytes of the log being received, so far
        self._stage = "start"  # start -> list -> files
        self._listed: dict[str, int] = {}  # every listed path (refused ones too): its size
        self._listed_chars = 0
        self._count = 0  # files listed
        self._refused: set[str] = set()
        self._said: set[str] = set()  # listed files the node has sent, hashed or failed
        self._notes = 0
        # The file being received: (path, size, tmp file or None when skipped, open file, hash)
        self._file: tuple[str, int, Path | None, BinaryIO | None, object] | None = None
        self._hash_due: str | None = None  # a sent file whose sha256 line comes next

    # ---- framing ----
    def feed(self, chunk: bytes) -> None:
        if self.broken is not None:
            raise StreamError(self.broken)
        try:
            self._feed(chunk)
        except StreamError as e:
            self._break(str(e))
            raise

    def _feed(self, chunk: bytes) -> None:
        view, i = memoryview(chunk), 0
        while i < len(chunk):
            if self._want:
                n = min(self._want, len(chunk) - i)
                self._sink(view[i:i + n])
                self._want -= n
                i += n
                if not self._want:
                    self._payload_done()
                continue
            room = MAX_LINE - len(self._line)
            j = chunk.find(b"\n", i, i + room + 1)
            if j < 0:
                if len(chunk) - i > room:
                    raise StreamError("a header line longer than %d bytes" % MAX_LINE)
                self._line += view[i:]
                return
            self._line += view[i:j]
            i = j + 1
            rec = self._parse(bytes(self._line))
            self._line.clear()
            self._record(rec)

    @staticmethod
    def _parse(line: bytes) -> dict:
        try:
            rec = json.loads(line.decode("utf-8"), parse_constant=_refuse_constant)
        except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            raise StreamError("not a JSON header line (%s): %s" % (type(e).__name__, _shown(line[:80]))) from None
        if not isinstance(rec, dict):
            raise StreamError("a header line that is not a JSON object: %s" % _shown(line[:80]))
        return rec

    def _break(self, why: str) -> None:
        self.broken = why
        self._close_part()

    # ---- headers ----
    def _record(self, rec: dict) -> None:
        keys = frozenset(rec)
        if keys == _TICK:
            self._tick(rec)
        elif keys == _NOTE:
            self._notes += 1
            if self._notes > MAX_NOTES:
                raise StreamError("more than %d error lines" % MAX_NOTES)
            self.errors.append("the node says: " + _text(rec, "error"))
        elif self._hash_due is not None:
            if keys != _HASH:
                raise StreamError("expected the sha256 line of %s, got keys %s" % (_shown(self._hash_due),
                                                                                  sorted(keys)))
            self._hashed(rec)
        elif keys in (_SAMPLE, _WHERE) and self._stage == "start" and self._sample_folders:
            self._samples_header(rec, keys == _WHERE)
        elif (keys == _LOG and self._stage == "start" and self.log is None and self._log is None
              and not self.samples and not self.where):
            n = _size(rec, "log")
            self._log = 0
            self._sink, self._want = self._log_bytes, n
            if not n:
                self._payload_done()
        elif keys == (_LISTED if self._mtimes else _FILE) and self._stage in ("start", "list"):
            self._stage = "list"
            self._list(rec)
        elif keys == _FILES and self._stage in ("start", "list"):
            if _size(rec, "files") != self._count:
                raise StreamError("the file list ends with a count of %d, after %d files" % (rec["files"], self._count))
            self._stage = "files"
            self.on_total(sum(s for p, s in self._listed.items() if p not in self._refused))
        elif keys in (_SEND, _HASH, _FAILED) and self._stage == "files" and not self._list_only:
            path = self._pending(rec["path"])
            if keys == _SEND:
                self._send(path, rec)
            elif keys == _HASH:
                self._compare(path, rec)
            else:
                self._lose(path, "cannot read it on the node: " + _text(rec, "error"))
        else:
            raise StreamError("unexpected header with keys %s %s" % (_shown(repr(sorted(keys))), self._where()))

    def _samples_header(self, rec: dict, where: bool) -> None:
        """A sampler's file, before the file list: bounded as the node bounds it, named once."""
        folder = rec["where" if where else "samples"]
        if not isinstance(folder, str) or folder not in self._sample_folders:
            raise StreamError("samples of a folder not asked for: %s" % _shown(folder))
        size = _size(rec, "size")
        if where:
            if folder in self.where:
                raise StreamError("where.jsonl of %s sent twice" % _shown(folder))
            if size > WHERE_MOST:
                raise StreamError("where.jsonl of %s: %d bytes, over %d" % (_shown(folder), size, WHERE_MOST))
            self.where[folder] = b""
            self._sample = (folder, None)
            self._sink, self._want = self._where_bytes, size
        else:
            attempt = rec["attempt"]
            if attempt is not None and (type(attempt) is not int or not 0 < attempt <= MAX_ATTEMPT):  # noqa: E721
                raise StreamError("attempt: %s is not an attempt (1 to %d)" % (_shown(repr(attempt)), MAX_ATTEMPT))
            got = self.samples.setdefault(folder, {})
            if attempt in got:
                raise StreamError("the samples of %s (attempt %s) sent twice" % (_shown(folder), attempt))
            total = self._sample_bytes.get(folder, 0) + size
            if size > SAMPLES_MOST or total > SAMPLES_BUDGET or len(got) >= MAX_SAMPLE_FILES:
                raise StreamError("the samples of %s: over %d bytes a file, %d together or %d files"
                                  % (_shown(folder), SAMPLES_MOST, SAMPLES_BUDGET, MAX_SAMPLE_FILES))
            self._sample_bytes[folder] = total
            got[attempt] = b""
            self._sample = (folder, attempt)
            self._sink, self._want = self._sample_bytes_in, size
        self._sample_buf = bytearray()
        if not size:
            self._payload_done()

    def _sample_bytes_in(self, b: memoryview) -> None:
        self._sample_buf += b

    def _where_bytes(self, b: memoryview) -> None:
        self._sample_buf += b

    def _where(self) -> str:
        return {"start": "at the start", "list": "in the file list", "files": "after the file list"}[self._stage]

    def _tick(self, rec: dict) -> None:
        # The node ticks at most every 5 s; one a second since the start is already generous.
        self._ticks += 1
        if rec["tick"] != 1 or self._ticks > 10 + self.clock() - self._started:
            raise StreamError("more keep-alive lines than time has passed")

    def _list(self, rec: dict) -> None:
        path, size = rec["file"], _size(rec, "size")
        self._count += 1
        if self._count > MAX_FILES:
            raise StreamError("more than %d files listed" % MAX_FILES)
        why = path_problem(path)
        if why is None and not self._asked(path):
            why = "not asked for (matches no collect glob)"
        if why is not None:
            self.missing.append((_shown(path), "refused: " + why))
            if not (isinstance(path, str) and len(path) <= MAX_PATH):
                return  # no header may name it later
            self._refused.add(path)  # kept, so that its bytes, if sent, can be skipped
        if path in self._listed:
            raise StreamError("%s listed twice" % _shown(path))
        self._listed_chars += len(path)
        if self._listed_chars > MAX_LISTED:
            raise StreamError("the file list is longer than %d characters" % MAX_LISTED)
        self._listed[path] = size
        if self._mtimes:
            mtime = rec["mtime"]
            if type(mtime) is not int or not -(1 << 63) <= mtime < 1 << 63:  # noqa: E721 - a bool is not a time
                raise StreamError("mtime: %s is not a time in ns" % _shown(repr(mtime)))
            if why is None:
                self.listing[path] = (size, mtime)

    def _asked(self, path: str) -> bool:
        if self._paths is not None:
            return path in self._paths
        if self._globs is not None:
            names = path.split("/")
            hit = [glob for glob, g in self._named if matches(g, names)]
            self._matched.update(hit)
            return bool(hit)
        return True

    @property
    def unmatched(self) -> list | None:
        """The request's globs (as asked) that no file the node listed matches; None when that is not
        known: the node's file list did not come whole, or the request named paths, not globs. A glob
        the node refused is not among them (its refusal is in ``errors``)."""
        if self._globs is None or self._stage != "files":
            return None
        return [glob for glob, _ in self._named if glob not in self._matched]

    def _pending(self, path: object) -> str:
        """``path`` if it is listed and nothing final was said about it yet."""
        if not isinstance(path, str) or path not in self._listed:
            raise StreamError("%s is not in the file list" % _shown(path))
        if path in self._said:
            raise StreamError("%s sent twice" % _shown(path))
        self._said.add(path)
        return path

    def _lose(self, path: str, why: str) -> None:
        if path not in self._refused:  # a refused one is already reported
            self.missing.append((path, why))

    # ---- files ----
    def _send(self, path: str, rec: dict) -> None:
        size = _size(rec, "send")
        if size != self._listed[path]:
            raise StreamError("%s: sends %d bytes but was listed with %d" % (_shown(path), size, self._listed[path]))
        tmp = f = None
        if path not in self._refused:
            try:
                dest = self.dest(path)
                dest.parent.mkdir(parents=True, exist_ok=True)
                # a name of its own (two collects of one run at once wrote one <file>.part: half of
                # each, reported verified), created, never reused: "x" is O_EXCL
                tmp = dest.with_name("%s.%s.part" % (dest.name, os.urandom(6).hex()))
                f = open(tmp, "xb")
            except (OSError, ValueError) as e:
                self._lose(path, "cannot write it here: %s" % e)
                tmp = None
        self._file = (path, size, tmp, f, hashlib.sha256())
        self._hash_due = path
        self._sink, self._want = self._write, size

    def _write(self, b: memoryview) -> None:
        assert self._file is not None
        path, size, tmp, f, h = self._file
        if f is not None:
            try:
                f.write(b)
                h.update(b)  # type: ignore[attr-defined]
            except OSError as e:  # a full disk here: skip this file, keep the framing
                self._close_part()
                self._file = (path, size, None, None, h)
                self._lose(path, "cannot write it here: %s" % e)
        self.on_bytes(len(b))

    def _log_bytes(self, b: memoryview) -> None:
        assert self._log is not None
        if self.log_to is not None:
            self.log_to.write(b)
        self._log += len(b)

    def _payload_done(self) -> None:
        if self._log is not None:
            self.log, self._log = self._log, None
        if self._sample is not None:  # kept only once whole: a file cut short is dropped (finish)
            (folder, attempt), data = self._sample, bytes(self._sample_buf)
            if self._sink == self._where_bytes:
                self.where[folder] = data
            else:
                self.samples[folder][attempt] = data
            self._sample, self._sample_buf = None, bytearray()
        self._sink = lambda b: None

    def _hashed(self, rec: dict) -> None:
        """The sha256 line after a sent file's bytes."""
        digest, stable = self._digest(rec)
        assert self._file is not None
        path, size, tmp, f, h = self._file
        if rec["path"] != path:
            raise StreamError("the sha256 line after %s names %s" % (_shown(path), _shown(rec["path"])))
        self._hash_due = None
        if tmp is None or f is None:  # skipped: already reported
            self._file = None
            return
        f.close()
        self._file = None
        try:
            if not stable:
                self.skipped.append(path)
            elif h.hexdigest() != digest:  # type: ignore[attr-defined]
                self._lose(path, "the copy received does not match the node's sha256 (%d bytes)" % size)
            else:
                os.replace(tmp, self.dest(path))
                self.fetched.append(path)
                self.digests[path] = digest
                self.bytes += size
        except (OSError, ValueError) as e:
            self._lose(path, "cannot write it here: %s" % e)
        finally:
            tmp.unlink(missing_ok=True)

    def _digest(self, rec: dict) -> tuple[str, bool]:
        digest, stable = rec["sha256"], rec["stable"]
        if not (isinstance(digest, str) and len(digest) == 64 and HEX.issuperset(digest)):
            raise StreamError("sha256: not 64 lowercase hex digits")
        if not isinstance(stable, bool):
            raise StreamError("stable: not true or false")
        return digest, stable

    def _compare(self, path: str, rec: dict) -> None:
        """A file sent only as its hash: the local copy is whole, or must be fetched again."""
        digest, stable = self._digest(rec)
        if path in self._refused:
            return
        size = self._listed[path]
        self.on_bytes(size)
        if not stable:
            self.skipped.append(path)
            return
        try:
            local = self.dest(path)
            same = local.stat().st_size == size and sha256_file(local) == digest
        except (OSError, ValueError):
            same = False
        (self.whole if same else self.differ).append(path)

    # ---- the end ----
    def _close_part(self) -> None:
        if self._file is not None and self._file[3] is not None:
            self._file[3].close()
            tmp = self._file[2]
            assert tmp is not None
            tmp.unlink(missing_ok=True)

    def finish(self, why: str | None = None) -> None:
        """The answer has ended (``why``: how it broke off, if known): remove a half-received file
        and report every listed file not brought back, and a log or list cut short."""
        cause = why or self.broken or "the node's answer ended early"
        if self._file is not None:
            path, size, tmp = self._file[0], self._file[1], self._file[2]
            self._close_part()
            self._file = None
            if tmp is not None:
                self._lose(path, ("its sha256 line never came; %s" if not self._want else
                                  "received %d of %d bytes; %%s" % (size - self._want, size)) % cause)
        self._hash_due = None
        if self._sample is not None:  # a sampler's file cut short: not kept, as if not sent
            folder, attempt = self._sample
            if self._sink == self._where_bytes:
                self.where.pop(folder, None)
            else:
                self.samples[folder].pop(attempt, None)
            self._sample, self._sample_buf = None, bytearray()
        if self._log is not None:
            self.errors.append("the log was cut short (%d bytes received); %s" % (self._log, cause))
            self._log = None
        self._want = 0
        if why is None and self.broken is None:
            if self._stage != "files":
                self.errors.append("the node's answer ended before its file list did")
            elif self._line:
                self.errors.append("the node's answer ended in the middle of a header line")
        self._line.clear()
        settled = set(self.fetched) | set(self.whole) | set(self.skipped) | set(self.differ) | self._refused
        settled.update(p for p, _ in self.missing)
        if self._list_only and self._stage == "files":
            settled.update(self._listed)  # a list asks for no file
        for p in self._listed:
            if p not in settled:
                self._lose(p, "not received: " + cause)

    def discard(self) -> None:
        """Close and remove a half-received file (the stream broke off)."""
        self._close_part()
        self._file = None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
