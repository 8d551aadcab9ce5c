"""The stall watchdog's pure parts: progress lines found in node.log's bytes however they are chunked,
the decision with a fake clock (one node; several agreeing through a shared counter), the launch.sh
lines, the options' precedence and bad values, and the launcher reading a node's hang record (bounded,
never raising) into ``failure.kind: hang`` with the odd rank named first."""

from __future__ import annotations

import json
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterddp import hang as hang_module
from clusterddp import inventory, noise
from clusterddp.errors import InventoryError, UsageError
from clusterddp.failure import AGENT_LINE
from clusterddp.node import watch as watcher
from clusterddp.plan import build_plan
from clusterddp.record import RunRecord
from clusterddp.runspec import RunSpec, watch_args
from clusterddp.store import RunStore
from helpers import make_record, resolved
from test_stacks import STUCK, WAITING, dump, proc, reply


def lines(regex=None) -> watcher.Lines:
    return watcher.Lines(regex, [p for p, tail in noise.LINES if not tail] + ["^" + AGENT_LINE.pattern],
                   [p for p, tail in noise.LINES if tail])


LOG = (b"[clusterddp] node 0/2 on gpu-01\n"
       b"/v/torch/_subclasses/functional_tensor.py:368: UserWarning: Failed to initialize NumPy: "
       b"No module named 'numpy' (Triggered internally)\n"
       b"  cpu = _conversion_method_template(device=torch.device(\"cpu\"))\n"
       b"*****************************************\n"
       b"Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid\n"
       b"W1202 02:54:23.736000 20332 torch/distributed/elastic/agent/server/api.py:753] Received 15 death signal\n"
       b"[W1202 02:57:55.785557420 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved.\n"
       b"\n"
       b"epoch 0 step 1 loss 2.3\n"
       b"  10%|#         | 1/10\r  20%|##        | 2/10\r"
       b"[clusterddp] stall: ending the job on this node\n"
       b"step 2 loss 2.1\n")


def test_progress_is_the_ranks_own_lines_not_ours_nor_torchs_noise():
    assert lines().feed(LOG) == 4  # "epoch 0 step 1", two progress bar updates, "step 2"
    assert lines(r"step (\d+)").feed(LOG) == 2


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, len(LOG)), max_size=12))
def test_progress_does_not_depend_on_how_the_log_arrives_in_chunks(cuts):
    at = sorted(set(cuts))
    chunks = [LOG[a:b] for a, b in zip([0, *at], [*at, len(LOG)], strict=True)]
    ls = lines()
    assert sum(ls.feed(c) for c in chunks) == 4


def test_an_unended_line_waits_for_its_end_and_a_huge_one_counts_once():
    ls = lines()
    assert ls.feed(b"step 1 of a line not ended yet") == 0
    assert ls.feed(b" ... ended\n") == 1
    assert ls.feed(b"x" * (watcher.MAX_LINE + 1)) == 1 and ls.rest == b""


def test_one_node_decides_from_its_own_lines_and_only_after_the_first():
    d = watcher.Decider(20.0, now=0.0)
    assert not d.stalled(1000.0)  # nothing printed yet: still starting (torch's import, data loading)
    d.local(1, now=100.0)
    assert not d.stalled(119.9) and d.stalled(120.0)
    d.local(0, now=119.0)  # no line: no progress
    d.local(2, now=130.0)
    assert not d.stalled(149.0) and d.stalled(150.0)


def test_several_nodes_decide_only_once_every_watcher_is_there_from_the_shared_counter():
    d = watcher.Decider(20.0, now=0.0, nnodes=2)
    d.shared(5, watchers=1, now=1.0)  # rank 0's lines on the other node, counted; this node's watcher only
    assert not d.stalled(100.0)
    d.shared(5, watchers=2, now=101.0)  # the other node's watcher is there now
    assert not d.stalled(101.0 + 19.9) and d.stalled(101.0 + 20.0)  # counted from the last change seen
    d.shared(6, watchers=2, now=115.0)  # progress on another node: this node prints nothing, and waits on
    assert not d.stalled(134.9) and d.stalled(135.0)


