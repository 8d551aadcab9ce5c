"""The seam every backend implements: what `up` asks of it (plan, render, launch), what the commands
that start from a run record ask (follow, status, stop, logs, collect, stacks, and ``reach``: the
run's nodes for `top` and `prune`), and `check`; the types they
share (the launch request, the events a launch reports, the run outcome) and the steps every backend
takes alike (the run record's first and last write, keep_runs).

A backend is a folder under ``clusterddp/backends/`` named once in the registry
(:mod:`clusterddp.backends`); the CLI talks to it only through :class:`Backend`, so it never says
which one it is. Nothing here prints: a launch tells :class:`Events`, which the CLI implements.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol, TypeVar

from .. import __version__
from ..errors import NodeOutcome, RunFailed, UsageError
from ..inventory import LOCAL, Inventory, NotifyTarget
from ..nodeops import Reach
from ..record import NodeRecord, NodeState, RunRecord, RunStatus
from ..runspec import ResolvedSpec, RunSpec, fanout_of
from ..store import RunStore, utcnow
from ..upload import DEFAULT_MAX_UPLOAD

if TYPE_CHECKING:
    from ..artifacts import CollectResult, Progress
    from ..check import Report
    from ..inventory.section import Section
    from ..prune import RunResult, Selection
    from ..stacks import Taken

NodeStates = Mapping[str, tuple[NodeState, int | None, str | None]]


@dataclass(frozen=True)
class RunOutcome:
    """How a run ended (a terminal :class:`RunStatus`), with every node's outcome."""

    status: RunStatus
    nodes: tuple[NodeOutcome, ...]
    first_failed: str | None = None

    @property
    def exit_code(self) -> int:
        code = self.status.exit_code
        assert code is not None, "a run outcome is never `running`"
        return code


@dataclass(frozen=True)
class Stopped:
    """What `stop` did: the record after it, how each reachable node's job ended, what was collected."""

    record: RunRecord
    how: dict[str, str]
    not_stopped: tuple[str, ...]   # hosts that may still run something of the run
    collected: list[CollectResult]


@dataclass(frozen=True)
class LaunchRequest:
    """Everything `up` (and `schedule add`, which checks the same) asks of a backend, parsed."""

    inventory_arg: str                           # as given: a path, or `local`
    inventory: Inventory                         # loaded
    spec: ResolvedSpec                           # resolved against ``inventory`` (cli.up.request)
    runs_dir: str
    hosts: list[str] | None = None               # --hosts (names; their GPU choice in ``slots``)
    slots: dict[str, tuple[int, ...]] | None = None
    exclude: list[str] | None = None
    max_upload: int = DEFAULT_MAX_UPLOAD
    detach: bool = False
    skip_check: bool = False
    join_timeout: float = 0.0
    wait: bool = False
    schedule: str | None = None                  # set by a cron entry: the schedule that started the run
    nodes: tuple[int, int] | None = None         # --nodes MIN:MAX (SSH runs: fewer nodes after a loss, down to MIN)
    resume: str | None = None                    # --resume RUN (clusterddp.resume), as given
    notify: tuple[NotifyTarget, ...] = ()        # resolved (clusterddp.notify.targets_for): told of a detached
                                                 # run's end by its node 0, where the backend can (detached_notify)
    env_files: tuple[str, ...] = ()              # -e @FILE's files, as given: never uploaded (secrets)

    @property
    def runs_dir_flag(self) -> str:
        """The ``--runs-dir`` that `status`/`logs`/`stop` need to find this run ('' for the default)."""
        from ..nodescript import q
        return f" --runs-dir {q(self.runs_dir)}" if self.runs_dir != "./runs" else ""


@dataclass(frozen=True)
class KeptRuns:
    """What keep_runs did after a run: the runs pruned, or why it could not."""

    lead: str                                    # "keep_runs N: ", the start of every line said of it
    results: list[RunResult] | None = None
    selection: Selection | None = None
    error: BaseException | None = None
    interrupted: bool = False


class Events(Protocol):
    """What a launch tells as it goes (the CLI prints it)."""

    def say(self, line: str) -> None:
        """A line for standard output."""

    def warn(self, line: str) -> None:
        """A line for standard error."""

    def hosts(self, names: Sequence[str]) -> None:
        """The run's hosts, once known (Slurm: once allocated)."""

    def output(self, host: str, data: bytes) -> None:
        """Bytes a node's job wrote."""

    def collected(self, result: CollectResult, source: str | None = None) -> None:
        """What was brought back from one host (``source``: where from, when not the host itself)."""

    def kept(self, kept: KeptRuns) -> None:
        """What keep_runs did."""


