"""`check --collective` without SSH: the node program for real on this machine (two ranks on
loopback), the pure evaluation of every host's output, and the parser under arbitrary bytes."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterddp import collective as collectives
from clusterddp import inventory, node
from clusterddp.errors import HostError
from clusterddp.fleet import HostResult
from clusterddp.node.collective import MARK, CollectiveReplyError, parse_output

MiB = 1 << 20


def inv(n: int) -> inventory.Inventory:
    hosts = "".join(f"  - {{name: h{i}, address: 10.0.0.{i + 1}}}\n" for i in range(n))
    return inventory.parse(f"hosts:\n{hosts}", "inv.yaml")


def line(event: str, **fields) -> bytes:
    return (MARK + json.dumps({"event": event, "t": 1.0, **fields}) + "\n").encode()


def started(name: str, torch: str = "2.13.0+cpu") -> bytes:
    return line("started", python="3.11.7", hostname=name, iface="eth0", addr="10.0.0.1", torch=torch, cuda=None,
                gpu=False)


def sweep(bw: float, sizes=(1024, 64 * 1024, MiB), lat: float = 0.0002) -> list:
    """[size, ops, median, fastest] as a pair of 2 ranks at bus bandwidth ``bw`` bytes/s."""
    return [[s, 5, lat + s / bw, lat + s / bw] for s in sizes]


def measured(n: int, pair_bw: dict[tuple[int, int], float],
             pair_lat: dict[tuple[int, int], float] | None = None, base_lat: float = 0.0002) -> dict[str, bytes]:
    """Every host's output of a run that went through, with the given bandwidth (and latency) per ring pair."""
    out = {}
    for r in range(n):
        pairs = {}
        for a, b in (sorted((r, (r + 1) % n)), sorted(((r - 1) % n, r))):
            peer = b if r == a else a
            lat = (pair_lat or {}).get((a, b), base_lat)
            bw = pair_bw.get((a, b), 1e9)  # a slow pair stops at 64 KiB, as the node program does
            pairs[str(peer)] = sweep(bw, sizes=(1024, 64 * 1024) if bw < 1e8 else (1024, 64 * 1024, MiB, 64 * MiB),
                                     lat=lat)
        out[f"h{r}"] = started(f"h{r}") + line("joined") + line("connected", backend="gloo") + line(
            "result", backend="gloo", world=sweep(1e9), pairs=pairs)
    return out


def ok_results(n: int) -> list[HostResult]:
    return [HostResult(f"h{r}") for r in range(n)]


def test_a_slow_host_is_flagged_by_the_rule_and_only_it():
    n = 4
    slow_pairs = {(2, 3): 1e6, (1, 2): 1e6}  # h2 is slow with both its neighbours
    rep = collectives.evaluate(inv(n), ok_results(n), measured(n, slow_pairs))
    status = {h.host: h.status for h in rep.hosts}
    assert status == {"h0": "ok", "h1": "ok", "h2": "slow", "h3": "ok"}
    h2 = rep.hosts[2]
    assert h2.bandwidth and h2.bandwidth.busbw < 1.1e6
    assert (h2.problem or "").startswith(
        "bus bandwidth 997 kB/s (best up to 64 KiB) is 0.004x the median 247 MB/s"), h2.problem
    assert not rep.ok and not any(li.slow for li in rep.links)
    assert [f.size for f in rep.world] == [1024, 64 * 1024, MiB] and rep.backend == "gloo"
    d = rep.to_dict()
    assert d["hosts"][2]["status"] == "slow" and d["rule"] == collectives.RULE and json.dumps(d)


def test_rates_read_as_nccl_tests_prints_them():
    assert [collectives.rate(x) for x in (0, 999.4, 999.6, 12345, 2.5e9, 3e12)] == [
        "0.00 B/s", "999 B/s", "1.00 kB/s", "12.3 kB/s", "2.50 GB/s", "3000 GB/s"]


def test_a_host_slow_only_in_latency_is_flagged_by_the_latency_rule():
    # 4 ms more per operation on h1's links, where the others take 0.2 ms; bandwidth as theirs at 64 MiB
    rep = collectives.evaluate(inv(4), ok_results(4), measured(4, {}, {(0, 1): 0.004, (1, 2): 0.004}))
    assert [h.status for h in rep.hosts] == ["ok", "slow", "ok", "ok"]
    assert (rep.hosts[1].problem or "").startswith("latency 4 ms is"), rep.hosts[1].problem
    # 10x the median, but within the rule's floor (0.5 ms more than the median): noise, not slowness
    assert collectives.evaluate(inv(4), ok_results(4), measured(4, {}, {(0, 1): 0.0002, (1, 2): 0.0002}, 0.00002)).ok