def test_a_node_that_never_reads_the_store_never_decides_nor_one_that_saw_no_line_anywhere():
    d = watcher.Decider(5.0, now=0.0, nnodes=2)
    d.local(3, now=1.0)  # its own lines are not enough: the other node may be the one printing
    assert not d.stalled(1e6)
    d = watcher.Decider(5.0, now=0.0, nnodes=2)
    d.shared(0, watchers=2, now=1.0)  # every watcher there, but no rank has printed yet: still starting
    d.shared(0, watchers=2, now=1000.0)
    assert not d.stalled(1e6)


def test_the_hang_record_is_what_the_launcher_reads(tmp_path):
    d = watcher.Decider(20.0, now=0.0)
    d.local(1, now=10.0)
    rec = watcher.hang_record({"host": "gpu-02"}, d, 31.0, "gpu-01", "hang-stacks.txt", 2)
    got = hang_module.parse_node(
        "gpu-02", json.dumps(rec).encode() + b"\n" + hang_module.SEPARATOR.encode() + b"\nREPLY"
    )
    assert got is not None and (got.timeout, got.silent_s, got.decided_by, got.stacks) == (20.0, 21.0, "gpu-01",
                                                                                           b"REPLY")


def test_no_hang_record_is_none_and_a_bad_one_is_a_note():
    assert hang_module.parse_node("a", b"") is None
    assert hang_module.parse_node("a", b"[1,2]\n" + hang_module.SEPARATOR.encode() + b"\nx").note == \
        "hang.json is not the watchdog's JSON object"
    assert hang_module.parse_node("a", b"garbage with no separator").note == "an unreadable hang.json"


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=3000), st.binary(max_size=300))
def test_a_nodes_hang_record_never_raises(head, rest):
    got = hang_module.parse_node("a", head + b"\n" + hang_module.SEPARATOR.encode() + b"\n" + rest)
    assert got is not None and len(got.stacks) <= hang_module.STACKS_MOST and (got.note is None or len(got.note) <= 240)


@settings(max_examples=50, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=20),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=4),
                    max_leaves=20),
       st.sampled_from(["timeout", "silent_s", "time", "decided_by", "stacks"]))
def test_any_json_in_a_hang_record_field_is_read_without_raising(value, key):
    good = {"timeout": 20, "silent_s": 21, "time": 1.0, "decided_by": "a", "stacks": "hang-stacks.txt"}
    good[key] = value
    hang_module.parse_node("a", json.dumps(good).encode() + b"\n" + hang_module.SEPARATOR.encode() + b"\n")


def _hang(host: str, stacks: bytes, by: str = "a") -> hang_module.NodeHang:
    return hang_module.NodeHang(host, 20.0, 21.4, by, 1.0, stacks)


def test_the_hang_names_the_odd_rank_first_and_saves_every_dump(tmp_path):
    store = RunStore(tmp_path / "runs")
    rec: RunRecord = make_record("r", hosts=("a", "b"))
    store.create(rec)
    a = reply([proc(11, 0, 0, WAITING), proc(12, 1, 1, WAITING)])
    b = reply([proc(21, 2, 0, WAITING), proc(22, 3, 1, STUCK)])
    f = hang_module.hang_of(rec, store, {"a": _hang("a", a), "b": _hang("b", b)})
    assert (f.kind, f.host, f.rank, f.local_rank) == ("hang", "b", 3, 1)
    assert f.summary == ("hang: no rank made progress for 21s (stall timeout 20s); rank 3 (b local 1) not where "
                         "the others are: stuck_in_my_function -> wait (train.py:7)")
    text = f.lines()
    assert text[1] == "  rank 3 (b local 1, pid 22): stuck_in_my_function -> wait (train.py:7)  <- the odd one out"
    assert text[2].strip() == "stuck_in_my_function (/w/runs/r/train.py:7)"
    assert "  ranks 0-2 (a, b): step -> all_reduce (train.py:12)" in text
    assert f.hang is not None and f.hang.stacks_dir and (tmp_path / "runs" / "r" / "stacks").is_dir()
    assert "stuck_in_my_function" in next((tmp_path / "runs" / "r" / "stacks").glob("*/b/rank3.txt")).read_text()
    # run.json holds it and reads it back as it was
    back = RunRecord.from_json(json.loads(json.dumps({**rec.to_json(), "failure": f.to_json()})), "run.json")
    assert back.failure == f


