"""A run the idle policy stopped is told as such (clusterddp.metrics.idle): the nodes' idle.json read back
(untrusted) as ``failure.kind: idle``, recorded and read back from run.json, not moved to a spare
(clusterddp.policy), and its notification is the ``idle`` event, from the launcher and from node 0. Without
``stop``, an attached run found idle goes on and is told once, as news, to the targets whose ``on`` lists
``idle`` (clusterddp.metrics.idle.Watch: the nodes asked through the run's fleet, a fake transport at the seam)."""

from __future__ import annotations

import json
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from clusterddp import notify as notifier
from clusterddp import policy
from clusterddp.metrics import idle as idle_module
from clusterddp.record import RunRecord, RunStatus
from helpers import ScriptedNode, make_record

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
    st.sampled_from(["below", "seconds", "stop", "decided_by", "nnodes", "x"]),
    st.none() | st.booleans() | st.floats(allow_nan=True) | st.integers() | st.text(max_size=300))))
def test_any_idle_json_gives_none_or_a_bounded_record(data):
    got = idle_module.parse_node("a", data)
    if got is not None:
        assert 0 <= got.below <= 100 and 0 <= got.seconds <= 1e9 and isinstance(got.stop, bool)
        assert got.decided_by is None or len(got.decided_by) <= 255
        assert isinstance(got.nnodes, int) and not isinstance(got.nnodes, bool) and 1 <= got.nnodes < 1 << 20


# ---- idle_policy without stop: the run goes on, found idle and told once ----

def Node(answers: list) -> ScriptedNode:
    """A node at the transport seam: answers the commands it is sent, in order, then nothing."""
    return ScriptedNode(answers, after=b"")


def test_an_attached_run_found_idle_without_stop_is_told_once_then_never_asked_again():
    from clusterddp.fleet import Fleet
    from clusterddp.nodeops import nodes_of
    rec = make_record(RUN, hosts=("a", "b"))
    found = node_json(stop=False, host="b")
    nodes = {"a": Node([b"", OSError("link down"), found]), "b": Node([b"", found])}
    told: list = []
    with Fleet([n.host for n in nodes_of(rec)], connect=lambda h: nodes[h.name]) as fleet:
        w = idle_module.Watch(fleet, nodes_of(rec), told.append)
        assert w.look() is None and told == []                  # not idle yet
        got = w.look()                                           # a does not answer; b's says it
        assert got is not None and (got.host, got.stop, got.nnodes, got.decided_by) == ("b", False, 2, "b")
        assert w.look() is None                                  # told once: no node asked again
        w.stop()                                                 # nor at the end
    assert told == [got]
    assert [len(n.commands) for n in nodes.values()] == [2, 2] and "idle.json" in nodes["a"].commands[0]


def test_a_look_that_fails_never_raises_and_the_last_look_at_the_end_tells_it():
    from clusterddp.fleet import Fleet
    from clusterddp.nodeops import nodes_of
    rec = make_record(RUN, hosts=("a",))
    nodes = {"a": Node([node_json(stop=False)])}
    told: list = []
    with Fleet([n.host for n in nodes_of(rec)], connect=lambda h: nodes[h.name]) as fleet:
        w = idle_module.Watch(fleet, nodes_of(rec), lambda v: (told.append(v), 1 / 0))
        w.start()
        w.stop()  # the run ended before the first look: one last look finds it; the tell's error goes nowhere
    assert len(told) == 1 and told[0].decided_by == "b"
    assert idle_module.watch_every(1800) == idle_module.WATCH_EVERY and idle_module.watch_every(3) == 2.0


def test_the_idle_news_goes_only_to_targets_that_list_idle_with_the_deciding_host():
    from clusterddp.inventory import NotifyTarget
    on = lambda *e: NotifyTarget("command", "true", where="x", on=e)  # noqa: E731
    found = idle_module.parse_node("a", node_json(stop=False))
    assert found is not None
    ev = notifier.idle_event(RUN, found.to_json())
    assert (ev["event"], ev["status"], ev["host"], ev["stop"]) == ("idle", None, "b", False)
    assert ev["text"] == (f"clusterddp: run {RUN}: every GPU of the run (2 node(s)) below 5% for 30 min (found by b); "
                          "the run goes on (idle_policy without stop)")
    assert notifier.wants(on("idle"), ev)
    assert not notifier.wants(on(), ev) and not notifier.wants(on("failed"), ev)  # news, not an end
    assert notifier.fill("echo {event} {host} {status}", ev) == "echo idle b "