def test_one_noisy_size_of_a_pair_flags_nothing():
    outputs = measured(3, {})
    for me, peer in (("h1", "2"), ("h2", "1")):  # h1-h2 measured 64 MiB while the CPU was busy: 1/10 the speed
        lines = outputs[me].decode().splitlines()
        ev = json.loads(lines[-1][len(MARK):])
        ev["pairs"][peer][-1][2:] = [x * 10 for x in ev["pairs"][peer][-1][2:]]
        outputs[me] = "\n".join(lines[:-1] + [MARK + json.dumps(ev)]).encode()
    rep = collectives.evaluate(inv(3), ok_results(3), outputs)
    assert rep.ok, [(h.host, h.problem) for h in rep.hosts]


def test_a_slow_link_between_fast_hosts_is_named_as_a_link():
    n = 4
    rep = collectives.evaluate(inv(n), ok_results(n), measured(n, {(0, 1): 1e6}))
    assert all(h.status == "ok" for h in rep.hosts)  # each is fast with its other neighbour
    assert [(li.a, li.b) for li in rep.links if li.slow] == [("h0", "h1")] and not rep.ok


def test_every_host_ok_passes_and_two_hosts_are_never_judged_slow():
    rep = collectives.evaluate(inv(3), ok_results(3), measured(3, {}))
    assert rep.ok and all(h.status == "ok" for h in rep.hosts)
    two = {f"h{r}": started(f"h{r}") + line("joined") + line("result", backend="gloo", world=sweep(1e3 * (r + 1)),
                                                                pairs={}) for r in range(2)}
    rep = collectives.evaluate(inv(2), ok_results(2), two)
    assert rep.ok and rep.hosts[0].bandwidth == rep.hosts[1].bandwidth  # one pair: the slower view, for both


def test_results_without_figures_are_judged_without_a_crash():
    empty = {f"h{r}": started(f"h{r}") + line("result", backend="gloo", world=[], pairs={}) for r in range(3)}
    rep = collectives.evaluate(inv(3), ok_results(3), empty)
    assert [h.status for h in rep.hosts] == ["ok"] * 3 and all(h.bandwidth is None for h in rep.hosts)


def test_the_master_is_rank_0_wherever_the_inventory_lists_it():
    two = inventory.parse("master: {host: h1}\nhosts: [{name: h0, address: 10.0.0.1}, {name: h1, address: 10.0.0.2}]\n",
                          "inv.yaml")
    assert [h.name for h in two.ranked()] == ["h1", "h0"]
    outputs = {"h1": started("h1") + line("joined") + line("error", phase="join", kind="missing", ranks=[1],
                                                           message="rank(s) 1 never joined within 20s"),
               "h0": started("h0") + line("error", phase="join", kind="master_unreachable", message="timed out")}
    rep = collectives.evaluate(two, [HostResult("h0"), HostResult("h1")], outputs)
    assert [(h.host, h.rank, h.status) for h in rep.hosts] == [("h1", 0, "not measured"), ("h0", 1, "never joined")]


def test_rank_0_decides_go_or_names_who_and_why():
    from clusterddp.node.collective import _decide
    hello = {"torch": "2.13.0", "hostname": "a", "iface": "eth0", "addr": "10.0.0.1", "gpu": False}
    assert _decide({0: hello, 1: {**hello, "hostname": "b"}}, 2, 20) == {"backend": "gloo"}
    assert _decide({0: {**hello, "gpu": True}, 1: {**hello, "gpu": True}}, 2, 20) == {"backend": "nccl"}
    go = _decide({0: hello}, 3, 20)
    assert go["kind"] == "missing" and go["ranks"] == [1, 2] and go["abort"] == "rank(s) 1, 2 never joined within 20s"
    go = _decide({0: hello, 1: {**hello, "torch": "2.12.0"}}, 2, 20)
    assert go["kind"] == "version_mismatch" and go["ranks"] == [1]
    go = _decide({0: hello, 1: {**hello, "hostname": "b", "iface": "lo", "addr": "127.0.0.1"}}, 2, 20)
    assert go["kind"] == "interface" and go["ranks"] == [1] and "lo is a loopback interface" in go["abort"]
    go = _decide({0: hello, 1: {**hello, "hostname": "b", "iface": "eth9", "addr": None}}, 2, 20)
    assert go["kind"] == "interface" and "eth9 has no IPv4 address" in go["abort"]
    lo = {**hello, "iface": "lo", "addr": "127.0.0.1"}
    assert _decide({0: lo, 1: lo}, 2, 20) == {"backend": "gloo"}  # one machine: loopback reaches every rank


