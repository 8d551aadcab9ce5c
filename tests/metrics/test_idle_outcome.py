"""A run the idle policy stopped is told as such (clusterddp.metrics.idle): the nodes' idle.json read back
(untrusted) as ``failure.kind: idle``, recorded and read back from run.json, not moved to a spare
(clusterddp.policy), and its notification is the ``idle`` event, from the launcher and from node 0."""

from __future__ import annotations

import json
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from clusterddp import notify as notifier
from clusterddp import policy
from clusterddp.metrics import idle as idle_module
from clusterddp.record import RunRecord, RunStatus
from helpers import make_record

RUN = "20261206-080000-id1e"


def node_json(**kw) -> bytes:
    rec = {"schema": 1, "host": "a", "time": 1.0, "below": 5, "seconds": 1800.0, "stop": True, "nnodes": 2,
           "decided_by": "b"}
    rec.update(kw)
    return json.dumps(rec).encode()


def test_the_nodes_idle_records_make_the_idle_failure_named_by_the_policy():
    rec = make_record(RUN, hosts=("a", "b"))
    idles = {h: idle_module.parse_node(h, node_json()) for h in ("a", "b")}
    f = idle_module.idle_of(rec, idles)  # type: ignore[arg-type]
    assert f is not None and f.kind == "idle" and f.host == "b"
    assert f.summary.startswith("idle: every GPU below 5% for 30 min")
    assert f.lines()[0] == "root cause: b: idle: every GPU below 5% for 30 min (idle_policy stop ended the run)"
    assert f.others == (("a", "ended by the idle policy"),)
    # a policy without stop ended nothing: the run's failure is its own
    assert idle_module.idle_of(rec, {"a": idle_module.parse_node("a", node_json(stop=False))}) is None  # type: ignore[dict-item]
    assert idle_module.idle_of(rec, {}) is None
    # recorded, and read back from run.json as what status and runs --json show
    failed = replace(rec, status=RunStatus.FAILED, failure=f)
    back = RunRecord.from_json(json.loads(json.dumps(failed.to_json())), "run.json")
    assert back.failure is not None and back.failure.kind == "idle" and back.failure.summary == f.summary


def test_an_idle_run_ends_and_is_not_moved_to_a_spare():
    rec = make_record(RUN, hosts=("a", "b"))
    f = idle_module.idle_of(rec, {"a": idle_module.parse_node("a", node_json(decided_by="a"))})  # type: ignore[dict-item]
    d = policy.after_failure(replace(rec, status=RunStatus.FAILED, failure=f))
    assert not d.carry_on and "idle policy stopped it" in d.why


def test_the_idle_event_from_the_launcher():
    rec = make_record(RUN, hosts=("a", "b"))
    f = idle_module.idle_of(rec, {"b": idle_module.parse_node("b", node_json())})  # type: ignore[dict-item]
    ev = notifier.run_event(replace(rec, status=RunStatus.FAILED, failure=f, started_at="2026-12-06T08:00:00+00:00",
                             ended_at="2026-12-06T08:40:00+00:00"))
    assert ev is not None and (ev["event"], ev["status"]) == ("idle", "failed")
    assert "sat idle and was ended by its idle policy in 40m" in ev["text"] and "every GPU below 5%" in ev["text"]
    from clusterddp.inventory import NotifyTarget
    on = lambda *e: NotifyTarget("command", "true", where="x", on=e)  # noqa: E731
    assert notifier.wants(on("idle"), ev) and notifier.wants(on("failed"), ev) and not notifier.wants(on("hang"), ev)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400) | st.builds(lambda d: json.dumps(d).encode(), st.dictionaries(
    st.sampled_from(["below", "seconds", "stop", "decided_by", "x"]),
    st.none() | st.booleans() | st.floats(allow_nan=True) | st.integers() | st.text(max_size=300))))
def test_any_idle_json_gives_none_or_a_bounded_record(data):
    got = idle_module.parse_node("a", data)
    if got is not None:
        assert 0 <= got.below <= 100 and 0 <= got.seconds <= 1e9 and isinstance(got.stop, bool)
        assert got.decided_by is None or len(got.decided_by) <= 255
