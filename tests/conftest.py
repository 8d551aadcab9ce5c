"""Shared fixtures: SSH test beds of network-namespace nodes (see tests/testbed.py).

CI time is a budget (issue 22): every `up` on a bed costs seconds of both cores (torchrun and each rank
import torch). A new bed test should, in this order:
1. assert on a run that exists already: a fixture of module scope makes the run once (on the session
   ``bed``) and each test asserts on its result; tests/timings.py keeps a module's users of such a
   fixture on one worker, in order, so the run is made once, not once per worker;
   across modules, ``shared_runs(key, make)`` (session scope) with ``@pytest.mark.xdist_group(key)``
   on every test that uses it does the same;
2. otherwise be short: 1-step jobs, ``--gpus 1`` where 2 processes per node prove nothing more, one node
   where two prove nothing more; wait on the nodes' own files (``bed.wait_until_written``) rather than
   asking the CLI once a second, then assert what the CLI says;
3. and take a private bed (``make_bed``) only to break something (cut a link, change a host key).
Times: ``PYTEST_TIMINGS=FILE`` streams them, ``python tests/timings.py --write FILE`` adds them to
tests/durations.json (the order CI runs tests in: longest first)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# The tests mirror the package's tree (tests/backends/slurm/, tests/node/, ...). Every test folder is
# on sys.path, whatever the collection order or import mode, so `from testbed import ...` and a test
# module's helpers (`from test_plan import golden`) are found from any folder.
_TESTS = Path(__file__).resolve().parent
for _dir in sorted({_TESTS, *(p.parent for p in _TESTS.rglob("test_*.py"))}, reverse=True):
    if str(_dir) not in sys.path:
        sys.path.insert(0, str(_dir))

from ci_skips import in_ci  # noqa: E402
from slurmbed import SlurmBed, missing_slurm  # noqa: E402
from testbed import TestBed, require_bed, session_slot  # noqa: E402

# In CI a skipped integration test is a failure (see ci_skips.py); PYTEST_TIMINGS=FILE streams
# every test phase's time to FILE (see timings.py).
pytest_plugins = ["ci_skips", "timings"]


@pytest.fixture(autouse=True)
def _own_state(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test its own $XDG_STATE_HOME (inherited by every CLI it runs): the launching machine's state,
    such as the quarantine of machines lost twice in a row, never leaks from one test to the next (test
    beds reuse their addresses)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
    # and the working folder back as it was after the test (a node program called in-process, such as
    # node/collect.py, changes into its run folder): a later test's relative path must not depend on the order
    monkeypatch.chdir(os.getcwd())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    if call.when == "call" and outcome.get_result().failed:
        item.stash[_FAILED] = True


_FAILED = pytest.StashKey[bool]()


@pytest.fixture(autouse=True)
def _failed_runs_stopped(request: pytest.FixtureRequest) -> Iterator[None]:
    """A bed test that fails half-way may leave its detached run going on the session bed, holding its
    slots and ports: the next test there is then refused, a second failure that hides the first. So when a
    test that used ``bed`` fails, each run still recorded as running under its tmp_path is stopped, with
    the real `clusterddp stop` (a passing test must end its runs itself: this never hides that)."""
    yield
    tmp = getattr(request.node, "funcargs", {}).get("tmp_path")
    if "bed" not in request.fixturenames or tmp is None or not request.node.stash.get(_FAILED, False):
        return
    import json

    from helpers import cddp
    for rec in Path(tmp).rglob("run.json"):
        try:
            running = json.loads(rec.read_text()).get("status") == "running"
        except (OSError, ValueError):
            continue
        if running:
            cddp("stop", rec.parent.name, "--runs-dir", str(rec.parent.parent), "--grace", "2", timeout=120)


@pytest.fixture
def receiver() -> Iterator[Callable]:
    """``receiver(answer, host="127.0.0.1")``: a real HTTP server on ``host`` that answers every POST with
    ``answer`` (None: never), for notification tests (test_notify.Receiver); closed when the test ends.
    The bed's nodes reach this machine at ``bed.gateway`` (not at its 127.0.0.1)."""
    from test_notify import Receiver
    made: list[Receiver] = []

    def make(answer: int | None = 200, host: str = "127.0.0.1") -> Receiver:
        made.append(Receiver(answer, host))
        return made[-1]
    yield make
    for r in made:
        r.close()


def pytest_configure(config: pytest.Config) -> None:
    # Markers live here, not in pyproject.toml, so this file is self-contained.
    config.addinivalue_line("markers", "integration: needs root and the namespace SSH test bed")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")


def _require_bed() -> None:
    require_bed()


@pytest.fixture(scope="session")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestBed]:
    """Two SSH nodes shared by the whole session (prefix cd<slot>s, subnet 10.<100+slot>.0.0/24).

    Tests must leave it as they found it; tests that break nodes (cut links,
    change host keys) should use make_bed instead.
    """
    _require_bed()
    slot = session_slot()
    with TestBed(2, tmp_path_factory.mktemp("bed"), prefix=f"cd{slot}s", subnet=f"10.{100 + slot}.0") as b:
        yield b


@pytest.fixture(scope="session")
def shared_runs() -> Callable[[str, Callable[[], object]], object]:
    """``shared_runs(key, make)``: ``make()``'s result, made once per worker for the whole session and
    handed to every later caller with the same key (a failure too: raised again, not retried). Mark every
    test that asks for one key ``@pytest.mark.xdist_group(key)``, so they all run on one worker."""
    made: dict[str, tuple[bool, object]] = {}

    def get(key: str, make: Callable[[], object]) -> object:
        if key not in made:
            try:
                made[key] = (True, make())
            except Exception as e:
                made[key] = (False, e)
        ok, value = made[key]
        if not ok:
            raise value  # type: ignore[misc]
        return value
    return get


@pytest.fixture
def make_bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[int], TestBed]]:
    """Factory: make_bed(n) starts a private n-node bed, stopped when the test ends.

    The k-th bed of a test gets prefix cd<slot>b<k> and subnet 10.<100+slot>.<1+k>, distinct
    from the session bed, from each other and from other test sessions on this machine;
    later tests of this session reuse the names after teardown.
    """
    _require_bed()
    beds: list[TestBed] = []

    def make(n: int) -> TestBed:
        k, slot = len(beds), session_slot()
        b = TestBed(n, tmp_path_factory.mktemp(f"bed{n}n"), prefix=f"cd{slot}b{k}", subnet=f"10.{100 + slot}.{1 + k}")
        beds.append(b)  # before start(), so a half-started bed is still stopped
        return b.start()

    try:
        yield make
    finally:
        errors = []
        for b in reversed(beds):
            try:
                b.stop()
            except Exception as e:  # stop the other beds anyway
                errors.append(e)
        if errors:
            raise errors[0]


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmBed]:
    """A real Slurm cluster (munged, slurmctld, slurmd node-1 and node-2) on a 2-node bed of its own
    (prefix cd<slot>m, subnet 10.<100+slot>.250.0/24), shared by the session; see slurmbed.py.

    Tests must leave it as they found it: no job left in the queue, the partition up.
    """
    _require_bed()
    reason = missing_slurm()
    if reason:
        if in_ci():
            pytest.fail(f"Slurm test bed unavailable in CI: {reason}", pytrace=False)
        pytest.skip(f"Slurm test bed unavailable: {reason}")
    slot = session_slot()
    with TestBed(2, tmp_path_factory.mktemp("slurmbed"), prefix=f"cd{slot}m", subnet=f"10.{100 + slot}.250") as b:
        with SlurmBed(b, slot) as s:
            yield s