def test_never_joined_names_the_host_and_why():
    n = 3
    outputs = {
        "h0": started("h0") + line("joined") + line("error", phase="join", kind="missing", ranks=[1],
                                                    message="rank(s) 1 never joined within 20s"),
        "h1": started("h1") + line("error", phase="join", kind="master_unreachable",
                                   message="cannot reach the master port 10.0.0.1:29500 within 20s: timed out"),
        "h2": started("h2") + line("joined") + line("error", phase="join", kind="missing", ranks=[1], message="x"),
    }
    rep = collectives.evaluate(inv(n), ok_results(n), outputs)
    h = {x.host: x for x in rep.hosts}
    assert h["h1"].status == "never joined"
    assert h["h1"].problem == ("never joined within 20s: master port unreachable: cannot reach the master port "
                               "10.0.0.1:29500 within 20s: timed out")
    assert "TCP port 29500" in (h["h1"].fix or "")
    assert h["h0"].status == h["h2"].status == "not measured" and not rep.ok

    # a host that could not be reached printed nothing: its connection says why
    outputs["h1"] = b""
    err = HostError("h1", "cannot connect to 10.0.0.2:22: timed out")
    rep = collectives.evaluate(inv(n), [HostResult("h0"), HostResult("h1", error=err), HostResult("h2")], outputs)
    assert rep.hosts[1].status == "never joined"
    assert rep.hosts[1].problem == "never joined within 20s: it did not start: cannot connect to 10.0.0.2:22: timed out"
    # nothing understood: its last lines say why (python missing, a setup line failing)
    outputs["h1"] = b"bash: line 3: /opt/py: No such file or directory\n"
    rep = collectives.evaluate(inv(n), ok_results(n), outputs)
    assert rep.hosts[1].problem == ("never joined within 20s: the test did not start there: bash: line 3: /opt/py: "
                                    "No such file or directory")


def test_version_mismatch_is_named_on_the_odd_host():
    outputs = {
        "h0": started("h0") + line("joined") + line("error", phase="join", kind="version_mismatch", ranks=[1],
                                                    message="torch versions differ"),
        "h1": started("h1", torch="2.12.0") + line("joined") + line(
            "error", phase="join", kind="version_mismatch", ranks=[1], message="torch versions differ"),
    }
    rep = collectives.evaluate(inv(2), ok_results(2), outputs)
    assert rep.hosts[1].status == "failed"
    assert rep.hosts[1].problem == "version mismatch: torch 2.12.0 here, 2.13.0+cpu on the master h0"
    assert rep.hosts[0].status == "not measured"


def test_a_malformed_reply_is_that_hosts_error_only():
    outputs = measured(3, {})
    outputs["h1"] = started("h1") + (MARK + '{"event": "result", "t": 1, "backend": "gloo", "world": [[1024, 1, '
                                     '-1, 0]], "pairs": {}}\n').encode()
    rep = collectives.evaluate(inv(3), ok_results(3), outputs)
    assert rep.hosts[1].status == "failed" and "world[0].median must be" in (rep.hosts[1].problem or "")
    # the others' figures still count as theirs, but without h1's there is no group figure to judge by
    assert rep.hosts[0].status == rep.hosts[2].status == "not measured" and not rep.ok


GOOD = [1024, 5, 0.002, 0.001]


@pytest.mark.parametrize("measurement, why", [
    ([0, 5, 0.002, 0.001], "world[0].size must be a whole number from 1"),
    ([(1 << 40) + 1, 5, 0.002, 0.001], "world[0].size must be"),
    ([True, 5, 0.002, 0.001], "world[0].size must be"),
    ([1024, 0, 0.002, 0.001], "world[0].operations must be"),
    ([1024, 5, -0.002, 0.001], "world[0].median must be"),
    ([1024, 5, 0.002, 0.003], "world[0] must be a measurement whose fastest time is not above its median"),
    ([1024, 5, 2e6, 0.001], "world[0].median must be"),
    ([1024, 5, 0.002], "world[0] must be [size, operations, median, fastest]"),
])
def test_measurements_out_of_bounds_are_refused(measurement, why):
    raw = line("result", backend="gloo", world=[measurement], pairs={})
    with pytest.raises(CollectiveReplyError, match=re.escape(why)):
        parse_output(raw, 2)
    assert parse_output(line("result", backend="gloo", world=[GOOD], pairs={}), 2)[0][0]["world"] == [tuple(GOOD)]


