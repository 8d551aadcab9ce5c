"""Bring a run's logs and ``collect`` globs back, verified.

Listing a node's files is cheap (path, size, mtime). A file is fetched in one pass: the
node streams it while hashing and reports size, sha256 and whether it changed during the
read; the launcher hashes what it receives into a temporary file and renames it into
``artifacts/<host>/<path>`` only when both agree. A local copy whose size matches is checked
against a sha256 computed on the node and skipped when whole, so re-collecting a run whose
artifacts are already whole re-downloads nothing. A file that changes while it is read (a
running job still writing it) is not taken half-written: it is reported as skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

from . import plan as P
from .errors import HostError
from .store import RunStore
from .transport import Transport


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    mtime_ns: int = 0


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


def parse_json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


class Changing(Exception):
    """The file changed on the node while it was being read."""


def fetch_file(t: Transport, node: P.NodeLaunch, rf: RemoteFile, dest: Path, progress: Progress) -> int:
    """Fetch one file to ``dest`` through a temp file; return its size.

    Raises HostError when the copy does not match what the node sent, Changing when the
    node saw the file change while reading it.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    h = hashlib.sha256()
    size = 0
    trailer = bytearray()
    try:
        with open(tmp, "wb") as f:
            def write(b: bytes) -> None:
                nonlocal size
                f.write(b)
                h.update(b)
                size += len(b)
                progress.advance(node.host.name, len(b))
            code = t.stream(P.send_command(node, rf.path), write, timeout=120, stderr_to=trailer)
        sent = (parse_json_lines(trailer.decode("utf-8", "replace")) or [{}])[-1]
        if code != 0 or "sha256" not in sent:
            raise HostError(node.host.name, f"{rf.path}: cannot read it on the node: "
                                            f"{trailer.decode('utf-8', 'replace').strip() or f'exit {code}'}")
        if not sent["stable"]:
            raise Changing(rf.path)
        if size != sent["size"] or h.hexdigest() != sent["sha256"]:
            raise HostError(node.host.name, f"{rf.path}: local copy does not match the node's "
                                            f"({size} of {sent['size']} bytes)", "run `clusterddp collect` again")
        os.replace(tmp, dest)
        return size
    finally:
        tmp.unlink(missing_ok=True)


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
    progress = progress or _Quiet()
    name = node.host.name
    try:
        log = t.run(P.node_log_command(node), timeout=120)
        if log.exit_code == 0:
            store.write_log(run_id, name, log.stdout)
        if not globs:
            return CollectResult(name)
        res = t.run(P.list_command(node, globs), timeout=600)
        if res.exit_code != 0:
            detail = res.stderr.decode("utf-8", "replace").strip() or f"exit {res.exit_code}"
            return CollectResult(name, error=f"listing files failed: {detail}")
        files = [RemoteFile(**d) for d in parse_json_lines(res.text)]
        dests = {rf.path: store.artifact_path(run_id, name, rf.path) for rf in files}
        # Candidates for "already whole": same size locally; confirm with a hash computed on the node.
        same_size = [rf.path for rf in files if dests[rf.path].is_file()
                     and dests[rf.path].stat().st_size == rf.size]
        remote_sha = {}
        if same_size:
            hashed = t.run(P.hash_command(node, same_size), timeout=600)
            remote_sha = {d["path"]: d.get("sha256") for d in parse_json_lines(hashed.text)}
        whole = [p for p in same_size if remote_sha.get(p) and sha256_file(dests[p]) == remote_sha[p]]
        todo = [rf for rf in files if rf.path not in whole]
        progress.start(name, sum(rf.size for rf in todo))
        fetched, skipped, total = [], [], 0
        for rf in todo:
            try:
                total += fetch_file(t, node, rf, dests[rf.path], progress)
                fetched.append(rf.path)
            except Changing:
                skipped.append(rf.path)
        return CollectResult(name, tuple(fetched), tuple(whole), tuple(skipped), None, total)
    except HostError as e:
        return CollectResult(name, error=str(e))