class Prepared(Protocol):
    """A planned run: the backend's own plan (``plan.run_id``, ``plan.inventory``) and its run store."""

    @property
    def plan(self) -> Any: ...

    @property
    def store(self) -> RunStore: ...


def on_hosts(backend: Backend[Any], verb: str, inventory: Inventory) -> None:
    """A UsageError (exit 2) when ``verb`` (a command that runs on an inventory's hosts themselves:
    :attr:`Backend.host_verbs`) is not one ``backend`` can do for ``inventory``."""
    if verb not in backend.host_verbs:
        raise UsageError(f"{verb}: not available for a `{backend.name}:` inventory ({inventory.path}): it lists "
                         "no hosts to run it on", "run it on an inventory that lists the hosts")


def cannot(backend: str, verb: str, rec: RunRecord, why: str, instead: str) -> UsageError:
    """The refusal of a verb a backend cannot do for a run (exit 2): which run, which backend, why, and
    what to do instead; never an internal error about how a node would be reached."""
    return UsageError(f"{verb}: run {rec.run_id} is a {backend} run, {why}", instead)


PrepT = TypeVar("PrepT", bound=Prepared)


class Backend(Protocol[PrepT]):
    """One way of running jobs (SSH and `local`; Slurm), typed in its own plan (``PrepT``: what its
    ``prepare`` returns and its ``render`` and ``launch`` take). Every method raises the errors of
    :mod:`clusterddp.errors` (UsageError for bad input, RunFailed for a failed run, HostError...).
    :class:`.lifecycle.Basic` writes the methods every backend does alike."""

    name: str
    checks: frozenset[str]  # the checks besides the default one it runs: "collective", "diff"
    detached_notify: bool   # a detached run's node 0 tells its end to the request's webhooks (`notify`)
    host_verbs: frozenset[str]  # the commands that run on its inventory's hosts themselves: "exec", "leases"

    def section(self) -> Section | None:
        """Its part of an inventory file (a top-level key named as the backend, such as ``slurm:``: its
        rules, its settings, its part of the JSON Schema and docs), or None: its inventories list hosts.
        Its part of run.json is its own too: :class:`clusterddp.record.BackendPart`, written by its
        launch and read back by its verbs."""
        ...

    def secrets(self, inventory: Inventory) -> tuple[tuple[str, str], ...]:
        """The env values of ``inventory`` that `up --dry-run` hides (its hosts', or its section's)."""
        ...

    def prepare(self, req: LaunchRequest, *, contact: bool = False) -> PrepT:
        """Validate the request and plan the run; no network unless ``contact`` (then only what the
        plan needs: a Slurm login host's home)."""
        ...

    def render(self, prep: PrepT, req: LaunchRequest, *, full: bool = True) -> str:
        """What ``up --dry-run`` prints: what each node runs (``full``: every script and command exactly
        as a real run executes them; otherwise a summary a person reads), what it uploads and leaves out."""
        ...

    def launch(self, prep: PrepT, req: LaunchRequest, events: Events) -> RunOutcome | None:
        """The whole `up` (:meth:`.lifecycle.Launch.run`); None when detached."""
        ...

    def follow(self, store: RunStore, run_id: str, on_output: Callable[[str, bytes], None],
               hosts: list[str] | None, from_lines: dict[str, int]) -> dict[str, int | None]:
        """Stream each node's log from ``from_lines[host]`` until the job ends; the exit codes."""
        ...

    def status(self, store: RunStore, run_id: str,
               on_node: Callable[[NodeRecord], None] | None = None) -> RunRecord:
        """Ask where the run stands; record it. ``on_node(node)``: each node as it is seen (as the record
        will hold it), one call at a time, as soon as it answers."""
        ...

    def describe(self, rec: RunRecord) -> str | None:
        """A line `status` adds about the run as a whole (Slurm: its job), or None."""
        ...

    def stop(self, store: RunStore, run_id: str, grace: float) -> Stopped:
        """End the run, mark it stopped, collect its logs."""
        ...

    def logs(self, store: RunStore, run_id: str, hosts: list[str] | None,
             show: Callable[[str, str, BinaryIO | None], None]) -> None:
        """Each node's full log: ``show(host, source, file)`` in the run's host order."""
        ...

    def collect(self, store: RunStore, run_id: str, progress: Progress | None = None,
                globs: tuple[str, ...] | None = None) -> list[CollectResult]:
        """Bring back the logs and the collect globs (the run's, or ``globs`` instead), verified."""
        ...

    def check(self, inventory: Inventory, master_port: int | None = None) -> Report:
        """`clusterddp check`: will this inventory run a job?"""
        ...

    def stacks(self, store: RunStore, rec: RunRecord, wait: float) -> Taken:
        """`clusterddp stacks`: every node of the running run ``rec`` runs the node program
        ``stacks`` (:func:`clusterddp.stacks.node_command`), all at once, each bounded in time; the
        answers as :func:`clusterddp.stacks.taken_from` reads them (a node that did not answer named).
        A UsageError when the run turns out to have ended (:func:`clusterddp.stacks.ended_error`)."""
        ...

    def reach(self, store: RunStore, rec: RunRecord, verb: str) -> Reach:
        """The nodes of the run ``rec`` records, for ``verb`` (``top``, ``prune``) to send each one
        command; the record is not written. A UsageError (:func:`cannot`) when this backend cannot do
        ``verb`` for this run now (a Slurm job that has not started, or has ended: no node to reach)."""
        ...


