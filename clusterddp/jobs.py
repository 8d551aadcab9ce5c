"""One run, from plan to record: the steps behind `clusterddp up`, free of any printing.

The CLI calls :func:`prepare` (pure planning plus the run record) and then :func:`execute`
(start, watch, collect, record the outcome).
"""

from __future__ import annotations

import os
import re
import socket
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from . import inventory as inv_mod
from . import plan as P
from .artifacts import CollectResult, collect_nodes
from .errors import HostError, RunFailed, UsageError
from .failure import Failure
from .fleet import Fleet
from .record import NodeRecord, NodeState, RunRecord, RunStatus
from .sizes import human_size
from .store import RunStore, new_run_id, utcnow
from .supervisor import RunOutcome, Supervisor

if TYPE_CHECKING:  # leases are not needed by `up local`
    from .leases import Lease


@dataclass(frozen=True)
class Prepared:
    plan: P.LaunchPlan
    store: RunStore
    source_dir: Path


def load_inventory(arg: str, gpus: int | None) -> inv_mod.Inventory:
    return inv_mod.load_named(arg, gpus)


def prepare(inventory_arg: str, spec: P.RunSpec, runs_dir: str, hosts: list[str] | None = None,
            run_id: str | None = None, exclude: list[str] | None = None,
            loaded: inv_mod.Inventory | None = None, slots: dict[str, tuple[int, ...]] | None = None) -> Prepared:
    """Validate input and plan the run (no network). Raises UsageError for bad input.
    ``loaded``: the inventory, when the caller has already read it. ``slots``: a fixed choice of
    GPUs by host (``--hosts gpu-01:0,1``), over the inventory's."""
    script = check_script(spec.script)
    inventory = loaded or load_inventory(inventory_arg, spec.gpus)
    if inventory.slurm is not None:
        raise UsageError(f"{inventory.path} is a `slurm:` inventory, which this command does not take",
                         "give it an inventory with `hosts:`")
    inventory = inventory.narrow(hosts, exclude)
    if slots:
        inventory = replace(inventory, hosts=tuple(replace(h, slots=slots[h.name], gpus=len(slots[h.name]))
                                                   if h.name in slots else h for h in inventory.hosts))
    store = RunStore(runs_dir)
    run_id = run_id or new_run_id()
    local: dict = {}
    if inventory_arg == inv_mod.LOCAL:
        local = dict(local_run_dir=os.getcwd(), local_control_dir=str(store.run_dir(run_id) / "node"))
        if P.static_local(spec):  # its rendezvous needs a port, free now
            spec = replace(spec, master_port=local_port(spec.master_port))
    plan = P.build_plan(inventory, spec, run_id, **local)
    return Prepared(plan, store, script.resolve().parent)


def local_port(fixed: int | None) -> int:
    """The master port of an ``up local`` run: ``fixed`` (--master-port) when nothing listens on
    it, else a UsageError naming it; without one, a port the kernel finds free. Between this and
    torchrun's bind (0.3-0.5 s) another program could take it, but the kernel hands each bind(0) a
    random port of its ~28000 ephemeral ones and prefers the other parity for outgoing connections."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a finished run's TIME_WAIT is no listener
        try:
            s.bind(("", fixed or 0))
        except OSError as e:
            raise UsageError(f"--master-port {fixed}: cannot listen on it on this machine ({e.strerror})",
                             "choose another port, or leave --master-port out and `up local` takes a free one"
                             ) from None
        return s.getsockname()[1]


def check_script(path: str) -> Path:
    """The training script as a Path; a UsageError (exit 2) naming it when it is a folder or missing."""
    script = Path(path)
    if script.is_dir():
        raise UsageError(f"script {path}: is a directory, not a script", _script_in(script))
    if not script.is_file():
        raise UsageError(f"script {path}: no such file", "pass the path of your training script")
    return script


def _script_in(folder: Path) -> str:
    """What to pass instead of a folder: its Python files (the folder itself is uploaded with the script)."""
    try:
        found = sorted(p.name for p in folder.iterdir() if p.suffix == ".py" and p.is_file())
    except OSError:
        found = []
    shown = ", ".join(str(folder / name) for name in found[:5]) + (", ..." if len(found) > 5 else "")
    return ("pass the training script inside it" + (f" (one of: {shown})" if found else "")
            + "; the script's whole folder is uploaded with it")


# What never leaves this machine unless .clusterddpignore re-includes it (``!.env``): VCS and
# tool caches, virtualenvs, and the usual places of secrets (SSH keys, .env files, PEM keys,
# .netrc). Gitignore syntax, read before the user's own rules (the last matching rule wins).
DEFAULT_EXCLUDES = (".git/", ".hg/", ".svn/", "__pycache__/", ".clusterddp/", ".pytest_cache/", ".mypy_cache/",
                    ".venv/", ".ssh/", ".env", ".env.*", "*.pem", "*.key", ".netrc", "id_rsa*", "id_dsa*",
                    "id_ecdsa*", "id_ed25519*")
IGNORE_FILE = ".clusterddpignore"
DEFAULT_MAX_UPLOAD = 1 << 30


def _rule_regex(pattern: str) -> str:
    """A gitignore glob as a regex over a /-separated path: ``*`` and ``?`` stay within one
    component, ``**`` spans any, ``[...]`` is a set."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[" and "]" in pattern[i + 2:]:
            j = pattern.index("]", i + 2)
            body = pattern[i + 1:j]
            out.append("[" + ("^" + body[1:] if body[:1] == "!" else body).replace("\\", "\\\\") + "]")
            i = j
        elif c == "\\" and i + 1 < len(pattern):
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


