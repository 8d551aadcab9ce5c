"""One run's lifecycle, written once for every backend; a backend fills in its steps.

- :class:`Launch` is `up` (torch elastic's ``SimpleElasticAgent._invoke_run``): :meth:`Launch.run` is
  the one sequence, and a backend's subclass fills in its steps (its plan typed: ``Launch[PrepT]``).
  The words every run says (``run RUN_ID``, ``detached; ...``, ``run RUN_ID succeeded in Ns``) are here.
- :func:`end` is the end of a run that was watched to its end: logs closed, collected, recorded, and
  raised (a Ctrl-C, or RunFailed).
- :class:`Basic` is the methods of :class:`~.base.Backend` that every backend writes alike (pre-commit's
  ``lang_base.basic_*``): the verbs that start from a run record and `check`, each asking the backend's
  own :class:`Control` module.

Nothing here prints: what a run says goes to its :class:`~.base.Events`.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, BinaryIO, Generic, Protocol, TypeVar

from ..errors import RunFailed
from ..record import RunStatus
from . import base
from .base import RunOutcome

if TYPE_CHECKING:
    from ..artifacts import CollectResult, Progress
    from ..check import Report
    from ..inventory import Inventory
    from ..nodeops import Reach
    from ..record import NodeRecord, RunRecord
    from ..stacks import Taken
    from ..store import RunStore

PrepT = TypeVar("PrepT", bound=base.Prepared)


class Launch(ABC, Generic[PrepT]):
    """One `up` of a backend, from its plan to its record. :meth:`run` is the sequence, the same for
    every backend; a subclass fills in the steps it must (:meth:`ready`, :meth:`first_record`,
    :meth:`execute`) and keeps the defaults (nothing to do) of those it need not. A step may replace
    :attr:`prep` (a lease, a next attempt plan the run anew); the store and the run id stay."""

    def __init__(self, prep: PrepT, req: base.LaunchRequest, events: base.Events) -> None:
        self.prep = prep
        self.req = req
        self.events = events
        self.attempt = 1  # the attempt :meth:`execute` runs (a backend that makes no other: always 1)

    @property
    def run_id(self) -> str:
        run_id: str = self.prep.plan.run_id
        return run_id

    def run(self) -> RunOutcome | None:
        """The whole `up`, in this order:

        1. :meth:`ready`: what comes before the record (checks, the upload, a lease). A refusal here
           records nothing and says no run id: :meth:`give_back` returns what ready took.
        2. The record's first write (:meth:`first_record`), then ``run RUN_ID`` said: from here `logs`
           and `status` find the run.
        3. :meth:`begin`: what the backend says and does before the job starts.
        4. :meth:`execute`, an attempt: start; unless detached, watch to the end (:func:`end`). After a
           failed one (RunFailed): :meth:`after_failure`, then, unless detached, :meth:`next_attempt`
           (True: execute again).
        5. The words of the end: for a detached run, how to follow, look at and stop it, then
           :meth:`after_detach`; for an attached one, ``run RUN_ID succeeded in Ns``, then
           :meth:`after_end` (also after the last failed attempt).
        6. :meth:`release`, whatever happened. From the record's first write to here the run's in-use lock
           is held (:meth:`.RunStore.hold`): a `prune` in another process leaves the run alone meanwhile.
        7. keep_runs, after a run that ended (succeeded, failed or detached; not after a refusal or a
           Ctrl-C), then the failure is raised.

        Returns the outcome (None when detached); raises RunFailed (exit 1) for a failed run,
        KeyboardInterrupt after a Ctrl-C, and what a step raises."""
        outcome: RunOutcome | None = None
        failure: RunFailed | None = None
        held = None  # the run's in-use lock, from its record's first write to the end (no prune meanwhile)
        try:
            try:
                self.ready()
                self.prep.store.create(self.first_record())
                held = self.prep.store.hold(self.run_id)
            except BaseException:
                self.give_back()
                raise
            self.events.say(f"run {self.run_id}")
            self.begin()
            started = time.monotonic()
            try:
                outcome = self._attempts()
            except RunFailed as e:
                failure = e
                self.after_end()
            else:
                if self.req.detach:
                    self.events.say(detached_words(self.detached_job(), self.run_id, self.req.runs_dir_flag))
                    self.after_detach()
                else:
                    self.events.say(self._succeeded(time.monotonic() - started))
                    self.after_end()
        finally:
            self.release()
            if held is not None:
                held.close()
        from . import reach  # each run pruned is reached by the backend that ran it
        kept = base.keep_runs(self.req.inventory, self.req.runs_dir, lambda store, rec: reach(store, rec, "prune"))
        if kept is not None:
            self.events.kept(kept)
        if failure is not None:
            raise failure  # a failed run is a run: it counted among the kept
        return outcome

    def _attempts(self) -> RunOutcome | None:
        while True:
            try:
                return self.execute()
            except RunFailed:
                self.after_failure()
                if self.req.detach or not self.next_attempt():
                    raise
                self.attempt += 1

    def _succeeded(self, seconds: float) -> str:
        hosts = ""
        if self.attempt > 1:  # the hosts of the attempt that succeeded, as recorded
            hosts = f" on {', '.join(self.prep.store.load(self.run_id).hosts)} (attempt {self.attempt})"
        return (f"run {self.run_id} succeeded in {seconds:.1f}s{hosts}; "
                f"run folder: {self.prep.store.run_dir(self.run_id)}")

    # ---- the steps a backend fills in ----

    @abstractmethod
    def ready(self) -> None:
        """Everything before the record: may refuse the run (bad input, a failed preflight, slots taken)."""

    @abstractmethod
    def first_record(self) -> RunRecord:
        """The run's record as `up` first writes it (:func:`.base.new_record`)."""

    @abstractmethod
    def execute(self) -> RunOutcome | None:
        """Attempt :attr:`attempt`: start the job; unless detached, watch it to its end (:func:`end`).
        None when detached; RunFailed when it failed; KeyboardInterrupt after a Ctrl-C."""

    # ---- the steps with a default (nothing to do) ----

    def give_back(self) -> None:
        """After a refusal before the record: what :meth:`ready` took (a lease, connections) given back."""

    def begin(self) -> None:
        """Once the run is recorded and said, before its job starts."""

    def after_failure(self) -> None:
        """After each failed attempt, before a next one is considered."""

    def next_attempt(self) -> bool:
        """After a failed attempt of an attached run: plan, record and say the next one and return
        True, or return False when the run ends there."""
        return False

    def detached_job(self) -> str:
        """What the detached words name as running on (``detached; the job runs on ...``)."""
        return "the job"

    def after_detach(self) -> None:
        """After the detached words."""

    def after_end(self) -> None:
        """After the run ended: succeeded (its words said), or failed (before its failure is raised);
        not after a detach."""

    def release(self) -> None:
        """Last, whatever happened: what the run held while `up` ran (a tarball, a connection)."""


