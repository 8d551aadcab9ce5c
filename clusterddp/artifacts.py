"""Bring a run's logs and ``collect`` globs back, verified.

What to fetch is decided from the node's own listing (path, size, sha256, and whether the
file changed while it was hashed); fetching writes to a temporary file, checks size and
sha256 against the listing, then renames it into ``artifacts/<host>/<path>``. A local copy
that already matches is skipped, so re-collecting a whole run re-downloads nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import plan as P
from .errors import HostError
from .store import RunStore
from .transport import Transport


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str
    stable: bool = True


@dataclass(frozen=True)
class CollectResult:
    """Per-host outcome: files fetched, already whole, skipped (still being written), failed."""

    host: str
    fetched: tuple[str, ...] = ()
    whole: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    error: str | None = None
    bytes: int = 0


def parse_listing(text: str) -> list[RemoteFile]:
    return [RemoteFile(**json.loads(line)) for line in text.splitlines() if line.startswith("{")]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def is_whole(path: Path, rf: RemoteFile) -> bool:
    return path.is_file() and path.stat().st_size == rf.size and sha256_file(path) == rf.sha256


def fetch_file(t: Transport, node: P.NodeLaunch, rf: RemoteFile, dest: Path,
               progress: Callable[[int], None] = lambda n: None) -> None:
    """Fetch one file to ``dest`` through a temp file; raise HostError unless size and sha256 match."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    h = hashlib.sha256()
    size = 0
    with open(tmp, "wb") as f:
        def write(b: bytes) -> None:
            nonlocal size
            f.write(b)
            h.update(b)
            size += len(b)
            progress(len(b))
        code = t.stream(P.cat_command(node, rf.path), write, timeout=60)
    if code != 0 or size != rf.size or h.hexdigest() != rf.sha256:
        tmp.unlink(missing_ok=True)
        raise HostError(node.host.name, f"{rf.path}: fetched copy does not match the node's "
                                        f"(size {size} vs {rf.size}, exit {code})", "run `clusterddp collect` again")
    os.replace(tmp, dest)


def collect_node(t: Transport, node: P.NodeLaunch, store: RunStore, run_id: str, globs: tuple[str, ...],
                 progress: Callable[[int], None] = lambda n: None) -> CollectResult:
    """Fetch the node's log and the files its run folder holds under ``globs``."""
    name = node.host.name
    try:
        log = t.run(P.node_log_command(node), timeout=120)
        if log.exit_code == 0:
            store.write_log(run_id, name, log.stdout)
        if not globs:
            return CollectResult(name)
        res = t.run(P.list_command(node, globs), timeout=600)
        if res.exit_code != 0:
            return CollectResult(name, error=f"listing failed: {res.stderr.decode('utf-8', 'replace').strip()}")
        fetched, whole, skipped, total = [], [], [], 0
        for rf in parse_listing(res.text):
            dest = store.artifact_path(run_id, name, rf.path)
            if not rf.stable:
                skipped.append(rf.path)
            elif is_whole(dest, rf):
                whole.append(rf.path)
            else:
                fetch_file(t, node, rf, dest, progress)
                fetched.append(rf.path)
                total += rf.size
        return CollectResult(name, tuple(fetched), tuple(whole), tuple(skipped), None, total)
    except HostError as e:
        return CollectResult(name, error=str(e))