@pytest.mark.parametrize("raw, why", [
    (line("result", backend="gloo", world=[GOOD] * 33, pairs={}), "at most 32 measurements"),
    (line("result", backend="mpi", world=[GOOD], pairs={}), "backend must be gloo or nccl"),
    (line("result", backend="gloo", world=[GOOD], pairs={"5": [GOOD]}), "keyed by peer rank"),
    (line("error", phase="join", kind="missing", ranks=[7], message="x"), "ranks must be a whole number"),
    (line("error", phase="join", kind="nope", message="x"), "kind must be one of"),
    (line("joined") * 17, "more than 16 events"),
    ((MARK + '{"event": "joined", "t": NaN}\n').encode(), "NaN is not a number"),
])
def test_events_out_of_bounds_are_refused(raw, why):
    with pytest.raises(CollectiveReplyError, match=re.escape(why)):
        parse_output(raw, 2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_node_program_runs_two_ranks_for_real_and_its_answer_evaluates(tmp_path):
    """Two ranks on this machine over loopback (one machine: loopback is allowed), as plan.py sends it."""
    port = free_port()
    args = {"world": 2, "addr": "127.0.0.1", "port": port, "sizes": [1024, 64 * 1024, 16 * MiB, 64 * MiB],
            "gloo_max": 16 * MiB, "join_s": 60, "op_s": 0.5, "budget_s": 0.05, "limit_s": 240}
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", node.source("collective"), json.dumps({**args, "rank": r})],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path, env=env)
             for r in range(2)]
    outs = {f"h{r}": p.communicate(timeout=240)[0] for r, p in enumerate(procs)}
    assert [p.returncode for p in procs] == [0, 0], outs
    events, _ = parse_output(outs["h0"], 2)
    assert [e["event"] for e in events] == ["started", "joined", "connected", "result"]
    sizes = [m[0] for m in events[-1]["world"]]
    assert sizes[0] == 1024 and 64 * MiB not in sizes  # gloo stops at gloo_max
    rep = collectives.evaluate(inv(2), ok_results(2), outs)
    assert rep.ok and rep.backend == "gloo" and [h.status for h in rep.hosts] == ["ok", "ok"]
    assert all(h.latency and h.bandwidth and h.facts["iface"] == "lo" for h in rep.hosts)

    # without torch (-S: no site-packages) it says so, in its own words
    p = subprocess.run([sys.executable, "-S", "-c", node.source("collective"), json.dumps({**args, "rank": 1})],
                       capture_output=True, cwd=tmp_path, timeout=60)
    events, _ = parse_output(p.stdout, 2)
    assert p.returncode == 1 and events[-1]["kind"] == "torch" and "No module named 'torch'" in events[-1]["message"]


# ---- the parser, under whatever a node might send ----

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(1 << 70), max_value=1 << 70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=12)
REAL = measured(3, {(1, 2): 1e6})["h1"]
KEYS = ["event", "t", "backend", "world", "pairs", "kind", "phase", "message", "ranks", "hellos", "torch", "gpu",
        "hostname", "iface", "addr"]


def mutate_event(raw: bytes, data) -> bytes:
    lines = raw.decode().splitlines()
    i = data.draw(st.integers(0, len(lines) - 1))
    ev = json.loads(lines[i][len(MARK):])
    for _ in range(data.draw(st.integers(1, 3))):
        ev[data.draw(st.sampled_from(KEYS))] = data.draw(json_values)
    lines[i] = MARK + json.dumps(ev)
    return "\n".join(lines).encode()


@settings(derandomize=True, database=None, deadline=None, max_examples=300,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_parser_and_evaluate_take_anything_a_node_sends(data):
    how = data.draw(st.sampled_from(["event", "bytes", "cut", "repeat"]))
    if how == "event":
        raw = mutate_event(REAL, data)
    elif how == "bytes":
        raw = data.draw(st.binary(max_size=300)) + REAL[:data.draw(st.integers(0, len(REAL)))]
    elif how == "cut":
        raw = REAL[:data.draw(st.integers(0, len(REAL)))]
    else:
        raw = REAL * data.draw(st.integers(1, 30))
    try:
        events, other = parse_output(raw, 3)
    except CollectiveReplyError as e:
        assert str(e).startswith(("malformed collective reply", "unreadable collective reply"))
    else:
        assert len(events) <= 16 and len(other) <= 10
        for ev in events:
            for m in ev.get("world", []):
                assert 1 <= m[0] <= 1 << 40 and 0 <= m[3] <= m[2] <= 1e6
    outputs = measured(3, {})
    outputs["h1"] = raw
    rep = collectives.evaluate(inv(3), ok_results(3), outputs)  # never raises: the bad host is that host's problem
    assert len(rep.hosts) == 3 and json.dumps(rep.to_dict())


def test_program_file_is_the_one_plan_sends():
    assert node.source("collective") == (Path(node.__file__).parent / "collective.py").read_text()


def test_collective_and_diff_together_is_bad_input(tmp_path):
    from helpers import cddp
    (tmp_path / "inv.yaml").write_text("hosts: [{name: a}]\n")
    r = cddp("check", str(tmp_path / "inv.yaml"), "--collective", "--diff", check_rc=2, timeout=60)
    assert "error: --collective and --diff are two different checks" in r.stderr and "Traceback" not in r.stderr