@dataclass(frozen=True)
class IgnoreRule:
    regex: re.Pattern
    negate: bool
    dir_only: bool


def ignore_rules(lines: list[str] | tuple[str, ...]) -> list[IgnoreRule]:
    """Rules in the subset of gitignore syntax clusterddp reads: ``#`` comments, ``!negation``,
    ``dir/`` (folders only), ``/anchored`` or ``a/b`` (relative to the script's folder; otherwise
    the name matches at any depth), ``*``, ``?``, ``[...]`` and ``**``."""
    rules = []
    for line in lines:
        line = line.rstrip("\n").rstrip("\r")
        if not line.endswith("\\ "):
            line = line.rstrip(" ")
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        line = line[1:] if negate else line
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line
        body = _rule_regex(line.lstrip("/"))
        rules.append(IgnoreRule(re.compile(("" if anchored else "(?:.*/)?") + body + r"\Z", re.S), negate, dir_only))
    return rules


def ignored(rel: str, is_dir: bool, rules: list[IgnoreRule]) -> bool:
    verdict = False
    for r in rules:
        if (is_dir or not r.dir_only) and r.regex.match(rel):
            verdict = not r.negate
    return verdict


@dataclass(frozen=True)
class SourceFolder:
    """What the upload of a script's folder holds: paths relative to ``root`` (folders end in /)."""

    root: Path
    entries: tuple[tuple[str, int], ...]  # (relative path, bytes; 0 for folders and links)

    @property
    def files(self) -> int:
        return sum(1 for rel, _ in self.entries if not rel.endswith("/"))

    @property
    def size(self) -> int:
        return sum(n for _, n in self.entries)

    def biggest(self, n: int = 5) -> list[tuple[str, int]]:
        """The largest top-level items (a folder counts all it holds), largest first."""
        tops: dict[str, int] = {}
        for rel, size in self.entries:
            head, sep, _ = rel.partition("/")
            key = head + sep
            tops[key] = tops.get(key, 0) + size
        return sorted(tops.items(), key=lambda kv: (-kv[1], kv[0]))[:n]

    def summary(self) -> str:
        return f"{self.files} files, {human_size(self.size)} ({self.size} bytes) from {self.root}"


_SIZE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?", re.I)


def parse_size(text: str) -> int:
    """``500M``, ``2G``, ``1.5GiB``, ``100000`` (bytes) as bytes; binary units."""
    m = _SIZE_RE.fullmatch(text.strip())
    if not m:
        raise UsageError(f"--max-upload {text!r}: not a size", "e.g. --max-upload 500M or --max-upload 4G")
    return int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " "))


def scan_source(source_dir: Path, runs_dir: Path) -> SourceFolder:
    """The files the upload would send: the default excludes, then ``.clusterddpignore``'s rules;
    the runs folder is never sent. Folders that are excluded are not entered (as git: a file in
    them cannot be re-included). Links are sent as links, never followed."""
    rules = ignore_rules(DEFAULT_EXCLUDES)
    try:
        with open(source_dir / IGNORE_FILE, encoding="utf-8") as f:
            rules += ignore_rules(f.read().splitlines())
    except FileNotFoundError:
        pass
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read {source_dir / IGNORE_FILE}: {e}", "make it readable UTF-8 text") from None
    skip = runs_dir.resolve()
    entries: list[tuple[str, int]] = []

    def walk(folder: Path, prefix: str) -> None:
        with os.scandir(folder) as it:
            items = sorted(it, key=lambda e: e.name)
        for e in items:
            rel = prefix + e.name
            is_dir = e.is_dir(follow_symlinks=False)
            if ignored(rel, is_dir, rules) or (is_dir and Path(e.path).resolve() == skip):
                continue
            if is_dir:
                entries.append((rel + "/", 0))
                walk(Path(e.path), rel + "/")
            else:
                entries.append((rel, e.stat(follow_symlinks=False).st_size if e.is_file(follow_symlinks=False) else 0))
    walk(source_dir, "")
    return SourceFolder(source_dir, tuple(entries))