# ---- what every backend does alike ----

def new_record(inventory_arg: str, spec: RunSpec, run_id: str, *, schedule: str | None, local: bool,
               master_addr: str, master_port: int, collect: Sequence[str], nodes: Sequence[NodeRecord] = (),
               **extra: Any) -> RunRecord:
    """The run's record as `up` first writes it, running: what was asked (``inventory_arg`` as given,
    ``spec``, the schedule that started it), and what the backend planned (its nodes, or none yet;
    ``extra``: the record's fields that the backend fills, such as ``fanout``, or ``backend``: its own part)."""
    inventory = inventory_arg if inventory_arg == LOCAL else str(Path(inventory_arg).resolve())
    return RunRecord(
        run_id=run_id, name=spec.name, inventory=inventory, script=spec.script, args=tuple(spec.script_args),
        status=RunStatus.RUNNING, failed_host=None, schedule=schedule, local=local,
        started_at=utcnow("milliseconds"),  # listed newest first: two runs of one second in their order
        ended_at=None, launch_dir=os.getcwd(), master_addr=master_addr, master_port=master_port,
        collect=tuple(collect), nodes=tuple(nodes), version=__version__, **extra)


def run_failed(store: RunStore, run_id: str, outcome: RunOutcome, status: RunStatus,
               explain: Callable[[], tuple[str, ...]]) -> RunFailed:
    """The error of a run recorded ``status`` (not succeeded): each node in the words `status` will
    print, and for a failed run the root cause (``explain``, the backend's diagnosis)."""
    said = {n.host: n.describe() for n in store.load(run_id).nodes}
    cause = explain() if status is RunStatus.FAILED else ()
    failure = store.load(run_id).failure if cause else None  # the diagnosis explain() recorded
    return RunFailed(run_id, list(outcome.nodes), outcome.first_failed, status, said, cause=cause,
                     root=failure.host if failure is not None else None)


def finish(store: RunStore, run_id: str, states: NodeStates, outcome: RunOutcome) -> RunStatus:
    """Record how the run ended (each node's state as the backend saw it); return the status recorded.
    A run `clusterddp stop` ended from another terminal stays stopped: a stop, not a failure."""
    def ended(rec: RunRecord) -> RunRecord:
        rec = rec.seen(dict(states))
        if rec.status is RunStatus.STOPPED:
            return replace(rec, ended_at=rec.ended_at or utcnow())
        return replace(rec, status=outcome.status, failed_host=outcome.first_failed, ended_at=utcnow())
    return store.update(run_id, ended).status


def load_inventory(arg: str, gpus: int | None = None, hosts: list[str] | None = None,
                   exclude: list[str] | None = None, fanout: int | None = None) -> Inventory:
    """The inventory a command names: a file, or ``local`` (this machine, with ``--gpus`` processes or
    one per GPU, run by this python); a backend's section of the file (``slurm:``) read by that
    backend (the registry's sections). Narrowed as :func:`clusterddp.inventory.load_named`; ``fanout``
    (--fanout) over the inventory's: :func:`clusterddp.runspec.fanout_of`."""
    from .. import inventory as inv_mod
    from . import inventory_section
    inv = inv_mod.load_named(arg, gpus, hosts, exclude, sections=inventory_section)
    return replace(inv, fanout=fanout_of(fanout, inv))


DRY_RUN_ID = "RUN_ID"  # what a dry run shows for the run id: it records no run, so it has none
MASK = "***"