def detached_words(job: str, run_id: str, runs_dir_flag: str) -> str:
    """What `up --detach` says once the job runs: that it runs on, and the commands that follow, look
    at and stop it (``runs_dir_flag``: the ``--runs-dir`` they need)."""
    rd = runs_dir_flag
    return (f"detached; {job} runs on without this command.\n"
            f"  follow: clusterddp logs {run_id} --follow{rd}\n"
            f"  status: clusterddp status {run_id}{rd}\n"
            f"  stop:   clusterddp stop {run_id}{rd}")


def end(store: RunStore, run_id: str, outcome: RunOutcome, *, collect: Callable[[], object],
        states: Callable[[], base.NodeStates], explain: Callable[[], tuple[str, ...]],
        warn: Callable[[str], None], stopped: bool = False) -> RunOutcome:
    """The end of a run watched to its end (``stopped``: by a Ctrl-C), in this order: its logs closed
    here, the outcome recorded (:func:`.base.finish`, with each node's ``states()``), ``collect()``
    (every node's log and files brought back), then KeyboardInterrupt when ``stopped``, RunFailed
    (exit 1, with ``explain()``'s root cause) when the record says it did not succeed, else the outcome.
    The outcome is recorded before the collect, so a launcher killed during it (SIGKILL, a closed
    laptop) leaves a record of what the job did, not ``running``. A Ctrl-C during the collect keeps
    that record (a run that succeeded everywhere stays succeeded: the collect, not the job, was cut
    short), says how to fetch the rest (``warn``), and is raised again."""
    store.close_logs()  # the collect replaces each node's log with its whole copy
    status = base.finish(store, run_id, states(), outcome)
    try:
        collect()
    except KeyboardInterrupt:
        warn(f"[clusterddp] collect interrupted: the run is recorded {status}; "
             f"`clusterddp collect {run_id}` fetches its logs and files")
        raise
    if stopped:
        raise KeyboardInterrupt
    if status is not RunStatus.SUCCEEDED:
        raise base.run_failed(store, run_id, outcome, status, explain)
    return outcome


