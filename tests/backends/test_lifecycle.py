"""One run's lifecycle, written once (clusterddp/backends/lifecycle.py), held with a fake backend: pure
logic, no network. Each test lists the steps in the order they ran, so a step skipped or moved
(finish before the collect, no after_end after a failure, logs left open on a Ctrl-C, keep_runs after
a refusal) fails by an assertion."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pytest

from clusterddp import backends, inventory
from clusterddp.backends import base, lifecycle
from clusterddp.backends.base import LaunchRequest, RunOutcome
from clusterddp.errors import NodeOutcome, RunFailed, UsageError
from clusterddp.inventory import Inventory
from clusterddp.record import NodeState, RunRecord, RunStatus
from clusterddp.runspec import RunSpec
from clusterddp.store import RunStore
from helpers import make_record, resolved

RUN = "20261206-070000-0001"


class SpyStore(RunStore):
    """A real run store that also notes, in ``steps``, the calls the lifecycle makes of it."""

    def __init__(self, root: Any, steps: list[str]) -> None:
        super().__init__(root)
        self.steps = steps

    def create(self, record: RunRecord) -> RunRecord:
        self.steps.append("create")
        return super().create(record)

    def close_logs(self) -> None:
        self.steps.append("close_logs")
        super().close_logs()

    def update(self, run_id: str, fn: Any) -> RunRecord:
        rec = super().update(run_id, fn)
        self.steps.append(f"recorded {rec.status.value}")
        return rec


@dataclass
class Plan:
    run_id: str


@dataclass
class Prep:
    plan: Plan
    store: SpyStore


@dataclass
class Said:
    """The events of a launch, noted in the same ``steps`` (the success line's seconds as N)."""

    steps: list[str]

    def say(self, line: str) -> None:
        self.steps.append("say: " + re.sub(r"in [0-9]+\.[0-9]s", "in Ns", line))

    def warn(self, line: str) -> None:
        self.steps.append("warn: " + line)

    def hosts(self, names: Any) -> None:
        self.steps.append("hosts")

    def output(self, host: str, data: bytes) -> None:
        self.steps.append("output")

    def collected(self, result: Any, source: str | None = None) -> None:
        self.steps.append("collected")

    def kept(self, kept: Any) -> None:
        self.steps.append("kept")


OK = RunOutcome(RunStatus.SUCCEEDED, (NodeOutcome("a", 0, 0), NodeOutcome("b", 1, 0)))


def _failed() -> RunFailed:
    return RunFailed(RUN, [NodeOutcome("a", 0, 1)], "a", RunStatus.FAILED, {})


class Fake(lifecycle.Launch[Prep]):
    """A backend's steps, each noted; ``raises[step]``: what that step raises; ``results``: what each
    attempt's execute returns or raises; ``more``: how many next attempts next_attempt grants."""

    def __init__(self, prep: Prep, req: LaunchRequest, events: Said, raises: dict[str, BaseException] | None = None,
                 results: list[RunOutcome | BaseException | None] | None = None, more: int = 0) -> None:
        super().__init__(prep, req, events)
        self.raises = raises or {}
        self.results = [OK] if results is None else results
        self.more = more

    def _step(self, name: str) -> None:
        self.prep.store.steps.append(name)
        if name in self.raises:
            raise self.raises[name]

    def ready(self) -> None:
        self._step("ready")

    def first_record(self) -> RunRecord:
        self._step("first_record")
        return make_record(RUN, hosts=("a", "b"))

    def give_back(self) -> None:
        self._step("give_back")

    def begin(self) -> None:
        self._step("begin")

    def execute(self) -> RunOutcome | None:
        self._step(f"execute {self.attempt}")
        got = self.results.pop(0)
        if isinstance(got, BaseException):
            raise got
        return got

    def after_failure(self) -> None:
        self._step("after_failure")

    def next_attempt(self) -> bool:
        self._step("next_attempt")
        if self.more <= 0:
            return False
        self.more -= 1
        self.prep.store.update(RUN, lambda r: make_record(RUN, hosts=("a", "c")))
        return True

    def after_detach(self) -> None:
        self._step("after_detach")

    def after_end(self) -> None:
        self._step("after_end")

    def release(self) -> None:
        self._step("release")


@pytest.fixture
def steps(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    noted: list[str] = []

    def keep_runs(inventory: Inventory, runs_dir: str, reach: Any = None) -> base.KeptRuns:
        noted.append("keep_runs")
        return base.KeptRuns("keep_runs 1: ")
    monkeypatch.setattr(base, "keep_runs", keep_runs)
    return noted


def launch(tmp_path: Any, steps: list[str], *, detach: bool = False, **fake: Any) -> Fake:
    inv = inventory.parse("hosts:\n  - {name: a, address: 10.0.0.1}\n", str(tmp_path / "inv.yaml"))
    req = LaunchRequest(inventory_arg=str(tmp_path / "inv.yaml"), inventory=inv, spec=resolved(RunSpec("t.py"), inv),
                        runs_dir=str(tmp_path / "runs"), detach=detach)
    return Fake(Prep(Plan(RUN), SpyStore(tmp_path / "runs", steps)), req, Said(steps), **fake)


def folder(tmp_path: Any) -> str:
    return str(tmp_path / "runs" / RUN)


# ---- Launch.run: the sequence of `up` ----

def test_an_attached_run_that_succeeds_takes_every_step_in_order(tmp_path, steps):
    run = launch(tmp_path, steps)
    assert run.run() is OK
    assert steps == ["ready", "first_record", "create", f"say: run {RUN}", "begin", "execute 1",
                     f"say: run {RUN} succeeded in Ns; run folder: {folder(tmp_path)}", "after_end", "release",
                     "keep_runs", "kept"]


def test_a_failed_run_is_ended_released_and_kept_then_its_failure_raised(tmp_path, steps):
    failure = _failed()
    run = launch(tmp_path, steps, results=[failure])
    with pytest.raises(RunFailed) as raised:
        run.run()
    assert raised.value is failure
    assert steps == ["ready", "first_record", "create", f"say: run {RUN}", "begin", "execute 1", "after_failure",
                     "next_attempt", "after_end", "release", "keep_runs", "kept"]


def test_a_next_attempt_runs_after_a_failed_one_and_the_success_names_its_hosts(tmp_path, steps):
    run = launch(tmp_path, steps, results=[_failed(), _failed(), OK], more=2)
    assert run.run() is OK
    assert steps == ["ready", "first_record", "create", f"say: run {RUN}", "begin",
                     "execute 1", "after_failure", "next_attempt", "recorded running",
                     "execute 2", "after_failure", "next_attempt", "recorded running", "execute 3",
                     f"say: run {RUN} succeeded in Ns on a, c (attempt 3); run folder: {folder(tmp_path)}",
                     "after_end", "release", "keep_runs", "kept"]


def test_a_run_refused_before_its_record_gives_back_what_it_took_and_says_and_keeps_nothing(tmp_path, steps):
    run = launch(tmp_path, steps, raises={"ready": UsageError("no", "fix it")})
    with pytest.raises(UsageError):
        run.run()
    assert steps == ["ready", "give_back", "release"]


def test_a_record_that_cannot_be_written_gives_back_what_ready_took(tmp_path, steps):
    run = launch(tmp_path, steps, raises={"first_record": OSError("disk full")})
    with pytest.raises(OSError):
        run.run()
    assert steps == ["ready", "first_record", "give_back", "release"]


def test_a_detached_run_says_how_to_follow_it_and_is_kept(tmp_path, steps):
    run = launch(tmp_path, steps, detach=True, results=[None])
    assert run.run() is None
    rd = f" --runs-dir {tmp_path / 'runs'}"
    assert steps == ["ready", "first_record", "create", f"say: run {RUN}", "begin", "execute 1",
                     f"say: detached; the job runs on without this command.\n"
                     f"  follow: clusterddp logs {RUN} --follow{rd}\n"
                     f"  status: clusterddp status {RUN}{rd}\n"
                     f"  stop:   clusterddp stop {RUN}{rd}",
                     "after_detach", "release", "keep_runs", "kept"]


def test_a_detached_run_names_the_job_as_its_backend_says():
    assert lifecycle.detached_words("slurm job 42", RUN, "").splitlines() == [
        "detached; slurm job 42 runs on without this command.",
        f"  follow: clusterddp logs {RUN} --follow", f"  status: clusterddp status {RUN}",
        f"  stop:   clusterddp stop {RUN}"]


def test_a_detached_run_that_fails_to_start_makes_no_next_attempt(tmp_path, steps):
    run = launch(tmp_path, steps, detach=True, results=[_failed()], more=1)
    with pytest.raises(RunFailed):
        run.run()
    assert "next_attempt" not in steps
    assert steps[-5:] == ["after_failure", "after_end", "release", "keep_runs", "kept"]


@pytest.mark.parametrize("at", ["begin", "execute 1"])
def test_a_ctrl_c_releases_the_run_and_neither_ends_nor_keeps_it(tmp_path, steps, at):
    run = launch(tmp_path, steps, raises={at: KeyboardInterrupt()})
    with pytest.raises(KeyboardInterrupt):
        run.run()
    assert steps[-2:] == [at, "release"]
    assert not {"after_end", "after_failure", "keep_runs", "give_back"} & set(steps)


# ---- lifecycle.end: the end of a watched run ----

def ended(tmp_path: Any, steps: list[str], outcome: RunOutcome, *, stopped: bool = False,
          collect: BaseException | None = None) -> RunOutcome:
    store = SpyStore(tmp_path / "runs", [])
    store.create(make_record(RUN, hosts=("a", "b")))
    store.steps = steps

    def collected() -> None:
        steps.append("collect")
        if collect is not None:
            raise collect

    def explain() -> tuple[str, ...]:
        steps.append("explain")
        return ("root cause: a",)

    def states() -> base.NodeStates:
        steps.append("states")
        return {n.host: (NodeState.of_exit_code(n.exit_code), n.exit_code, None) for n in outcome.nodes}
    return lifecycle.end(store, RUN, outcome, collect=collected, states=states, explain=explain,
                         warn=lambda line: steps.append("warn: " + line), stopped=stopped)


def test_the_end_closes_the_logs_then_records_the_outcome_then_collects(tmp_path):
    """The outcome before the collect: a launcher SIGKILLed during the collect leaves a record of what
    the job did, not `running` (tests/backends/ssh/test_interrupt_ssh.py on the bed)."""
    steps: list[str] = []
    assert ended(tmp_path, steps, OK) is OK
    assert steps == ["close_logs", "states", "recorded succeeded", "collect"]


def test_the_end_of_a_failed_run_records_it_then_raises_its_failure_with_the_root_cause(tmp_path):
    steps: list[str] = []
    bad = RunOutcome(RunStatus.FAILED, (NodeOutcome("a", 0, 3), NodeOutcome("b", 1, 0)), "a")
    with pytest.raises(RunFailed) as raised:
        ended(tmp_path, steps, bad)
    assert steps == ["close_logs", "states", "recorded failed", "collect", "explain"]
    assert raised.value.first_failed == "a" and raised.value.cause == ("root cause: a",)
    assert RunStore(tmp_path / "runs").load(RUN).status is RunStatus.FAILED


def test_the_end_of_a_stopped_run_closes_the_logs_records_it_and_collects_before_the_ctrl_c(tmp_path):
    steps: list[str] = []
    stopped = RunOutcome(RunStatus.STOPPED, (NodeOutcome("a", 0, None), NodeOutcome("b", 1, None)))
    with pytest.raises(KeyboardInterrupt):
        ended(tmp_path, steps, stopped, stopped=True)
    assert steps == ["close_logs", "states", "recorded stopped", "collect"]


def test_a_ctrl_c_during_the_collect_records_the_jobs_outcome_and_says_how_to_fetch_the_rest(tmp_path):
    steps: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        ended(tmp_path, steps, OK, collect=KeyboardInterrupt())
    assert steps == ["close_logs", "states", "recorded succeeded", "collect",
                     f"warn: [clusterddp] collect interrupted: the run is recorded succeeded; "
                     f"`clusterddp collect {RUN}` fetches its logs and files"]
    assert RunStore(tmp_path / "runs").load(RUN).status is RunStatus.SUCCEEDED


# ---- lifecycle.Basic: the verbs every backend writes alike, each asked of its control module ----

class Control:
    """A control module that answers each call with what it was asked."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: (name, args, kwargs)


class Backend(lifecycle.Basic):
    def control(self) -> Any:
        return Control()


@pytest.mark.parametrize(("method", "args", "asked"), [
    ("follow", ("S", "R", "out", ["a"], {"a": 2}), ("follow", ("S", "R", "out", ["a"], {"a": 2}), {})),
    ("status", ("S", "R", "on"), ("status", ("S", "R"), {"on_node": "on"})),
    ("describe", ("rec",), ("describe", ("rec",), {})),
    ("stop", ("S", "R", 7.5), ("stop", ("S", "R", 7.5), {})),
    ("collect", ("S", "R", "p", ("*.pt",)), ("collect", ("S", "R"), {"progress": "p", "globs": ("*.pt",)})),
    ("check", ("inv", 29600), ("check", ("inv", 29600), {})),
    ("stacks", ("S", "rec", 3.0), ("stacks", ("S", "rec", 3.0), {})),
    ("reach", ("S", "rec", "top"), ("reach", ("rec", "top"), {})),
])
def test_each_basic_verb_asks_the_backends_control_module_with_what_it_was_given(method, args, asked):
    assert getattr(Backend(), method)(*args) == asked


def test_logs_asks_the_control_modules_node_logs():
    seen: list[tuple] = []

    class Logs(lifecycle.Basic):
        def control(self) -> Any:
            class C:
                def node_logs(self, *args: Any) -> None:
                    seen.append(args)
            return C()
    assert Logs().logs("S", "R", ["a"], print) is None
    assert seen == [("S", "R", ["a"], print)]


@pytest.mark.parametrize("name", sorted(backends.BACKENDS))
def test_every_backend_writes_only_its_own_methods_and_leaves_the_rest_to_basic(name):
    """The verbs that start from a run record are written once (Basic); a backend class that writes one
    of them again (a delegating method copied back) fails here."""
    backend = backends.get(name)
    assert isinstance(backend, lifecycle.Basic)
    own = {m for m, v in vars(type(backend)).items() if callable(v) and not m.startswith("_")}
    basic = {m for m, v in vars(lifecycle.Basic).items() if callable(v) and not m.startswith("_")} - {"control"}
    assert basic >= {"follow", "status", "describe", "stop", "logs", "collect", "check", "stacks", "reach"}
    assert not own & basic, f"{name} writes again what lifecycle.Basic writes once: {sorted(own & basic)}"
    assert {"control", "prepare", "render", "launch"} <= own
    assert backend.control().__name__ == f"clusterddp.backends.{name}.control"
