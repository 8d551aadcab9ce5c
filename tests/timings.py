"""pytest plugin: test times, measured and used, for keeping CI in its budget (issue 22).

Two jobs:

1. **Measure.** With ``PYTEST_TIMINGS=FILE`` set, each worker (pytest-xdist or not) appends one line
   per test phase as it ends: ``{"id", "phase", "start", "s", "worker", "outcome"}`` (``start`` in
   epoch seconds, so a run's schedule can be drawn afterwards: which worker ran what, and when each
   went idle). Lines are written whole with O_APPEND, so workers never interleave; a run killed
   midway keeps what it did.

2. **Schedule.** Under pytest-xdist, the tests are put in the order that makes the workers finish
   together: the longest *unit* first (longest-processing-time-first), the many short unit tests last,
   where they fill the gaps. Known times come from ``tests/durations.json`` (written by
   ``python tests/timings.py --write FILE.jsonl``); a test it does not know yet counts as
   :data:`NEW_INTEGRATION_S` if marked ``integration`` (so a new bed test starts early, never last)
   and :data:`NEW_UNIT_S` otherwise. A unit is what must stay on one worker, in collection order:
   - the tests marked ``xdist_group(name)`` (tests that assert on one shared run, a fixture of
     module, class or session scope: name the group, and ``--dist loadgroup`` keeps them together);
   - every test of a module that uses a fixture of module or class scope (the shared run is made
     once, not once per worker), grouped automatically under the module's path;
   - otherwise one test.
   scripts/test.sh runs ``--dist loadgroup``, which hands one unit at a time to the next free worker.

``python tests/timings.py FILE`` prints per-worker, per-file and per-test totals of a timings file.

PYTEST_DONT_REWRITE (conftest.py imports this module before pytest loads it as a plugin)
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).resolve().parent / "durations.json"
NEW_INTEGRATION_S = 30.0  # a bed test not in durations.json yet: among the first to start
NEW_UNIT_S = 0.5


# ---------------------------------------------------------------- measure

def _worker() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = os.environ.get("PYTEST_TIMINGS")
    # Under xdist the controller sees its workers' reports again (with a `node`): they were written already.
    if not path or (os.environ.get("PYTEST_XDIST_WORKER") is None and getattr(report, "node", None) is not None):
        return
    line = json.dumps({"id": report.nodeid, "phase": report.when, "start": round(report.start, 3),
                       "s": round(report.duration, 3), "worker": _worker(), "outcome": report.outcome})
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _test_id(nodeid: str) -> str:
    """A nodeid without the ``@group`` suffix that ``--dist loadgroup`` adds."""
    at, bracket = nodeid.rfind("@"), nodeid.rfind("]")
    return nodeid[:at] if at > bracket else nodeid


def per_test(path: str | Path) -> dict[str, float]:
    """Seconds per test (set-up, call and teardown together) in a timings file."""
    out: dict[str, float] = defaultdict(float)
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            r = json.loads(line)
            out[_test_id(r["id"])] += r["s"]
    return dict(out)


def summary(path: str, top: int = 40) -> str:
    rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    tests = per_test(path)
    per_file: dict[str, float] = defaultdict(float)
    for t, s in tests.items():
        per_file[t.split("::")[0]] += s
    spans: dict[str, list[float]] = defaultdict(list)
    busy: dict[str, float] = defaultdict(float)
    for r in rows:
        spans[r["worker"]] += [r["start"], r["start"] + r["s"]]
        busy[r["worker"]] += r["s"]
    t0 = min(v for w in spans.values() for v in w)
    out = [f"{len(tests)} tests, {sum(tests.values()) / 60:.1f} min of test time, "
           f"wall {(max(v for w in spans.values() for v in w) - t0) / 60:.1f} min"]
    out += [f"  {w}: busy {busy[w] / 60:.1f} min, ends at {(max(ts) - t0) / 60:.1f} min"
            for w, ts in sorted(spans.items())]
    out.append("files:")
    out += [f"  {s:7.1f} s  {f}" for f, s in sorted(per_file.items(), key=lambda x: -x[1])[:top]]
    out.append("tests:")
    out += [f"  {s:7.1f} s  {t}" for t, s in sorted(tests.items(), key=lambda x: -x[1])[:top]]
    return "\n".join(out)


def write_durations(timings: str | Path, dest: Path = DURATIONS) -> None:
    """Merge a timings file's per-test seconds into durations.json (tests it lacks keep their time)."""
    known = _load(dest)
    known.update({t: round(s, 2) for t, s in per_test(timings).items()})
    dest.write_text(json.dumps(dict(sorted(known.items())), indent=0) + "\n", encoding="utf-8")


# ---------------------------------------------------------------- schedule

def _load(path: Path = DURATIONS) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text(encoding="utf-8")).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def _group(item: pytest.Item) -> str | None:
    names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                    for m in item.iter_markers("xdist_group")})
    return "_".join(names) or None


def _shares_a_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(d.scope in ("module", "class", "package") for defs in info.name2fixturedefs.values() for d in defs)


def units(items: list[pytest.Item], known: dict[str, float]) -> list[tuple[str, float, list[pytest.Item]]]:
    """(unit name, seconds, its items in collection order), longest first; ties keep collection order."""
    by_unit: dict[str, list[pytest.Item]] = {}
    for item in items:
        name = _group(item)
        if name is None and _shares_a_module_fixture(item):
            name = item.nodeid.split("::")[0]
        by_unit.setdefault(name or item.nodeid, []).append(item)

    def seconds(item: pytest.Item) -> float:
        t = known.get(_test_id(item.nodeid))
        if t is None:
            t = NEW_INTEGRATION_S if item.get_closest_marker("integration") else NEW_UNIT_S
        return t
    out = [(name, sum(map(seconds, its)), its) for name, its in by_unit.items()]
    order = {name: k for k, name in enumerate(by_unit)}
    return sorted(out, key=lambda u: (-u[1], order[u[0]]))


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the xdist_group marks added here
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):  # only an xdist worker: a serial run keeps pytest's order
        return
    plan = units(items, _load())
    items[:] = [it for _, _, its in plan for it in its]
    if config.getvalue("loadgroup"):
        for name, _, its in plan:
            if len(its) > 1 and _group(its[0]) is None:
                for it in its:
                    it.add_marker(pytest.mark.xdist_group(name))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write"]:
        write_durations(sys.argv[2])
        print(f"wrote {DURATIONS}")
    else:
        print(summary(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40))
