"""``collect``: the node program that sends a run's log and files, and the launcher's receiver.

One command per node (``plan.collect_command``), so a collect pays for one remote shell (whose
rc files may take a noticeable time) whatever the number of files. :func:`main` reads a JSON
request on stdin, {"globs": [...] or "paths": [...], "have": {path: size of the local copy},
"log": bool}, and answers on stdout with JSON header lines, some followed by raw bytes:

  {"log": n} + n bytes               the node log
  {"files": [{"path", "size"}, ...]} what it will go through (regular files, no links, not .clusterddp)
  {"path", "send": n} + n bytes, then {"path", "sha256", "stable"}   a file whose local copy differs in size
  {"path", "sha256", "stable"}       a file whose local copy has its size: only its hash
  {"path", "error"}                  a file it could not read
  {"tick": 1}                        keeps the stream alive while large files are hashed

"stable" is false when the file changed while it was read (a job still writing it). A file
that shrank while sent is padded to its announced size so the framing holds; it is unstable.

:class:`Receiver` takes that answer on the launcher, chunk by chunk as it arrives.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # for type checkers only: see clusterddp/node/__init__.py
    from pathlib import Path
    from typing import BinaryIO, Callable

CONTROL = ".clusterddp"  # the run's control folder (plan.CONTROL): never sent
BUF = 1 << 20


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

    def emit(**rec: object) -> None:
        out.write(json.dumps(rec).encode() + b"\n")
    if req.get("log"):
        try:
            with open(log_path, "rb") as f:
                data = f.read()
            emit(log=len(data))
            out.write(data)
        except OSError:
            pass
    os.chdir(run_dir)
    names = req.get("paths") or [p for pat in req.get("globs", []) for p in sorted(glob.glob(pat, recursive=True))]
    files = {}
    for p in names:
        if p not in files and os.path.isfile(p) and not os.path.islink(p) and not p.startswith(CONTROL):
            files[p] = os.stat(p)
    emit(files=[{"path": p, "size": st.st_size} for p, st in files.items()])
    last = time.monotonic()
    buf = memoryview(bytearray(BUF))  # one buffer for every read: no allocation per MiB
    for p, st in files.items():
        send = req["have"].get(p) != st.st_size
        try:
            f = open(p, "rb")
        except OSError as e:
            emit(path=p, error=str(e))
            continue
        with f:
            if send:
                emit(path=p, send=st.st_size)
            h, n = hashlib.sha256(), 0
            while n < st.st_size:
                b = buf[:f.readinto(buf[:min(len(buf), st.st_size - n)])]
                if not b:
                    break
                h.update(b)
                n += len(b)
                if send:
                    out.write(b)
                elif time.monotonic() - last > 5:
                    emit(tick=1)
                    out.flush()
                    last = time.monotonic()
            padded = n
            while send and padded < st.st_size:  # it shrank: keep the framing (reported unstable below)
                k = min(len(buf), st.st_size - padded)
                out.write(bytes(k))
                padded += k
            now = os.fstat(f.fileno())
        same = [(s.st_ino, s.st_size, s.st_mtime_ns) for s in (st, now)]
        emit(path=p, sha256=h.hexdigest(), stable=n == st.st_size and same[0] == same[1])
    out.flush()
    return 0


# ---- launcher side ----

def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(BUF), b""):
            h.update(b)
    return h.hexdigest()


class Receiver:
    """Takes one node's answer to :func:`main` chunk by chunk (:meth:`feed`), as it arrives.

    A sent file is hashed into ``<dest(path)>.part`` and renamed to ``dest(path)`` only when its
    size and hash agree with the node's; a file sent only as a hash is compared with the local
    copy at ``dest(path)``. ``on_total(bytes)`` is called once the node has listed its files,
    ``on_bytes(n)`` as they are received or compared.
    """

    def __init__(self, dest: Callable[[str], Path], on_total: Callable[[int], object] = lambda n: None,
                 on_bytes: Callable[[int], object] = lambda n: None) -> None:
        self.dest, self.on_total, self.on_bytes = dest, on_total, on_bytes
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
        self._file: tuple[str, Path, BinaryIO, hashlib._Hash] | None = None  # being received

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
            self.on_total(sum(f["size"] for f in rec["files"]))
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
        self.on_bytes(len(b))

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
        self.on_bytes(self.dest(path).stat().st_size)
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
