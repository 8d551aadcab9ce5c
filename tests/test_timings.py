"""The CI-time plugin (tests/timings.py): the order tests are handed to xdist workers, the timings file,
and the session cache of shared runs (conftest.shared_runs)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

import timings


@dataclass
class FakeDef:
    scope: str


@dataclass
class FakeInfo:
    name2fixturedefs: dict


@dataclass
class FakeItem:
    nodeid: str
    marks: list = field(default_factory=list)
    scopes: tuple = ()

    def __post_init__(self):
        self._fixtureinfo = FakeInfo({f"f{k}": [FakeDef(s)] for k, s in enumerate(self.scopes)})

    def iter_markers(self, name):
        return [m for m in self.marks if m.name == name]

    def get_closest_marker(self, name):
        found = self.iter_markers(name)
        return found[0] if found else None


def names(plan):
    return [(u, round(s, 1), [i.nodeid for i in its]) for u, s, its in plan]


def test_the_longest_unit_goes_first_and_unknown_tests_get_the_default_of_their_kind():
    items = [FakeItem("t/a.py::fast"), FakeItem("t/a.py::slow"), FakeItem("t/b.py::new_bed", [pytest.mark.integration]),
             FakeItem("t/b.py::new_unit")]
    plan = timings.units(items, {"t/a.py::fast": 0.1, "t/a.py::slow": 45.0})
    assert names(plan) == [("t/a.py::slow", 45.0, ["t/a.py::slow"]),
                           ("t/b.py::new_bed", timings.NEW_INTEGRATION_S, ["t/b.py::new_bed"]),
                           ("t/b.py::new_unit", timings.NEW_UNIT_S, ["t/b.py::new_unit"]),
                           ("t/a.py::fast", 0.1, ["t/a.py::fast"])]


def test_users_of_a_module_fixture_or_of_one_xdist_group_stay_one_unit_in_collection_order():
    g = pytest.mark.xdist_group("run1")
    items = [FakeItem("t/m.py::one", scopes=("function", "module")), FakeItem("t/m.py::alone"),
             FakeItem("t/m.py::two", scopes=("module",)), FakeItem("t/x.py::a", [g]), FakeItem("t/y.py::b", [g]),
             FakeItem("t/z.py::longest")]
    known = {"t/m.py::one": 5, "t/m.py::two": 6, "t/m.py::alone": 1, "t/x.py::a": 3, "t/y.py::b": 4,
             "t/z.py::longest": 10}
    assert names(timings.units(items, known)) == [
        ("t/m.py", 11.0, ["t/m.py::one", "t/m.py::two"]),  # 5 + 6: ahead of the single 10 s test
        ("t/z.py::longest", 10.0, ["t/z.py::longest"]),
        ("run1", 7.0, ["t/x.py::a", "t/y.py::b"]),
        ("t/m.py::alone", 1.0, ["t/m.py::alone"])]


def test_a_timings_file_sums_each_tests_phases_without_the_loadgroup_suffix(tmp_path):
    f = tmp_path / "t.jsonl"
    rows = [{"id": "t/a.py::x@t/a.py", "phase": "setup", "start": 1.0, "s": 2.0, "worker": "gw0", "outcome": "passed"},
            {"id": "t/a.py::x@t/a.py", "phase": "call", "start": 3.0, "s": 5.5, "worker": "gw0", "outcome": "passed"},
            {"id": "t/a.py::y[a@b]", "phase": "call", "start": 1.0, "s": 1.0, "worker": "gw1", "outcome": "passed"}]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert timings.per_test(f) == {"t/a.py::x": 7.5, "t/a.py::y[a@b]": 1.0}
    dest = tmp_path / "durations.json"
    dest.write_text(json.dumps({"t/old.py::kept": 3.0, "t/a.py::x": 99.0}))
    timings.write_durations(f, dest)
    assert json.loads(dest.read_text()) == {"t/a.py::x": 7.5, "t/a.py::y[a@b]": 1.0, "t/old.py::kept": 3.0}
    assert "gw0: busy 0.1 min" in timings.summary(str(f))


def test_shared_runs_makes_each_run_once_and_a_failed_one_fails_every_user(shared_runs):
    calls = []
    key = f"test-timings-{id(calls)}"
    assert shared_runs(key, lambda: calls.append(1) or "run") == "run"
    assert shared_runs(key, lambda: calls.append(2) or "other") == "run" and calls == [1]

    def broken():
        calls.append(3)
        raise RuntimeError("up failed")
    for _ in range(2):
        with pytest.raises(RuntimeError, match="up failed"):
            shared_runs(key + "-broken", broken)
    assert calls == [1, 3]
