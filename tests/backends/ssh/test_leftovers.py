"""What a lost host kept running of a run that has ended (issue 39 section 1), the pure rule: which
holders of a node's slots a new run may end and take, and what it says. Never another user's run, a
run this launcher has no record of, or a run still running."""

from __future__ import annotations

from dataclasses import replace

import pytest

from clusterddp import plan as ssh_plan
from clusterddp.backends.ssh import leftovers as leftovers_module
from clusterddp.fleet import Fleet
from clusterddp.leases import Holding
from clusterddp.nodescript import marker_word
from clusterddp.record import NodeState, RunStatus
from clusterddp.runspec import RunSpec
from clusterddp.transport.base import CommandResult
from helpers import make_record, resolved

ME = "ann@laptop"


def holding(run: str = "r1", user: str = ME, host: str = "b", state: str = "running", slots=(0,)) -> Holding:
    return Holding(run=run, user=user, since="2026-12-06 04:00:00+0000", host=host, slots=tuple(slots), port=None,
                   state=state)


def ended_with_lost(run_id: str = "r1", status: RunStatus = RunStatus.SUCCEEDED):
    """A run that lost b in attempt 1 and ended on a and c."""
    lost_b = make_record(run_id, ("a", "b")).nodes[1]
    lost_b = replace(lost_b, state=NodeState.LOST, marker=f"{run_id}/b@attempt-1")
    return replace(make_record(run_id, ("a", "c")), status=status, lost=(lost_b,))


def loads(*recs):
    by_id = {r.run_id: r for r in recs}
    return lambda run_id: by_id.get(run_id)


@pytest.mark.parametrize("status", [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.STOPPED])
def test_a_lost_hosts_leftover_of_an_ended_run_of_ours_is_taken(status):
    rec = ended_with_lost(status=status)
    (x,) = leftovers_module.leftovers("node-b", [holding()], loads(rec), ME)
    assert (x.host, x.run, x.status, x.slots) == ("node-b", "r1", status, (0,))
    assert x.node.marker == "r1/b@attempt-1"  # the lost node's marker ends it, not the current nodes'


def test_a_current_node_of_an_ended_run_is_a_leftover_too():
    rec = replace(make_record("r1", ("a", "b")), status=RunStatus.STOPPED)
    (x,) = leftovers_module.leftovers("b", [holding()], loads(rec), ME)
    assert x.node.marker == "r1/b"


def test_a_running_run_is_never_taken():
    rec = replace(ended_with_lost(), status=RunStatus.RUNNING)  # its lost host may be in use again
    assert leftovers_module.leftovers("b", [holding()], loads(rec), ME) == []


def test_another_users_run_is_never_taken():
    assert leftovers_module.leftovers("b", [holding(user="bob@laptop")], loads(ended_with_lost()), ME) == []


def test_a_run_with_no_record_here_is_never_taken():
    assert leftovers_module.leftovers("b", [holding(run="elsewhere")], loads(ended_with_lost()), ME) == []


def test_a_lease_being_taken_now_is_never_taken():
    assert leftovers_module.leftovers("b", [holding(state="starting")], loads(ended_with_lost()), ME) == []


def test_a_host_that_is_not_one_of_the_runs_nodes_is_never_taken():
    assert leftovers_module.leftovers("d", [holding(host="d")], loads(ended_with_lost()), ME) == []


def test_only_the_leftovers_among_several_holders():
    mine, live = ended_with_lost("r1"), make_record("r2", ("b",))
    found = leftovers_module.leftovers("b", [holding("r2"), holding("r1", slots=(1,)), holding("r3", user="bob@x")],
                        loads(mine, live), ME)
    assert [(x.run, x.slots) for x in found] == [("r1", (1,))]


def test_an_unreadable_record_is_none(tmp_path):
    from clusterddp.store import RunStore
    store = RunStore(str(tmp_path / "runs"))
    (tmp_path / "runs" / "r9").mkdir(parents=True)
    (tmp_path / "runs" / "r9" / "run.json").write_text("{not json")
    load = leftovers_module.loader(store)
    assert load("r9") is None and load("missing") is None


class _Node:
    """A node's connection that answers the teardown with ``said``, keeping the commands it ran."""

    def __init__(self, said: str) -> None:
        self.said, self.ran = said, []

    def run(self, command: str, *, timeout=None, stdin=None):
        self.ran.append(command)
        return CommandResult(0, f"banner\n{self.said}\n".encode(), b"")

    def close(self) -> None:
        pass


@pytest.mark.parametrize(("said", "ok"), [("terminated", True), ("killed", True), ("clean", True),
                                          ("survivors 12 13", False), ("", False)])
def test_end_tears_down_the_leftover_by_its_marker_and_says_how_it_went(said, ok):
    rec = ended_with_lost()
    host = rec.nodes[0].settings
    node = _Node(said)
    (x,) = leftovers_module.leftovers(host.name, [holding()], loads(rec), ME)
    ((got, problem),) = leftovers_module.end(Fleet([host], connect=lambda h: node), host, [x])
    assert got is x and (problem is None) == ok, problem
    (command,) = node.ran
    assert marker_word("r1/b@attempt-1") in command, command
    line = leftovers_module.taken(x, problem)
    if ok:
        assert line == (f"[clusterddp] {host.name}: slots 0 were held by run r1, which has ended (succeeded): "
                        "what was left of it there is ended; taking them")
    else:
        assert "could not be ended" in line and said.split(" ")[0] in line


