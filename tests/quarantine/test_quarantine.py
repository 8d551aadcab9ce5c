"""Quarantine: the policy (a machine lost twice in a row is set aside), the state file (private,
merged under a lock, a damaged one refused by name and never overwritten), the refusal `up` makes,
and the commands that manage it. On real sshd hosts (a node cut off in two runs in a row, then
refused, then let back): tests/promises/test_run_promises.py."""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clusterddp import quarantine as quarantines
from clusterddp.record import NodeState, RunStatus
from helpers import cddp, make_record

NOW = 1_800_000_000.0


def test_a_machine_lost_once_gets_a_strike_and_twice_in_a_row_is_set_aside():
    added, strikes = quarantines.decide({"10.0.0.2:22": "b"}, ["10.0.0.1:22"], [], "r1", NOW, 7200)
    assert added == [] and strikes == [quarantines.Strike("10.0.0.2:22", "b", "r1", NOW)]
    added, strikes = quarantines.decide({"10.0.0.2:22": "b"}, ["10.0.0.1:22"], strikes, "r2", NOW + 60, 7200)
    assert strikes == [] and added == [quarantines.Entry("10.0.0.2:22", "b", NOW + 60, NOW + 60 + 7200,
                                              "lost in runs r1 and r2, one after the other", "r2")]


def test_a_run_the_machine_finishes_wipes_its_strike_and_an_old_strike_counts_no_more():
    _, strikes = quarantines.decide({"m:22": "b"}, [], [], "r1", NOW, 7200)
    assert quarantines.decide({}, ["m:22"], strikes, "r2", NOW + 1, 7200) == ([], [])  # in a row: no longer
    late = NOW + quarantines.STRIKE_S + 1
    assert quarantines.decide({"m:22": "b"}, [], strikes, "r3", late, 7200) == (
        [],
        [quarantines.Strike("m:22", "b", "r3", late)],
    )
    # another run's machines keep their strikes; the same run seen twice is not two losses
    assert quarantines.decide({}, ["x:22"], strikes, "r4", NOW + 1, 7200) == ([], strikes)
    assert quarantines.decide({"m:22": "b"}, [], strikes, "r1", NOW + 1, 7200)[0] == []


def test_after_run_reads_the_lost_nodes_of_the_record(tmp_path):
    q = quarantines.Quarantine(tmp_path / "q.json")
    def lost_b(run_id):
        rec = make_record(run_id)
        return replace(rec, nodes=(replace(rec.nodes[0], state=NodeState.STOPPED),
                                   replace(rec.nodes[1], state=NodeState.LOST)))
    assert quarantines.after_run(lost_b("r1"), q=q) == []
    [e] = quarantines.after_run(lost_b("r2"), q=q)
    assert (e.host, e.machine, e.run_id) == ("b", "10.0.0.2:22", "r2") and q.of(["10.0.0.2:22"])
    assert quarantines.after_run(replace(lost_b("r3"), local=True), q=q) == []  # `up local` has no machine to set aside


def test_the_file_is_private_merged_released_and_expires(tmp_path):
    q = quarantines.Quarantine(tmp_path / "state" / "q.json")
    assert q.entries() == []
    a = quarantines.Entry("10.0.0.2:22", "b", NOW, time.time() + 3600, "by hand", None)
    q.add([a])
    assert stat.S_IMODE(os.stat(q.path).st_mode) == 0o600
    q.add([replace(a, until=a.until - 10)])  # the later end wins
    assert q.entries() == [a]
    q.add([quarantines.Entry("10.0.0.3:22", "c", NOW, time.time() - 1, "long ago", None)])  # expired: not in force
    assert [e.host for e in q.entries()] == ["b"]
    assert q.release("10.0.0.2") == [a] and q.entries() == []
    assert q.release("b") == []


def test_a_damaged_file_is_refused_by_name_and_left_as_it_is(tmp_path):
    path = tmp_path / "q.json"
    path.write_text('{"hosts": [{"machine": "x"}]}')
    q = quarantines.Quarantine(path)
    for call in (
        q.entries,
        lambda: q.add([quarantines.Entry("m:22", "b", NOW, NOW + 1, "w", None)]),
        lambda: q.release("b"),
    ):
        with pytest.raises(quarantines.QuarantineError, match=f"{path}: damaged quarantine file: hosts\\[0\\]"):
            call()
    assert path.read_text() == '{"hosts": [{"machine": "x"}]}'


def test_a_quarantined_host_is_refused_naming_it_until_when_and_the_fix(tmp_path):
    from clusterddp.inventory import Host
    q = quarantines.Quarantine(tmp_path / "q.json")
    h = Host(name="gpu-02", address="10.0.0.12", user="me", port=22, identity_file=None, known_hosts="k",
             host_key_policy="strict", gpus=1, python="python3", workdir="/w", env=(), setup=(), connect_timeout=10.0)
    quarantines.refuse([h], q)  # nothing quarantined: no error
    q.add(
        [
            quarantines.Entry(
                "10.0.0.12:22", "gpu-02", NOW, time.time() + 600, "lost in runs r1 and r2, one after the other", "r2"
            )
        ]
    )
    with pytest.raises(quarantines.Quarantined) as e:
        quarantines.refuse([h, replace(h, name="gpu-01", address="10.0.0.11")], q)
    assert e.value.exit_code == 75
    assert "gpu-02 (10.0.0.12:22) is quarantined until " in e.value.message and "lost in runs r1" in e.value.message
    assert "--exclude gpu-02" in (e.value.hint or "") and "quarantine release gpu-02" in (e.value.hint or "")


