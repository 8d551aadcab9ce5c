"""Bring a run's logs and ``collect`` globs back, verified.

One command per node (``plan.collect_command``) does the whole job, since every remote command
pays for a shell start: the launcher sends the sizes of the local copies it already has; the
node sends its log, then each file whose local copy differs in size, streamed and hashed in one
pass, and only a sha256 for each file whose local copy has the same size. The launcher hashes
what it receives into a temporary file and renames it into ``artifacts/<host>/<path>`` only when
size and hash agree with the node's; a same-size local copy is whole when its hash matches, else
it is fetched again in a second command. So re-collecting a run whose artifacts are already whole
re-downloads nothing. A file that changes while it is read (a running job still writing it) is
not taken half-written: it is reported as skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Protocol, Sequence

from . import plan as P
from .errors import HostError
from .store import RunStore
from .transport import Transport


@dataclass(frozen=True)
class CollectResult:
    """Per-host outcome: files fetched, already whole, skipped (changing while read), error."""

    host: str
    fetched: tuple[str, ...] = ()
    whole: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    error: str | None = None
    bytes: int = 0


class Progress(Protocol):
    def start(self, host: str, total: int) -> None: ...
    def advance(self, host: str, n: int) -> None: ...


class _Quiet:
    def start(self, host: str, total: int) -> None:
        pass

    def advance(self, host: str, n: int) -> None:
        pass


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def local_sizes(base: Path) -> dict[str, int]:
    """{relative posix path: size} of the files already collected under ``base``."""
    out = {}
    for root, _, names in os.walk(base):
        for n in names:
            if not n.endswith(".part"):
                p = Path(root, n)
                out[p.relative_to(base).as_posix()] = p.stat().st_size
    return out


class _Receiver:
    """Takes one node's collect stream (see ``plan._COLLECT_PY``) chunk by chunk, as it arrives."""

    def __init__(self, host: str, dest: Callable[[str], Path], progress: Progress) -> None:
        self.host, self.dest, self.progress = host, dest, progress
        self.log: bytearray | None = None
        self.fetched: list[str] = []
        self.whole: list[str] = []
        self.skipped: list[str] = []
        self.differ: list[str] = []  # same size here, another hash on the node: fetch again
        self.errors: list[str] = []
        self.bytes = 0
        self._line = bytearray()
        self._want = 0  # raw bytes still to come after the last header
        self._sink: Callable[[memoryview], object] = lambda b: None
        self._file: tuple[str, Path, BinaryIO, "hashlib._Hash"] | None = None  # being received

    def feed(self, chunk: bytes) -> None:
        view, i = memoryview(chunk), 0
        while i < len(chunk):
            if self._want:
                n = min(self._want, len(chunk) - i)
                self._sink(view[i:i + n])
                self._want -= n
                i += n
                continue
            j = chunk.find(b"\n", i)
            if j < 0:
                self._line += view[i:]
                return
            self._line += view[i:j]
            i = j + 1
            rec = json.loads(self._line)
            self._line.clear()
            self._record(rec)

    def _record(self, rec: dict) -> None:
        if "log" in rec:
            self.log = bytearray()
            self._sink, self._want = self.log.extend, rec["log"]
        elif "files" in rec:
            self.progress.start(self.host, sum(f["size"] for f in rec["files"]))
        elif "error" in rec:
            self.errors.append(f"{rec['path']}: cannot read it on the node: {rec['error']}")
        elif "send" in rec:
            dest = self.dest(rec["path"])
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(dest.name + ".part")
            self._file = (rec["path"], tmp, open(tmp, "wb"), hashlib.sha256())
            self._sink, self._want = self._write, rec["send"]
        elif "sha256" in rec:
            if self._file is not None:
                self._received(rec)
            else:
                self._compare(rec)

    def _write(self, b: memoryview) -> None:
        assert self._file is not None
        self._file[2].write(b)
        self._file[3].update(b)
        self.progress.advance(self.host, len(b))

    def _received(self, rec: dict) -> None:
        assert self._file is not None
        path, tmp, f, h = self._file
        size = f.tell()
        f.close()
        self._file = None
        if not rec["stable"]:
            self.skipped.append(path)
        elif h.hexdigest() != rec["sha256"] or rec["path"] != path:
            self.errors.append(f"{path}: local copy does not match the node's ({size} bytes)")
        else:
            os.replace(tmp, self.dest(path))
            self.fetched.append(path)
            self.bytes += size
        tmp.unlink(missing_ok=True)

    def _compare(self, rec: dict) -> None:
        path = rec["path"]
        self.progress.advance(self.host, self.dest(path).stat().st_size)
        if not rec["stable"]:
            self.skipped.append(path)
        elif sha256_file(self.dest(path)) == rec["sha256"]:
            self.whole.append(path)
        else:
            self.differ.append(path)

    def discard(self) -> None:
        """Close and remove a half-received file (the stream broke off)."""
        if self._file is not None:
            self._file[2].close()
            self._file[1].unlink(missing_ok=True)
            self._file = None


def collect_nodes(pairs: Sequence[tuple[Transport, P.NodeLaunch]], store: RunStore, run_id: str,
                  globs: tuple[str, ...], fanout: int, progress: Progress | None = None) -> list[CollectResult]:
    """:func:`collect_node` on every (transport, node) in parallel; one result per node, errors included."""
    from .fleet import fan_out
    res = fan_out(pairs, lambda p: collect_node(p[0], p[1], store, run_id, globs, progress), fanout)
    return [r if isinstance(r, CollectResult) else CollectResult(n.host.name, error=f"{type(r).__name__}: {r}")
            for (_, n), r in zip(pairs, res)]


def collect_node(t: Transport, node: P.NodeLaunch, store: RunStore, run_id: str, globs: tuple[str, ...],
                 progress: Progress | None = None) -> CollectResult:
    """Fetch the node's log and the files its run folder holds under ``globs``."""
    name = node.host.name
    rx = _Receiver(name, lambda rel: store.artifact_path(run_id, name, rel), progress or _Quiet())
    try:
        have = local_sizes(store.artifacts_dir(run_id, name))
        _exchange(t, node, rx, {"log": True, "globs": list(globs), "have": have})
        if rx.log is not None:
            store.write_log(run_id, name, bytes(rx.log))
        if rx.differ:  # same size, other content (a damaged copy): send them whatever their size
            again, rx.differ = rx.differ, []
            _exchange(t, node, rx, {"paths": again, "have": {}})
            done = set(rx.fetched) | set(rx.skipped)
            rx.skipped += [p for p in again if p not in done]
    except HostError as e:
        rx.errors.insert(0, str(e))
    finally:
        rx.discard()
    error = "; ".join(rx.errors) or None
    return CollectResult(name, tuple(rx.fetched), tuple(rx.whole), tuple(rx.skipped), error, rx.bytes)


def _exchange(t: Transport, node: P.NodeLaunch, rx: _Receiver, request: dict) -> None:
    err = bytearray()
    code = t.stream(P.collect_command(node), rx.feed, timeout=120, stderr_to=err,
                    stdin=json.dumps(request).encode())
    if code != 0:
        lines = err.decode("utf-8", "replace").strip().splitlines()
        raise HostError(node.host.name, f"collect failed on the node: {lines[-1] if lines else f'exit {code}'}")