def test_end_of_a_host_that_does_not_answer_is_a_problem_said():
    from clusterddp.errors import HostError
    rec = ended_with_lost()
    host = rec.nodes[0].settings

    def down(h):
        raise HostError(h.name, "cannot connect: timed out")
    (x,) = leftovers_module.leftovers(host.name, [holding()], loads(rec), ME)
    ((_, problem),) = leftovers_module.end(Fleet([host], connect=down), host, [x])
    assert problem and "timed out" in problem


# ---- take_lease: a refusal because of a leftover ends it and takes the slots; otherwise as before ----

INV = """\
defaults: {user: me, gpus: 1, workdir: /w}
hosts: [{name: a, address: 10.0.0.1}, {name: b, address: 10.0.0.2}]
"""


@pytest.fixture
def seam(monkeypatch, tmp_path):
    """take_lease with the lease and the teardown faked at their seams: ``refusals`` are raised by the
    first tries (acquire's ``wait`` flag kept in ``waits``), ``ended`` the leftovers torn down."""
    from clusterddp import leases
    from clusterddp.backends.ssh import launch
    from clusterddp.errors import LeaseBusy
    from clusterddp.inventory import parse
    from clusterddp.store import RunStore

    store = RunStore(str(tmp_path / "runs"))
    store.create(ended_with_lost("r1"))  # lost b in attempt 1, then succeeded on a and c
    store.create(make_record("r2", ("a", "b")))  # running
    plan = ssh_plan.build_plan(parse(INV, "lab.yaml"), resolved(RunSpec("t.py"), parse(INV, "lab.yaml")), "r3")
    prep = launch.Prepared(plan, store, tmp_path)
    st = {"refusals": [], "waits": [], "ended": [], "problem": None}

    def acquire(plan, fleet, *, port_fixed, wait=False, on_wait=None, **kw):
        st["waits"].append(wait)
        if st["refusals"]:
            raise LeaseBusy("the run does not fit", holders=st["refusals"].pop(0), run_id="r3", host="b")
        return leases.Lease("r3", fleet, grants={"a": (0,), "b": (0,)}, port=29500)

    def end(fleet, host, found, grace=leftovers_module.GRACE_S):
        st["ended"] += [(host.name, x.run) for x in found]
        return [(x, st["problem"]) for x in found]
    monkeypatch.setattr(leases, "acquire", acquire)
    monkeypatch.setattr(leases, "launching_user", lambda: ME)
    monkeypatch.setattr(leftovers_module, "end", end)

    def take(wait=False):
        said: list[str] = []
        new, lease = launch.take_lease(prep, Fleet(plan.inventory.hosts), wait=wait, on_note=said.append)
        return new, lease, said
    return st, take


def test_take_lease_ends_a_leftover_and_takes_its_slots(seam):
    st, take = seam
    st["refusals"] = [(holding("r1"),)]
    new, lease, said = take()
    assert st["ended"] == [("b", "r1")] and st["waits"] == [False, False]
    assert lease.grants == {"a": (0,), "b": (0,)} and len(said) == 1 and "taking them" in said[0], said


@pytest.mark.parametrize("holders", [(holding("r2"),), (holding("r1", user="bob@laptop"),), (holding("zz"),)])
def test_take_lease_refuses_as_before_for_any_other_holder(seam, holders):
    from clusterddp.errors import LeaseBusy
    st, take = seam
    st["refusals"] = [holders]
    with pytest.raises(LeaseBusy):
        take()
    assert st["ended"] == [] and st["waits"] == [False]


def test_take_lease_refuses_when_the_leftover_cannot_be_ended(seam):
    from clusterddp.errors import LeaseBusy
    st, take = seam
    st["refusals"], st["problem"] = [(holding("r1"),)], "survivors 12"
    with pytest.raises(LeaseBusy):
        take()
    assert st["ended"] == [("b", "r1")] and st["waits"] == [False]


def test_a_waiting_run_ends_a_leftover_instead_of_queueing_behind_it_and_else_queues(seam):
    st, take = seam
    st["refusals"] = [(holding("r1"),)]
    take(wait=True)
    assert st["ended"] == [("b", "r1")] and st["waits"] == [False, False]  # never queued behind a leftover
    st["refusals"], st["ended"], st["waits"] = [(holding("r2"),)], [], []
    take(wait=True)
    assert st["ended"] == [] and st["waits"] == [False, True]  # a live holder: the queue, as before


def test_take_lease_gives_up_after_one_try_per_node(seam):
    from clusterddp.errors import LeaseBusy
    st, take = seam
    st["refusals"] = [(holding("r1"),)] * 5  # a leftover that comes back every time
    with pytest.raises(LeaseBusy):
        take()
    assert len(st["waits"]) == 3  # two nodes: three tries at most