ENTRY = st.fixed_dictionaries({
    "machine": st.one_of(st.just("10.0.0.1:22"), st.text(max_size=30)), "host": st.text(max_size=30),
    "since": st.one_of(st.floats(allow_nan=True), st.integers(), st.booleans(), st.none()),
    "until": st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2 ** 70, 2 ** 70)),
    "why": st.text(max_size=600), "run_id": st.one_of(st.none(), st.text(max_size=10), st.integers())})


@given(st.one_of(st.binary(max_size=300),
                 st.lists(ENTRY, max_size=4).map(lambda hs: json.dumps({"hosts": hs}).encode()),
                 st.recursive(st.none() | st.integers() | st.text(max_size=5),
                              lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
                              max_leaves=20).map(lambda d: json.dumps({"hosts": [d], "strikes": d}).encode())))
def test_any_bytes_as_the_file_give_checked_entries_or_a_located_error(data):
    try:
        entries, strikes = quarantines.parse(data, "/s/q.json")
    except quarantines.QuarantineError as e:
        assert e.message.startswith("/s/q.json: damaged quarantine file: ") and "\n" not in e.message
        return
    for e in entries:
        assert quarantines._MACHINE.fullmatch(e.machine) and "\n" not in e.why and len(e.why) <= quarantines.MOST_TEXT
        assert isinstance(e.until, int | float) and not isinstance(e.until, bool)
    assert quarantines.parse(quarantines.render(entries, strikes)) == (entries, strikes)


def test_the_commands_add_list_and_release(tmp_path):
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  - {name: gpu-01, address: 10.0.0.11, port: 22}\n  - {name: gpu-02, address: 10.0.0.12}\n")
    assert "no host is quarantined" in cddp("quarantine", "list", env=env, check_rc=0).stdout
    r = cddp("quarantine", "add", str(inv), "gpu-02", "--for", "1h", "--why", "fan noise", env=env, check_rc=0)
    assert "gpu-02 (10.0.0.12:22) is quarantined until" in r.stdout
    assert "gpu-02 (10.0.0.12:22) until" in cddp("quarantine", "list", env=env, check_rc=0).stdout
    [e] = json.loads(cddp("quarantine", "list", "--json", env=env, check_rc=0).stdout)
    assert e["why"] == "fan noise" and e["run_id"] is None and 3500 < e["until"] - time.time() <= 3600
    (tmp_path / "t.py").write_text("print(1)\n")
    r = cddp("up", str(inv), str(tmp_path / "t.py"), "--dry-run", env=env, check_rc=None)
    assert r.returncode == 75 and "gpu-02 (10.0.0.12:22) is quarantined until" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert "released gpu-02" in cddp("quarantine", "release", "gpu-02", env=env, check_rc=0).stdout
    assert "node 1" in cddp("up", str(inv), str(tmp_path / "t.py"), "--dry-run", env=env, check_rc=0).stdout
    r = cddp("quarantine", "release", "gpu-02", env=env, check_rc=2)
    assert "gpu-02: not quarantined" in r.stderr
    r = cddp("quarantine", "add", str(inv), "gpu-09", env=env, check_rc=2)
    assert "gpu-09: not a host of" in r.stderr and "gpu-01, gpu-02" in r.stderr
    assert "--for 'soon': not an age" in cddp("quarantine", "add", str(inv), "gpu-01", "--for", "soon", env=env,
                                               check_rc=2).stderr
    (tmp_path / "state" / "clusterddp" / "quarantine.json").write_text("{not json")
    r = cddp("quarantine", "list", env=env, check_rc=2)
    assert "quarantine.json: damaged quarantine file" in r.stderr and "fix or remove" in r.stderr


# ---- quarantine_stragglers: a straggler of an attached run counts as a strike ----