def test_a_node_without_stacks_is_named_and_the_others_still_grouped(tmp_path):
    rec = make_record("r", hosts=("a", "b"))
    a = reply([proc(11, 0, 0, WAITING), proc(12, 1, 1, WAITING), proc(13, 2, 2, dump(("/w/x.py", 3, "f")))])
    f = hang_module.hang_of(
        rec, None, {"a": _hang("a", a), "b": hang_module.NodeHang("b", 20.0, 21.0, "a", 1.0, b"", "no stacks taken")}
    )
    assert f.rank == 2 and f.hang is not None and ("b", "no stacks taken") in f.hang.missing


def test_run_json_refuses_a_damaged_hang(tmp_path):
    from clusterddp.errors import RecordError
    rec = make_record("r", hosts=("a",))
    bad = {"host": "a", "kind": "hang", "summary": "s", "hang": {"timeout": 20, "silent_s": -1, "decided_by": None,
                                                                  "groups": []}}
    with pytest.raises(RecordError, match="failure.hang.silent_s"):
        RunRecord.from_json({**rec.to_json(), "failure": bad}, "run.json")


# ---- the plan and the options ----

INV = """
hosts:
  - {name: a, address: 10.0.0.1}
  - {name: b, address: 10.0.0.2}
"""


def test_launch_sh_starts_the_watchdog_only_with_a_stall_timeout_and_is_valid_bash():
    inv = inventory.parse(INV, "inv.yaml")
    plain = build_plan(inv, resolved(RunSpec("t.py"), inv), "r1").nodes[1].launch_script
    assert "CDDP_WATCH_PID" not in plain and "cddp_exit $?" in plain  # (the sampler writes watch.py for its reader)
    spec = resolved(RunSpec("t.py", stall_timeout=30.0, progress_regex=r"it (\d+)"), inv)
    script = build_plan(inv, spec, "r1").nodes[1]
    text = script.launch_script
    assert '"$CTL/watch"/watch.py "$CTL" ' in text and "cddp_exit $cddp_rc" in text
    assert '"store": ["10.0.0.1", 29500]' in text and '"timeout": 30.0' in text and '"nnodes": 2' in text
    assert subprocess.run(["bash", "-n"], input=text.encode()).returncode == 0
    assert watch_args(RunSpec("t.py", stall_timeout=5.0), 1, "127.0.0.1", 1)["store"] is None  # one node: no store


def test_the_inventory_takes_a_stall_timeout_and_refuses_bad_ones_located():
    inv = inventory.parse(INV + "stall_timeout: 600\nprogress_regex: 'step (\\d+)'\n", "inv.yaml")
    assert (inv.stall_timeout, inv.progress_regex) == (600.0, r"step (\d+)")
    for bad, why in (("stall_timeout: 0.5", "at least 1 second"), ("stall_timeout: yes", "stall_timeout"),
                     ("progress_regex: '(a)(b)'", "2 groups"), ("progress_regex: '('", "not a regular expression")):
        with pytest.raises(InventoryError, match=why) as e:
            inventory.parse(INV + bad + "\n", "inv.yaml")
        assert "inv.yaml" in str(e.value) and bad.split(":")[0] in str(e.value)


