"""Bring a run's logs and ``collect`` globs back, verified.

One command per node (``plan.collect_command``; the node program and its receiver are in
:mod:`clusterddp.node.collect`) does the whole job, since every remote command pays for a shell
start: the launcher sends the sizes of the local copies it already has; the node sends its log,
then each file whose local copy differs in size, streamed and hashed in one pass, and only a
sha256 for each file whose local copy has the same size. The launcher hashes what it receives
into a temporary file and renames it into ``artifacts/<host>/<path>`` only when size and hash
agree with the node's; a same-size local copy is whole when its hash matches, else it is fetched
again in a second command. So re-collecting a run whose artifacts are already whole
re-downloads nothing. A file that changes while it is read (a running job still writing it) is
not taken half-written: it is reported as skipped.

The samplers' files come back in the same answer (``samples``: the metrics sampler's metrics.jsonl
of each attempt, :mod:`clusterddp.metrics.samples`, and the rank sampler's where.jsonl,
:mod:`clusterddp.stragglers`; both in the control folder, which no glob reaches), so the end of a run,
`collect` and `metrics` of a running run each cost one command a node.

A run's end does not ask again for a log its follower already sent whole (``streamed``): the local
copy is checked against the size and sha256 the follower reported instead, and the node is asked for
its samples and globs alone.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from . import nodeops
from . import plan as ssh_plan
from .errors import ClusterDDPError, HostError
from .fleet import Fleet
from .metrics.samples import save as save_samples
from .node.collect import Receiver, StreamError, sha256_file
from .nodescript import WHERE_SAMPLES
from .store import RunStore
from .stragglers import WHERE_DIR
from .transport import Tail, Transport


@dataclass(frozen=True)
class CollectResult:
    """Per-host outcome: files fetched, already whole, skipped (changing while read), what went
    wrong with the host's answer as a whole (``error``), and each file not brought back, with why
    (``missing``: unreadable on the node, refused, cut short, damaged in transit)."""

    host: str
    fetched: tuple[str, ...] = ()
    whole: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    error: str | None = None
    bytes: int = 0
    missing: tuple[tuple[str, str], ...] = ()
    unmatched: tuple[str, ...] | None = None  # the globs no file of the host matched; None: not known

    @property
    def ok(self) -> bool:
        return self.error is None and not self.missing


class Progress(Protocol):
    def start(self, host: str, total: int) -> None: ...
    def advance(self, host: str, n: int) -> None: ...


class _Quiet:
    def start(self, host: str, total: int) -> None:
        pass

    def advance(self, host: str, n: int) -> None:
        pass


def local_sizes(base: Path) -> dict[str, int]:
    """{relative posix path: size} of the files already collected under ``base``."""
    out = {}
    for root, _, names in os.walk(base):
        for n in names:
            if not n.endswith(".part"):
                p = Path(root, n)
                out[p.relative_to(base).as_posix()] = p.stat().st_size
    return out


def collect_nodes(fleet: Fleet, nodes: Sequence[ssh_plan.NodeLaunch], store: RunStore, run_id: str,
                  globs: tuple[str, ...], progress: Progress | None = None,
                  streamed: Mapping[str, nodeops.Whole] | None = None) -> list[CollectResult]:
    """:func:`collect_node` on every node through ``fleet``, in parallel, its samplers' files included:
    one command a node; one result per node, in node order, a node that cannot be reached included.

    ``streamed``: the whole logs the followers sent (:class:`nodeops.Whole`, by host). A node whose
    local log is that (:func:`keep_streamed`) is not asked for its log again."""
    def one(n: ssh_plan.NodeLaunch, t: Transport) -> CollectResult:
        name = n.host.name
        log = not (streamed and name in streamed and keep_streamed(store.log_path(run_id, name), streamed[name]))
        return collect_node(t, n, store, run_id, globs, progress, samples={".": name}, log=log)
    res = nodeops.each(fleet, nodes, one)
    got = res.or_else(lambda h, e: CollectResult(h, error=_why(e)))
    return [got[n.host.name] for n in nodes]


def keep_streamed(path: Path, whole: nodeops.Whole) -> bool:
    """Whether the local log at ``path`` begins with the log its follower sent whole (its size and
    sha256); if so, what follows (the lines the follower's shell said on its stderr, a login shell's
    complaint, passed on after the log) is cut off, as the node's copy would have replaced it. A copy
    that is shorter, differs or cannot be read or cut is not kept (the collect fetches it again)."""
    try:
        size = path.stat().st_size
        if size < whole.size or sha256_file(path, whole.size) != whole.sha256:
            return False
        if size > whole.size:
            os.truncate(path, whole.size)
    except OSError:
        return False
    return True


def _why(e: Exception) -> str:
    # A host the fleet could not reach says so itself; anything else is a surprise: name its type.
    return str(e) if isinstance(e, HostError) else f"{type(e).__name__}: {e}"


def collect_node(t: Transport, node: ssh_plan.NodeLaunch, store: RunStore, run_id: str, globs: tuple[str, ...],
                 progress: Progress | None = None, samples: Mapping[str, str] | None = None,
                 log: bool = True) -> CollectResult:
    """Fetch the node's log (unless not ``log``: the local copy is kept) and the files its run folder
    holds under ``globs``, and in the same answer the samplers' files of each folder in ``samples``
    ({folder, relative to the log's, ``.`` for its own: the host they are kept under}; :func:`keep_samples`).

    Nothing the node sends is trusted (see :class:`~clusterddp.node.collect.Receiver`): a bad
    entry is skipped and named in ``missing``, a bad answer ends that answer with an error
    naming the host, and the files received before it are kept.
    """
    name = node.host.name
    bar = progress or _Quiet()
    errors: list[str] = []
    missing: list[tuple[str, str]] = []

    dest = store.artifact_paths(run_id, name)

    def exchange(request: dict, log_to: BinaryIO | None = None) -> Receiver:
        rx = Receiver(dest, on_total=lambda n: bar.start(name, n),
                      on_bytes=lambda n: bar.advance(name, n), request=request, log_to=log_to)
        why = None
        try:
            _exchange(t, node, rx, request)
        except StreamError as e:
            why = str(HostError(name, f"its collect answer was refused: {e}"))
        except HostError as e:
            why = str(e)
        finally:
            rx.finish(why)
        errors.extend([why] if why else [])
        errors.extend(f"{name}: {e}" for e in rx.errors)
        missing.extend(rx.missing)
        return rx

    try:
        have = local_sizes(store.artifacts_dir(run_id, name))
    except OSError as e:
        return CollectResult(name, error=f"{name}: cannot list the local copies: {e}")
    request = {"log": log, "globs": list(globs), "have": have, **({"samples": sorted(samples)} if samples else {})}
    if not log:
        rx = exchange(request)
    else:
        try:  # the log goes to disk as it comes, replacing the local copy only once it came whole
            with store.log_writer(run_id, name) as out:
                rx = exchange(request, out)
                if rx.log is None:
                    raise _KeepOldLog()
        except _KeepOldLog:
            pass
    if samples:
        errors.extend(keep_samples(store, run_id, rx, samples))
    fetched, whole, skipped, got = list(rx.fetched), list(rx.whole), list(rx.skipped), rx.bytes
    if rx.differ:  # same size, other content (a damaged copy): send them whatever their size
        again = exchange({"paths": rx.differ, "have": {}})
        fetched += again.fetched
        skipped += again.skipped
        got += again.bytes
        settled = set(again.fetched) | set(again.skipped) | {p for p, _ in missing}
        missing += [(p, "the copy here differs from the node's, which did not send it again")
                    for p in rx.differ if p not in settled]
    unmatched = rx.unmatched
    return CollectResult(name, tuple(fetched), tuple(whole), tuple(skipped), "; ".join(errors) or None, got,
                         tuple(missing), None if unmatched is None else tuple(unmatched))


def keep_samples(store: RunStore, run_id: str, rx: Receiver, samples: Mapping[str, str]) -> list[str]:
    """The samplers' files ``rx`` received (whole, and bounded by it), kept under the host each folder of
    ``samples`` names: ``<run>/metrics/<host>/`` (:func:`clusterddp.metrics.samples.save`) and
    ``<run>/where/<host>/where.jsonl`` (:mod:`clusterddp.stragglers`; an empty one is not kept). What could
    not be written here, by host. A read-only store keeps what it had."""
    errors = []
    for folder, host in ([] if store.read_only else samples.items()):
        try:
            if rx.samples.get(folder):
                save_samples(store.run_dir(run_id), host, rx.samples[folder])
            if rx.where.get(folder):
                store.write_evidence(run_id, WHERE_DIR, host, WHERE_SAMPLES, rx.where[folder])
        except (OSError, ClusterDDPError) as e:
            errors.append(f"{host}: cannot keep its samples here: {e}")
    return errors


def matched_nowhere(results: Sequence[CollectResult]) -> tuple[tuple[str, ...], bool]:
    """The collect globs that matched no file on any host whose file list came whole (in the order
    asked), and whether every host's did (else "any host that answered" is all that can be said)."""
    known = [r.unmatched for r in results if r.unmatched is not None]
    if not known:
        return (), False
    nowhere = tuple(g for g in known[0] if all(g in u for u in known[1:]))
    return nowhere, len(known) == len(results)


class _KeepOldLog(Exception):
    """The node's log did not come whole: keep the local copy. Private control flow (not in errors.py)."""


def _exchange(t: Transport, node: ssh_plan.NodeLaunch, rx: Receiver, request: dict) -> None:
    err = Tail()
    code = t.stream(ssh_plan.collect_command(node), rx.feed, timeout=120, stderr_to=err,
                    stdin=json.dumps(request).encode())
    if code != 0:
        lines = err.decode("utf-8", "replace").strip().splitlines()
        raise HostError(node.host.name, f"collect failed on the node: {lines[-1] if lines else f'exit {code}'}")


def exchange(t: Transport, node: ssh_plan.NodeLaunch, rx: Receiver, request: dict) -> None:
    """One request of the collect protocol (:mod:`clusterddp.node.collect`) to ``node``, its answer fed
    to ``rx`` (then ``rx.finish`` is the caller's); a HostError when the node's program fails. The one
    exchange of ``collect``, for the other features that ask a node for its files (:mod:`clusterddp.resume`)."""
    _exchange(t, node, rx, request)