def test_a_straggler_gets_a_strike_and_named_or_lost_again_in_the_next_run_is_set_aside():
    added, strikes = quarantines.strike_slow({"m:22": "b"}, [], "r1", NOW, 7200)
    assert added == [] and strikes == [quarantines.Strike("m:22", "b", "r1", NOW)]
    # counted twice in the same run: still one strike
    assert quarantines.strike_slow({"m:22": "b"}, strikes, "r1", NOW + 1, 7200) == ([], strikes)
    # a straggler again in the next run: set aside, its strike used up; another machine's strike stays
    other = quarantines.Strike("x:22", "c", "r0", NOW)
    added, left = quarantines.strike_slow({"m:22": "b"}, [*strikes, other], "r2", NOW + 60, 7200)
    assert left == [other] and [(e.machine, e.host, e.until, e.run_id) for e in added] == [
        ("m:22", "b", NOW + 60 + 7200, "r2")]
    assert "named a straggler in run r2" in added[0].why and "run r1" in added[0].why
    # a strike older than STRIKE_S counts no more
    late = NOW + quarantines.STRIKE_S + 1
    assert quarantines.strike_slow({"m:22": "b"}, strikes, "r3", late, 7200) == (
        [], [quarantines.Strike("m:22", "b", "r3", late)])
    # lost in one run, a straggler in the next: two strikes in a row
    _, lost = quarantines.decide({"m:22": "b"}, [], [], "r1", NOW, 7200)
    assert len(quarantines.strike_slow({"m:22": "b"}, lost, "r2", NOW + 1, 7200)[0]) == 1


def test_decide_counts_a_straggler_of_a_failed_run_and_does_not_wipe_its_strike_as_kept():
    _, strikes = quarantines.strike_slow({"m:22": "b"}, [], "r1", NOW, 7200)
    # the failed run r2 ran on m to the end (kept), but named it a straggler again: set aside
    added, left = quarantines.decide({}, ["m:22", "k:22"], strikes, "r2", NOW + 1, 7200, slow={"m:22": "b"})
    assert [e.machine for e in added] == ["m:22"] and left == []
    # without the straggler, kept wipes the strike as before
    assert quarantines.decide({}, ["m:22"], strikes, "r2", NOW + 1, 7200) == ([], [])
    # lost and a straggler in one run: one strike, not two
    added, left = quarantines.decide({"m:22": "b"}, [], [], "r3", NOW, 7200, slow={"m:22": "b"})
    assert added == [] and left == [quarantines.Strike("m:22", "b", "r3", NOW)]


def test_after_run_and_after_slow_map_the_stragglers_hosts_to_machines(tmp_path):
    q = quarantines.Quarantine(tmp_path / "q.json")
    failed = make_record("r1", status=RunStatus.FAILED)
    assert quarantines.after_run(failed, q=q, slow=["b", "not-in-the-run"]) == []
    assert q.strikes() == [quarantines.Strike("10.0.0.2:22", "b", "r1", q.strikes()[0].at)]
    [e] = quarantines.after_slow(make_record("r2", status=RunStatus.SUCCEEDED), ["b"], 60, q=q)
    assert (e.host, e.machine, e.run_id) == ("b", "10.0.0.2:22", "r2") and q.strikes() == []
    # the same run counted again after it set the machine aside: no new strike
    assert quarantines.after_slow(make_record("r2"), ["b"], 60, q=q) == [] and q.strikes() == []
    assert quarantines.after_slow(replace(make_record("r3"), local=True), ["a"], q=q) == []
    assert quarantines.after_slow(make_record("r3"), [], q=q) == [] and q.strikes() == []


def test_up_counts_the_stragglers_only_with_quarantine_stragglers_true(tmp_path, monkeypatch):
    """The SSH launch's steps after a run (`_set_aside` after a failed one, `_strike_stragglers` after one
    that succeeded) read the stragglers from the samples brought back, with the inventory's option only."""
    from types import SimpleNamespace

    from clusterddp.backends.ssh import launch as ssh_launch
    from clusterddp.store import RunStore
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    store = RunStore(tmp_path / "runs")
    said: list[str] = []
    events = SimpleNamespace(warn=said.append)

    def run(run_id: str, status: RunStatus, on: bool) -> None:
        store.create(make_record(run_id, status=status))
        for name, state in (("a", "w"), ("b", "c")):  # b's rank is in its own code while a's waits: b is slow
            d = store.run_dir(run_id) / "where" / name
            d.mkdir(parents=True)
            d.joinpath("where.jsonl").write_text("".join(
                json.dumps({"t": 1000.0 + 2 * i, "ranks": {"0" if name == "a" else "1": [state, "f (t.py:1)"]}}) + "\n"
                for i in range(40)))
        inv = SimpleNamespace(quarantine_stragglers=on, quarantine_s=600.0)
        prep = SimpleNamespace(store=store, plan=SimpleNamespace(run_id=run_id, inventory=inv))
        (ssh_launch._set_aside if status is RunStatus.FAILED else ssh_launch._strike_stragglers)(prep, events)

    q = quarantines.Quarantine()
    run("r0", RunStatus.SUCCEEDED, on=False)
    run("r1", RunStatus.FAILED, on=False)
    assert q.strikes() == [] and said == []  # off by default: nothing counted
    run("r2", RunStatus.SUCCEEDED, on=True)
    assert [(k.host, k.run_id) for k in q.strikes()] == [("b", "r2")] and said == []
    run("r3", RunStatus.FAILED, on=True)
    assert [(e.host, e.run_id) for e in q.entries()] == [("b", "r3")] and q.strikes() == []
    assert len(said) == 1 and said[0].startswith("quarantine: b (10.0.0.2:22) is set aside until ") and \
        "named a straggler in run r3" in said[0], said