def test_the_flags_win_over_the_inventory_and_zero_turns_it_off():
    from clusterddp.runspec import resolve

    def watchdog(stall: float | None, regex: str | None, inv: inventory.Inventory) -> dict:
        s = resolve(RunSpec("t.py", stall_timeout=stall, progress_regex=regex), inv)
        return {"stall_timeout": s.stall_timeout, "progress_regex": s.progress_regex}
    inv = inventory.parse(INV + "stall_timeout: 600\nprogress_regex: 'loss'\n", "inv.yaml")
    assert watchdog(None, None, inv) == {"stall_timeout": 600.0, "progress_regex": "loss"}
    assert watchdog(30.0, "it", inv) == {"stall_timeout": 30.0, "progress_regex": "it"}
    assert watchdog(0.0, None, inv)["stall_timeout"] is None
    with pytest.raises(UsageError, match="under a second"):
        watchdog(0.5, None, inv)
    with pytest.raises(UsageError, match="groups"):
        watchdog(30.0, "(a)(b)", inv)


def test_the_deciders_edges_mutation_testing_found_unpinned():
    """scripts/mutate.sh's survivors in Decider that are the documented rules: the clock starts at the
    first progress line anywhere (a shared count of 1 is one), a node's watcher is not armed until every
    node's watcher joined, and the clock starts again when the last one joins."""
    d = watcher.Decider(5.0, now=0.0, nnodes=2)
    d.shared(0, 1, now=1.0)
    assert not d.armed  # one watcher of two, no progress yet
    d.shared(1, 1, now=2.0)
    assert d.seen and not d.armed  # the first progress line anywhere; the other node's watcher not there yet
    d.shared(1, 2, now=30.0)  # it joins late: what it missed before is unknown, so the clock starts now
    assert d.armed and d.last == 30.0 and not d.stalled(34.9) and d.stalled(35.0)
    d.shared(1, 2, now=33.0)  # a later read, no new progress: the clock goes on
    assert d.stalled(35.0)
    one = watcher.Decider(5.0, now=0.0)  # a single node: its own watcher is all there is
    one.local(1, now=1.0)
    assert one.armed and not one.stalled(5.9) and one.stalled(6.0)


def test_a_nested_unbounded_repeat_is_refused_inside_a_lookaround_too():
    """scripts/mutate.sh's survivors in regex_problem: a lookahead's body is searched too."""
    for regex in (r"(?=(a+)+)x", r"(?!(\d*)*)x", r"x(?=y|(a+)+)"):
        assert watcher.regex_problem(regex) == ("a repeat inside an unbounded repeat (e.g. (a+)+) can take exponential "
                                          "time on one line"), regex
    assert watcher.regex_problem(r"(?=a+)x") is None and watcher.regex_problem(r"(?=(ab){2})x") is None


def test_the_line_logics_offsets_and_counts_mutation_testing_found_unpinned():
    """scripts/mutate.sh's survivors in Lines.feed: every progress line of a chunk counts, a line split
    across chunks is one, the offset just past the last progress line is exact (the watcher times
    progress by it), and an unended line longer than MAX_LINE is judged at once, once."""
    lines = watcher.Lines(r"step \d+", pos=100)
    assert lines.feed(b"step 1\nnoise\nstep 2\nst") == 2 and lines.last_end == 100 + len(b"step 1\nnoise\nstep 2\n")
    assert lines.feed(b"ep 3\r\nnoise\n") == 1 and lines.last_end == 100 + len(b"step 1\nnoise\nstep 2\nstep 3\r")
    assert lines.pos == 100 + len(b"step 1\nnoise\nstep 2\nstep 3\r\nnoise\n")
    long = watcher.Lines(r"step \d+")
    head = b"step 9 "
    assert long.feed(head + b"x" * (watcher.MAX_LINE - len(head))) == 0 and long.rest  # at the bound: it waits
    assert long.feed(b"x") == 1 and long.last_end == watcher.MAX_LINE + 1 and long.rest == b""