def check_upload_size(folder: SourceFolder, limit: int) -> None:
    if folder.size <= limit:
        return
    big = ", ".join(f"{rel} ({human_size(n)})" for rel, n in folder.biggest())
    raise UsageError(f"the script's folder is {human_size(folder.size)} to upload, over the {human_size(limit)} "
                     f"limit; biggest: {big}",
                     f"list what the nodes do not need in {folder.root / IGNORE_FILE} (gitignore syntax), move the "
                     "script to a folder of its own, or raise the limit with --max-upload SIZE")


def describe_upload(prep: Prepared, max_upload: int = DEFAULT_MAX_UPLOAD) -> str | None:
    """For --dry-run: what the upload would send (None in local mode); over the limit is bad input."""
    if not prep.plan.upload:
        return None
    folder = _scan(prep)
    check_upload_size(folder, max_upload)
    return f"upload: {folder.summary()}"


def _scan(prep: Prepared) -> SourceFolder:
    try:
        return scan_source(prep.source_dir, prep.store.root)
    except OSError as e:
        raise UsageError(f"cannot read the script's folder {prep.source_dir}: {e}",
                         "make every file there readable, or move the script to a folder of its own") from None


@dataclass(frozen=True)
class Upload:
    """The script's folder packed into a private temporary tarball; :meth:`discard` removes it."""

    folder: SourceFolder
    path: Path

    def discard(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


# The package's __init__ and clusterddp.train (which needs only torch), unpacked into
# <run folder>/.clusterddp/lib for nodes whose python has no clusterddp (launch.sh decides).
SHIPPED = ("__init__.py", "train.py")


def _add_shipped(tar: tarfile.TarFile) -> None:
    package = Path(__file__).resolve().parent
    for folder in (P.SHIPPED_LIB, P.SHIPPED_LIB + "/clusterddp"):  # never .clusterddp itself: its mode stays
        info = tarfile.TarInfo(folder)
        info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, int(time.time())
        tar.addfile(info)
    for name in SHIPPED:
        tar.add(package / name, arcname=f"{P.SHIPPED_LIB}/clusterddp/{name}", recursive=False)


def pack(prep: Prepared, max_upload: int = DEFAULT_MAX_UPLOAD) -> Upload | None:
    """The script's folder to upload, with clusterddp.train for nodes without clusterddp (SHIPPED),
    as a gzip tarball in a 0600 temporary file (None in local
    mode): streamed from disk to each node, never held in memory. Over ``max_upload`` bytes, or
    an unreadable file, is bad input."""
    if not prep.plan.upload:
        return None
    folder = _scan(prep)
    check_upload_size(folder, max_upload)
    fd, name = tempfile.mkstemp(prefix="clusterddp-upload-", suffix=".tar.gz")  # 0600
    try:
        with os.fdopen(fd, "wb") as f, tarfile.open(fileobj=f, mode="w:gz", compresslevel=1) as tar:
            for rel, _ in folder.entries:
                rel = rel.rstrip("/")
                tar.add(prep.source_dir / rel, arcname=rel, recursive=False)
            _add_shipped(tar)
    except OSError as e:
        os.unlink(name)
        raise UsageError(f"cannot pack the script's folder {prep.source_dir}: {e}",
                         "make every file there readable, or move the script to a folder of its own") from None
    except BaseException:
        os.unlink(name)
        raise
    return Upload(folder, Path(name))


def new_record(prep: Prepared, inventory_arg: str, schedule: str | None = None) -> RunRecord:
    plan = prep.plan
    return RunRecord(
        run_id=plan.run_id, name=plan.spec.name,
        inventory=inventory_arg if inventory_arg == inv_mod.LOCAL else str(Path(inventory_arg).resolve()),
        script=plan.spec.script, args=tuple(plan.spec.script_args), status=RunStatus.RUNNING, failed_host=None,
        schedule=schedule, local=plan.local, started_at=utcnow(), ended_at=None, launch_dir=os.getcwd(),
        master_addr=plan.master_addr, master_port=plan.master_port, collect=tuple(plan.collect),
        fanout=plan.inventory.fanout,
        nodes=tuple(NodeRecord(host=n.host.name, address=n.host.address, node_rank=n.node_rank, nproc=n.nproc,
                               run_dir=n.run_dir, control_dir=n.control_dir, marker=n.marker, settings=n.host,
                               state=NodeState.PENDING) for n in plan.nodes))


def node_states(sup: Supervisor) -> dict[str, tuple[NodeState, int | None, str | None]]:
    """What the supervisor saw of each node, for :meth:`RunRecord.seen`."""
    return {n.name: (n.state, n.exit_code, n.error) for n in sup.nodes}


def preflight(plan: P.LaunchPlan, connect: Callable | None = None) -> Fleet | None:
    """Before starting a job, the cheap checks that catch a job that would hang or fail at once.

    One short SSH command per host, in parallel: every host answers, python/torch/CUDA agree,
    an interface routes to the master, the master port is free. Raises
    :class:`~clusterddp.errors.PreflightFailed` (exit 1) naming each problem; otherwise returns
    the open connections, for :func:`execute` to reuse. Local runs need none of it: None.
    """
    if plan.local:
        return None
    from .check import preflight_failed, run_checks
    fleet = Fleet(plan.inventory.hosts, fanout=plan.inventory.fanout, **({"connect": connect} if connect else {}))
    try:
        report = run_checks(plan.inventory, full=False, master_port=plan.master_port, fleet=fleet,
                            env={n.host.name: n.env for n in plan.nodes}, check_port=port_fixed(plan))
    except BaseException:
        fleet.close()
        raise
    if not report.ok:
        fleet.close()
        raise preflight_failed(report, plan.inventory.path)
    return fleet


def port_fixed(plan: P.LaunchPlan) -> bool:
    """The master port was given (--master-port, or master.port in the inventory); otherwise the
    lease chooses a free one, from the inventory's (29500 by default)."""
    return plan.spec.master_port is not None or plan.inventory.master.port_fixed


def take_lease(prep: Prepared, fleet: Fleet, *, wait: bool = False,
               on_wait: Callable[[str], None] = lambda s: None) -> tuple[Prepared, Lease | None]:
    """Lease the run's GPU slots (and master port) on every node, waiting in the queue with ``wait``;
    return the run planned on them (one process per slot, ``CUDA_VISIBLE_DEVICES``, the port chosen)
    and the lease, whose :meth:`~clusterddp.leases.Lease.release` gives back what no job took. Local
    runs take none."""
    plan = prep.plan
    if plan.local:
        return prep, None
    from .leases import acquire
    lease = acquire(plan, fleet, port_fixed=port_fixed(plan), wait=wait, on_wait=on_wait)
    try:
        spec = replace(plan.spec, master_port=lease.port or plan.master_port)
        new = P.build_plan(plan.inventory, spec, plan.run_id, grants=lease.grants)
    except BaseException:
        lease.release()
        raise
    return replace(prep, plan=new), lease


def execute(prep: Prepared, on_output: Callable[[str, bytes], None], *, detach: bool = False,
            on_collect: Callable[[CollectResult], None] = lambda r: None,
            connect: Callable | None = None, fleet: Fleet | None = None,
            source_tar: Path | None = None, join_timeout: float = 0.0) -> RunOutcome | None:
    """Start the run; unless ``detach``, watch it to the end, collect, and record the outcome.

    ``fleet`` (from :func:`preflight`) is the run's connections, already open; ``source_tar``
    (:attr:`Upload.path` from :func:`pack`) is the tarball of the script's folder, streamed to each node.
    Raises RunFailed (exit 1) when the job failed, KeyboardInterrupt after a Ctrl-C teardown.
    """
    plan, store = prep.plan, prep.store
    run_id = plan.run_id

    def output(host: str, data: bytes) -> None:
        store.append_log(run_id, host, data)
        on_output(host, data)
    fleet = fleet or Fleet([n.host for n in plan.nodes], fanout=plan.inventory.fanout,
                           **({"connect": connect} if connect else {}))
    sup = Supervisor(plan, on_output=output, source_tar=source_tar, fleet=fleet, join_timeout_s=join_timeout)
    try:
        try:
            sup.start()
        except HostError as e:
            finish(store, run_id, sup, RunOutcome(RunStatus.FAILED, sup.outcomes(), e.host))
            raise
        except KeyboardInterrupt:  # Ctrl-C while nodes start: end what started, record the stop
            sup.teardown()
            finish(store, run_id, sup, RunOutcome(RunStatus.STOPPED, sup.outcomes()))
            raise
        store.update(run_id, lambda rec: rec.seen(node_states(sup)))
        if detach:
            return None
        try:
            outcome = sup.follow()
        except KeyboardInterrupt:
            store.close_logs()
            collect(fleet, plan, store, on_collect, sup)
            finish(store, run_id, sup, sup.outcome)
            raise
        store.close_logs()
        collect(fleet, plan, store, on_collect, sup)
        status = finish(store, run_id, sup, outcome)
        if status is not RunStatus.SUCCEEDED:
            said = {n.host: n.describe() for n in store.load(run_id).nodes}  # the words `status` will print
            cause = explain(fleet, plan, store) if status is RunStatus.FAILED else ()
            raise RunFailed(run_id, list(outcome.nodes), outcome.first_failed, status, said, cause=cause)
        return outcome
    finally:
        store.close_logs()
        sup.close()


def explain(fleet: Fleet, plan: P.LaunchPlan, store: RunStore) -> tuple[str, ...]:
    """Why the run failed (:mod:`clusterddp.postmortem`), recorded in run.json's ``failure``, as the
    summary's lines; when it cannot be worked out, a line saying why (the exit codes still say what
    they say)."""
    from .postmortem import explain as postmortem
    try:
        failure: Failure = postmortem(fleet, plan.nodes, store.load(plan.run_id), store)
        store.update(plan.run_id, lambda rec: replace(rec, failure=failure))
    except Exception as e:  # noqa: BLE001 - a diagnosis that fails must not hide the run's own failure
        return (f"(the root cause could not be worked out: {type(e).__name__}: {e})",)
    return tuple(failure.lines())


def collect(fleet: Fleet, plan: P.LaunchPlan, store: RunStore, on_collect: Callable[[CollectResult], None],
            sup: Supervisor | None = None) -> list[CollectResult]:
    """Bring back every node's log and files, except from nodes ``sup`` saw lost: they are not
    tried (their link is gone), and the result says how to fetch them once they answer again."""
    lost = {n.name for n in sup.nodes if n.state is NodeState.LOST} if sup is not None else set()
    got = {r.host: r for r in collect_nodes(fleet, [n for n in plan.nodes if n.host.name not in lost], store,
                                             plan.run_id, plan.collect)}
    results = [got.get(n.host.name) or CollectResult(
        n.host.name, error=f"{n.host.name}: not collected: it was lost during the run; "
                           f"`clusterddp collect {plan.run_id}` fetches its log and files once it answers again")
        for n in plan.nodes]
    for r in results:
        on_collect(r)
    return results


def finish(store: RunStore, run_id: str, sup: Supervisor, outcome: RunOutcome) -> RunStatus:
    """Record how the run ended; return the status recorded."""
    def ended(rec: RunRecord) -> RunRecord:
        rec = rec.seen(node_states(sup))
        if rec.status is RunStatus.STOPPED:  # `clusterddp stop` from another terminal: a stop, not a failure
            return replace(rec, ended_at=rec.ended_at or utcnow())
        return replace(rec, status=outcome.status, failed_host=outcome.first_failed, ended_at=utcnow())
    return store.update(run_id, ended).status


# How a script written for torch.distributed.launch asks for its local rank: argparse's
# add_argument("--local_rank", ...) or "--local-rank", in either quotes.
_LOCAL_RANK_ARG = re.compile(r"""(["'])--local[_-]rank\1""")


def local_rank_warning(spec: P.RunSpec) -> str | None:
    """A warning when the script parses ``--local_rank`` but ``--local-rank-arg`` is off: torchrun
    does not pass it, so every rank would get the argument's default (on GPUs, all the same device)."""
    if spec.local_rank_arg is not None:
        return None
    try:
        text = Path(spec.script).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    m = _LOCAL_RANK_ARG.search(text)
    if m is None:
        return None
    line = text.count("\n", 0, m.start()) + 1
    flag = m.group()[1:-1]
    return (f"warning: {spec.script}:{line} parses {flag}, which torchrun does not pass: every rank gets its "
            f"default. Add --local-rank-arg={flag} (or read os.environ['LOCAL_RANK'] in the script).")