class Control(Protocol):
    """A backend's ``control`` module: what it does for the verbs that start from a run record, and
    `check` (its functions, as :class:`~.base.Backend`'s methods of those names say; ``logs`` is
    ``node_logs``)."""

    def follow(self, store: RunStore, run_id: str, on_output: Callable[[str, bytes], None],
               hosts: list[str] | None, from_lines: dict[str, int]) -> dict[str, int | None]: ...

    def status(self, store: RunStore, run_id: str, *,
               on_node: Callable[[NodeRecord], None] | None = None) -> RunRecord: ...

    def stop(self, store: RunStore, run_id: str, grace: float) -> base.Stopped: ...

    def node_logs(self, store: RunStore, run_id: str, hosts: list[str] | None,
                  show: Callable[[str, str, BinaryIO | None], None]) -> None: ...

    def collect(self, store: RunStore, run_id: str, *, progress: Progress | None = None,
                globs: tuple[str, ...] | None = None) -> list[CollectResult]: ...

    def stacks(self, store: RunStore, rec: RunRecord, wait: float) -> Taken: ...

    def reach(self, rec: RunRecord, verb: str) -> Reach: ...

    def check(self, inventory: Inventory, master_port: int | None = None) -> Report: ...

    def describe(self, rec: RunRecord) -> str | None: ...


class Basic(ABC):
    """The :class:`~.base.Backend` methods every backend writes alike: each asks the backend's
    :meth:`control` module (their contracts are :class:`~.base.Backend`'s). A backend adds ``prepare``,
    ``render`` and ``launch`` (its :class:`Launch`)."""

    @abstractmethod
    def control(self) -> Control:
        """The backend's control module, imported when first asked (``clusterddp --help`` imports none)."""

    def follow(self, store: RunStore, run_id: str, on_output: Callable[[str, bytes], None],
               hosts: list[str] | None, from_lines: dict[str, int]) -> dict[str, int | None]:
        return self.control().follow(store, run_id, on_output, hosts, from_lines)

    def status(self, store: RunStore, run_id: str,
               on_node: Callable[[NodeRecord], None] | None = None) -> RunRecord:
        return self.control().status(store, run_id, on_node=on_node)

    def describe(self, rec: RunRecord) -> str | None:
        return self.control().describe(rec)

    def stop(self, store: RunStore, run_id: str, grace: float) -> base.Stopped:
        return self.control().stop(store, run_id, grace)

    def logs(self, store: RunStore, run_id: str, hosts: list[str] | None,
             show: Callable[[str, str, BinaryIO | None], None]) -> None:
        self.control().node_logs(store, run_id, hosts, show)

    def collect(self, store: RunStore, run_id: str, progress: Progress | None = None,
                globs: tuple[str, ...] | None = None) -> list[CollectResult]:
        return self.control().collect(store, run_id, progress=progress, globs=globs)

    def check(self, inventory: Inventory, master_port: int | None = None) -> Report:
        return self.control().check(inventory, master_port)

    def stacks(self, store: RunStore, rec: RunRecord, wait: float) -> Taken:
        return self.control().stacks(store, rec, wait)

    def reach(self, store: RunStore, rec: RunRecord, verb: str) -> Reach:
        return self.control().reach(rec, verb)