def dry_run_text(text: str, run_id: str, hidden: tuple[tuple[str, str], ...]) -> str:
    """What ``up --dry-run`` prints of the backend's rendering: the run id it planned with (never
    recorded) as :data:`DRY_RUN_ID`, and each ``export NAME=VALUE`` of ``hidden`` as ``NAME=***``
    (``--show-secrets`` hides none). The plan is the one a real run executes; only its words change."""
    import re

    from ..nodescript import q
    text = text.replace(run_id, DRY_RUN_ID)
    if text.startswith(f"run {DRY_RUN_ID}\n"):  # the backend's first line names the run
        text = (f"run {DRY_RUN_ID} (a dry run: nothing is started or recorded; a real run gets an id of its own)"
                + text[len(f"run {DRY_RUN_ID}"):])
    masked = 0
    for name, value in hidden:
        text, n = re.subn(re.escape(f"export {name}={q(value)}") + r"(?=\s|$)", f"export {name}={MASK}", text,
                          flags=re.MULTILINE)
        masked += n
    if masked:
        text += f"\n(env values are shown as {MASK}; --show-secrets shows them)"
    return text


def check_script(path: str) -> Path:
    """The training script as a Path; a UsageError (exit 2) naming it when it is a folder or missing."""
    script = Path(path)
    if script.is_dir():
        raise UsageError(f"script {path}: is a directory, not a script", _script_in(script))
    if not script.is_file():
        near = _near(script)
        raise UsageError(f"script {path}: no such file" + (f"; did you mean {near}?" if near else ""),
                         "pass the path of your training script")
    return script


def _near(script: Path, most: int = 2000) -> str | None:
    """The file of ``script``'s folder whose name is closest to its name (a misspelt ``trian.py``), or
    None; the folder's first ``most`` entries are read, no more."""
    import difflib
    import itertools
    folder = script.parent
    try:
        names = [p.name for p in itertools.islice(folder.iterdir(), most) if p.is_file()]
    except OSError:
        return None
    close = difflib.get_close_matches(script.name, names, n=1, cutoff=0.6)
    return str(folder / close[0]) if close else None


def _script_in(folder: Path) -> str:
    """What to pass instead of a folder: its Python files (the folder itself is uploaded with the script)."""
    try:
        found = sorted(p.name for p in folder.iterdir() if p.suffix == ".py" and p.is_file())
    except OSError:
        found = []
    shown = ", ".join(str(folder / name) for name in found[:5]) + (", ..." if len(found) > 5 else "")
    return ("pass the training script inside it" + (f" (one of: {shown})" if found else "")
            + "; the script's whole folder is uploaded with it")


# How a script written for torch.distributed.launch asks for its local rank: argparse's
# add_argument("--local_rank", ...) or "--local-rank", in either quotes.
_LOCAL_RANK_ARG = re.compile(r"""(["'])--local[_-]rank\1""")


def local_rank_warning(spec: RunSpec) -> str | None:
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


def failed_run(store: RunStore, run_id: str) -> None:
    """Record a run that ended before its job could start (nothing submitted or started): failed, not
    `running` forever."""
    store.update(run_id, lambda rec: replace(rec, status=RunStatus.FAILED, ended_at=rec.ended_at or utcnow())
                 if rec.status is RunStatus.RUNNING else rec)


def keep_runs(inventory: Inventory, runs_dir: str,
              reach: Callable[[RunStore, RunRecord], Reach] | None = None) -> KeptRuns | None:
    """After `up`: prune the inventory's runs to its ``keep_runs`` newest, their nodes reached as
    ``reach`` says (the backend's :meth:`Backend.reach`; None: the recorded hosts). Best effort: what
    goes wrong is in the answer, never the run's outcome. None when the inventory keeps every run."""
    if not inventory.keep_runs:
        return None
    lead = f"keep_runs {inventory.keep_runs}: "
    try:
        from .. import prune as pruning
        store = RunStore(runs_dir)
        sel = pruning.select(
            store, pruning.Policy(keep=inventory.keep_runs, inventory=str(Path(inventory.path).resolve()))
        )
        if not (sel.remove or sel.running or sel.damaged):
            return KeptRuns(lead)
        reached = None if reach is None else lambda rec: reach(store, rec)
        return KeptRuns(lead, pruning.prune(store, sel, reach=reached), sel)
    except KeyboardInterrupt:
        return KeptRuns(lead, interrupted=True)
    except Exception as e:  # noqa: BLE001 - never the run's outcome
        return KeptRuns(lead, error=e)
