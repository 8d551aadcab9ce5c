"""The root cause of a failed run from what nodes left (clusterddp.failure, clusterddp.node.diagnose):
error files as torch and clusterddp.train write them, torchrun's failure table, the order of failures,
the record's `failure` object, and hostile input (hypothesis)."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterddp import failure as failure_parsing
from clusterddp import node
from clusterddp.errors import RecordError
from clusterddp.node import diagnose as diagnose_module
from clusterddp.record import RunRecord, RunStatus
from helpers import cddp, make_record, record, run_id_of


def torch_error_file(tmp_path: Path, monkeypatch) -> str:
    """An error file written by torch elastic's own ErrorHandler (what ``@record`` uses)."""
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))

    def inner():
        raise KeyError("no such shard")
    try:
        inner()
    except KeyError as e:
        ErrorHandler().record_exception(e)
    return path.read_text()


def test_torch_error_file_gives_type_message_frames_and_whole_second_time(tmp_path, monkeypatch):
    r = failure_parsing.parse_error_file(torch_error_file(tmp_path, monkeypatch), local_rank=1)
    assert r is not None and (r.exc_type, r.message, r.local_rank, r.rank) == ("KeyError", "'no such shard'", 1, None)
    assert r.frames[-1].endswith('in inner: raise KeyError("no such shard")')
    assert r.time == int(r.time) and not r.precise


def test_train_hook_writes_torch_format_with_rank_and_precise_time(tmp_path):
    path = tmp_path / "error.json"
    script = ("import clusterddp.train as ct\nct.record_errors()\ndef step():\n    raise ValueError('bad batch')\n"
              "step()\n")
    p = subprocess.run([sys.executable, "-c", script], env={**os.environ, "TORCHELASTIC_ERROR_FILE": str(path),
                                                            "RANK": "5"}, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "ValueError: bad batch" in p.stderr  # still reported as usual
    r = failure_parsing.parse_error_file(path.read_text(), local_rank=0)
    assert r is not None and (r.exc_type, r.message, r.rank, r.precise) == ("ValueError", "bad batch", 5, True)
    assert r.frames[-1] == "<string>:4 in step"
    # and torch's own reader takes it (the format is torch's)
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
    pf = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(path))
    assert pf.message["message"] == "ValueError: bad batch"


def table(failures: dict) -> str:
    """torchrun's ChildFailedError text for ``{rank: (local_rank, exitcode, pid)}`` (no error files)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
    return str(ChildFailedError("fail.py", {rank: ProcessFailure(local_rank=lr, pid=pid, exitcode=code,
                                                                error_file="/nonexistent")
                                            for rank, (lr, code, pid) in failures.items()}))


def test_torchrun_table_gives_signalled_ranks():
    log = ("noise\n" + table({3: (1, -9, 4242), 2: (0, 7, 4241)})).encode()
    got = {r.rank: r for r in failure_parsing.torchrun_failures(log)}
    assert got[3].kind == "signal" and got[3].signal == "SIGKILL" and got[3].pid == 4242 and got[3].local_rank == 1
    assert got[2].kind == "exit" and got[2].exit_code == 7
    assert math.isfinite(got[3].time)


def facts(host, rank, state="failed", code=1, errors=(), log=b"", kernel=(), joined=True, error=None, nproc=2):
    report = {"joined": joined, "reach": None, "errors": list(errors), "kernel_lines": list(kernel),
              "kernel_error": None, "nvidia_smi": None, "log": None}
    return failure_parsing.NodeFacts(host, rank, nproc, state, code, error, log, report)


def efile(local_rank, exc, msg, t, rank=None, attempt=0):
    extra = {"py_callstack": "Traceback (most recent call last):\n  File \"t.py\", line 3, in f\n    g()\n",
             "timestamp": str(int(t))}
    if rank is not None:
        extra["clusterddp"] = {"rank": rank, "time": t}
    return {"attempt": attempt, "local_rank": local_rank, "data": json.dumps(
        {"message": {"message": f"{exc}: {msg}", "extraInfo": extra}}), "truncated": False}


def test_first_failure_by_precise_time_not_by_the_node_that_ended_first():
    t = 1_800_000_000.25
    a = facts("a", 0, errors=[efile(0, "RuntimeError", "Connection closed by peer", t + 0.3, rank=0)])
    b = facts("b", 1, errors=[efile(1, "ValueError", "boom", t, rank=3),
                              efile(0, "RuntimeError", "Connection closed by peer", t + 0.4, rank=2)])
    f = failure_parsing.diagnose([a, b], first_failed="a")
    assert (f.host, f.rank, f.local_rank, f.kind) == ("b", 3, 1, "exception")
    assert (f.exc_type, f.message) == ("ValueError", "boom")
    assert f.frames == ("t.py:3 in f: g()",)
    assert f.others == (("a", "failed exit 1 - rank 0: RuntimeError: Connection closed by peer"),)


def test_whole_second_ties_go_to_the_node_that_ended_first_and_ranks_come_from_node_rank():
    a = facts("a", 0, errors=[efile(1, "RuntimeError", "peer", 1_800_000_000)])
    b = facts("b", 1, errors=[efile(0, "ValueError", "boom", 1_800_000_000)])
    f = failure_parsing.diagnose([a, b], first_failed="b")
    assert (f.host, f.rank) == ("b", 2)  # node 1 x 2 processes + local rank 0
    assert failure_parsing.diagnose([a, b], first_failed="a").host == "a"


def test_ranks_torchrun_sigtermed_after_another_failed_are_not_its_cause():
    # torchrun ends a failed rank's siblings with SIGTERM ("closing signal"); its table lists them too
    log = table({0: (0, -15, 700)}).encode()
    noticed = failure_parsing.torchrun_failures(log)[0].time
    node = facts("local", 0, log=log, errors=[efile(1, "OSError", "disk full", noticed + 0.2, rank=1)])
    f = failure_parsing.diagnose([node], first_failed="local")
    assert (f.rank, f.kind, f.exc_type) == (1, "exception", "OSError")
    # a SIGTERM that is all a node has to show is still named
    alone = failure_parsing.diagnose([facts("local", 0, log=log)], first_failed="local")
    assert (alone.rank, alone.kind) == (0, "signal")


def test_a_signal_noticed_in_the_next_second_still_precedes_the_errors_it_caused():
    log = table({3: (1, -9, 777)}).encode()  # the table's time: now, in whole seconds
    noticed = failure_parsing.torchrun_failures(log)[0].time
    echo = facts("a", 0, errors=[efile(0, "RuntimeError", "Connection closed by peer", noticed - 0.05, rank=0)])
    f = failure_parsing.diagnose([echo, facts("b", 1, log=log)], first_failed="a")
    assert (f.host, f.rank, f.kind) == ("b", 3, "signal")


def test_sigkill_with_the_oom_killer_in_the_kernel_log_is_out_of_memory():
    log = table({1: (1, -9, 777)}).encode()
    oom = "[ 99.1] Out of memory: Killed process 777 (python) total-vm:1kB"
    f = failure_parsing.diagnose([facts("a", 0, log=log, kernel=[oom])], "a")
    assert (f.kind, f.rank, f.signal) == ("oom", 1, "SIGKILL")
    assert f.summary.startswith("killed by the kernel: out of memory") and "Killed process 777" in f.summary
    other_pid = failure_parsing.diagnose([facts("a", 0, log=log, kernel=[oom.replace("777", "778")])], "a")
    assert other_pid.kind == "signal" and other_pid.summary == "killed by SIGKILL" and other_pid.log_tail


def test_without_a_rank_error_never_joined_lost_and_exit_say_what_is_known():
    never = facts("b", 1, code=1, joined=False, log=b"line 1\nconnect timed out\n")
    f = failure_parsing.diagnose([facts("a", 0, state="stopped", code=143), never], "b")
    assert f.kind == "never_joined" and f.host == "b" and f.log_tail[-1] == "connect timed out"
    lost = failure_parsing.diagnose([facts("a", 0, state="lost", code=None, error="stopped answering")], "a")
    assert (lost.kind, lost.summary) == ("lost", "lost: stopped answering")
    plain = failure_parsing.diagnose([facts("a", 0, code=98, log=b"[clusterddp] setup failed: x\n")], "a")
    assert plain.kind == "exit" and plain.summary == "exit 98" and plain.log_tail == ("[clusterddp] setup failed: x",)
    # a SIGTERM on a node we stopped is not a failure of its own, nor what its ranks raised then
    stopped = facts("a", 0, state="stopped", code=143, log=table({0: (0, -15, 5)}).encode(),
                    errors=[efile(1, "RuntimeError", "Connection closed by peer", 1.8e9, rank=1)])
    f = failure_parsing.diagnose([stopped, replace(never, state="lost", error="stopped answering")], "b")
    assert (f.host, f.kind) == ("b", "lost")
    assert f.others[0][0] == "a" and f.others[0][1].startswith("stopped exit 143 - rank ")


def test_failure_round_trips_through_run_json_and_old_records_read():
    f = failure_parsing.diagnose([facts("a", 0, errors=[efile(0, "ValueError", "boom", 1.8e9, rank=0)]),
                    facts("b", 1, state="stopped", code=143)], "a")
    rec = replace(make_record("r1", status=RunStatus.FAILED), failure=f)
    data = json.loads(json.dumps(rec.to_json()))
    assert RunRecord.from_json(data, "run.json").failure == f
    del data["failure"]
    assert RunRecord.from_json(data, "run.json").failure is None


@pytest.mark.parametrize("change, field", [
    (lambda f: f.update(kind="exploded"), "failure.kind"),
    (lambda f: f.update(host="../etc"), "failure.host"),
    (lambda f: f.update(rank=-1), "failure.rank"),
    (lambda f: f.update(frames=["x"] * 50), "failure.frames"),
    (lambda f: f.update(summary="x" * 100000), "failure.summary"),
    (lambda f: f.update(others=[{"host": "a", "note": 3}]), "failure.others[0].note"),
    (lambda f: f.update(message="a\x00b"), "failure.message"),
])
def test_a_damaged_failure_in_run_json_is_refused_naming_the_field(change, field):
    f = failure_parsing.Failure("a", "exception", "ValueError: boom", rank=0, local_rank=0).to_json()
    change(f)
    data = {**make_record("r1", status=RunStatus.FAILED).to_json(), "failure": f}
    with pytest.raises(RecordError, match="run.json: " + re.escape(field) + ":"):
        RunRecord.from_json(data, "run.json")


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=12), c, max_size=4),
                    max_leaves=20)
KEYS = st.sampled_from(["message", "extraInfo", "py_callstack", "timestamp", "clusterddp", "rank", "time"])
SHAPED = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=200),
                      lambda c: st.lists(c, max_size=3) | st.dictionaries(KEYS, c, max_size=5), max_leaves=25)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=300), JSON.map(json.dumps), SHAPED.map(json.dumps),
                 st.sampled_from(['{"message": "E\\u0000: a\\ud800b\\u0000"}', '{"message": "\\udfff: x"}'])),
       st.integers(0, 7))
def test_error_file_parser_never_raises_and_keeps_its_bounds(text, local_rank):
    r = failure_parsing.parse_error_file(text, local_rank)
    if r is not None:
        assert len(r.exc_type or "") <= failure_parsing.MAX_TYPE and len(r.message or "") <= failure_parsing.MAX_MESSAGE
        assert len(r.frames) <= failure_parsing.MAX_FRAMES and all(
            len(x) <= failure_parsing.MAX_FRAME for x in r.frames
        )
        assert r.time == math.inf or 0 <= r.time < 1e11
        f = failure_parsing.diagnose([facts("a", 0, errors=[{"attempt": 0, "local_rank": local_rank, "data": text,
                                                "truncated": False}])], "a")
        rec = replace(make_record("r1", status=RunStatus.FAILED), failure=f)  # what a node sent never
        assert RunRecord.from_json(json.loads(json.dumps(rec.to_json())), "run.json").failure == f  # breaks run.json


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.binary(max_size=200), SHAPED.map(lambda v: json.dumps({"joined": True, "errors": [v],
                                                                            "kernel": v, "reach": v}).encode())))
def test_diagnose_answer_reader_raises_only_answer_error(data):
    try:
        a = diagnose_module.read_answer(data)
    except diagnose_module.AnswerError:
        return
    assert isinstance(a["joined"], bool) and all(isinstance(e["data"], str) for e in a["errors"])


def test_huge_or_deep_error_files_are_refused_not_parsed():
    assert failure_parsing.parse_error_file("[" * 100000, 0) is None
    assert (
        failure_parsing.parse_error_file(json.dumps({"message": "x" * (failure_parsing.MAX_ERROR_FILE + 1)}), 0) is None
    )
    long = failure_parsing.parse_error_file(json.dumps({"message": "E: " + "y\n" * 5000}), 0)
    assert long is not None and long.message.count("\n") < failure_parsing.MAX_MESSAGE_LINES


def bare(args: list[str], cwd: Path, path: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-S", "-c", node.source("diagnose"), *args], cwd=cwd, capture_output=True,
                          timeout=60, env={"PATH": path})


def test_node_program_reads_error_files_bounded_without_links_and_the_kernel_lines(tmp_path):
    ctl = tmp_path / "ctl"
    rank_dir = ctl / "errors" / "none_x1" / "attempt_0"
    (rank_dir / "0").mkdir(parents=True)
    (rank_dir / "1").mkdir()
    (rank_dir / "2").mkdir()
    (rank_dir / "0" / "error.json").write_text("z" * (diagnose_module.MAX_ERROR_BYTES + 10))
    (tmp_path / "secret").write_text("secret")
    (rank_dir / "1" / "error.json").symlink_to(tmp_path / "secret")
    (rank_dir / "2" / "error.json").write_text('{"message": "E: x"}')
    (ctl / "node.log").write_bytes(b"a" * (diagnose_module.MAX_LOG + 5) + b"\nlast line\n")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "dmesg").write_text("#!/bin/sh\necho 'Out of memory: Killed process 12 (python)'\necho 'usb 1-1: hi'\n")
    (fake / "dmesg").chmod(0o755)
    p = bare([str(ctl), json.dumps({"mode": "report", "master": None})], tmp_path, f"{fake}:/usr/bin:/bin")
    a = diagnose_module.read_answer(p.stdout)
    assert a["joined"] is True and a["nvidia_smi"] is None  # no nvidia-smi on PATH: not a GPU node
    by_rank = {e["local_rank"]: e for e in a["errors"]}
    assert set(by_rank) == {0, 2}  # the link is not followed
    assert by_rank[0]["truncated"] and len(by_rank[0]["data"]) == diagnose_module.MAX_ERROR_BYTES
    assert a["kernel_lines"] == ["Out of memory: Killed process 12 (python)"]
    assert a["log"].endswith("last line\n") and len(a["log"]) == diagnose_module.MAX_LOG
    p = bare([str(tmp_path / "nowhere"), json.dumps({"mode": "joined", "master": ["127.0.0.1", 9]})], tmp_path, "")
    a = diagnose_module.read_answer(p.stdout)
    assert a["joined"] is False and a["reach"] == "refused" and a["errors"] == []


def test_signal_names_come_from_the_exit_code():
    assert failure_parsing.RankError(0, 0, "signal", exit_code=-signal.SIGSEGV).text() == "killed by SIGSEGV"


def test_up_local_names_the_failing_rank_and_its_exception(tmp_path):
    (tmp_path / "bad.py").write_text("import clusterddp.train as ct\nctx = ct.init()\nif ctx.rank == 1:\n"
                                     "    raise OSError('disk full')\nct.cleanup()\n")
    r = cddp("up", "local", "bad.py", "--gpus", "2", "--runs-dir", "runs", cwd=tmp_path, check_rc=1)
    assert "root cause: local, rank 1 (local rank 1): OSError: disk full" in r.stderr, r.stderr
    assert "bad.py:4 in <module>: raise OSError('disk full')" in r.stderr
    f = record(tmp_path / "runs", run_id_of(r.stdout))["failure"]
    assert (f["host"], f["kind"], f["rank"], f["others"]) == ("local", "exception", 1, [])


def test_up_local_an_argparse_error_is_the_root_cause_with_the_ranks_own_lines(tmp_path):
    # argparse prints its usage and `prog: error: ...` and exits 2, without a traceback (issue 24)
    (tmp_path / "args.py").write_text("import argparse\np = argparse.ArgumentParser()\n"
                                      "p.add_argument('--steps', type=int)\np.parse_args()\n")
    r = cddp("up", "local", "args.py", "--gpus", "2", "--runs-dir", "runs", "--", "--bogus", cwd=tmp_path,
             check_rc=1)
    assert re.search(r"root cause: local, rank [01] \(local rank [01]\): exited with code 2: args\.py: error: "
                     r"unrecognized arguments: --bogus\n", r.stderr), r.stderr
    f = record(tmp_path / "runs", run_id_of(r.stdout))["failure"]
    assert f["kind"] == "exit" and f["message"] == "args.py: error: unrecognized arguments: --bogus", f
    assert "usage: args.py [-h] [--steps STEPS]" in f["log_tail"], f
    assert not [line for line in f["log_tail"] if "exitcode" in line or "=====" in line or "elastic" in line], f


GLOO_ECHO = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:31930. "
             "This is typically caused by a remote worker crashing. Check the logs of the remote worker before "
             "reporting an error. GLHF!")


def _ranks_log(table_text: str, tracebacks: dict[int, tuple[str, str]]) -> bytes:
    """A node's log as a plain script leaves it: each rank's traceback (``[rankN]: ``), then torchrun's table."""
    lines = []
    for rank, (where, last) in tracebacks.items():
        lines += [f"[rank{rank}]: Traceback (most recent call last):",
                  f'[rank{rank}]:   File "/w/runs/r/fail.py", line 12, in <module>', f"[rank{rank}]:     {where}",
                  f"[rank{rank}]: {last}"]
    return ("\n".join(lines) + "\n" + table_text).encode()


def test_a_first_hand_exception_on_a_node_recorded_stopped_beats_echoes_on_the_node_that_ended_first():
    # The Slurm bed's race (issue 40, about one run in six): rank 3 raises on node-2; node-1's ranks raise
    # gloo's "Connection closed by peer" in the same second, and node-1's exit code is written first, so
    # the outcome calls node-1 failed first and node-2 stopped. The root cause is still rank 3's error.
    t = 1_800_000_000
    a = facts("node-1", 0, errors=[efile(1, "RuntimeError", GLOO_ECHO, t)])
    b = facts("node-2", 1, state="stopped", errors=[efile(1, "ValueError", "plain boom", t)])
    f = failure_parsing.diagnose([a, b], first_failed="node-1")
    assert (f.host, f.rank, f.exc_type, f.message) == ("node-2", 3, "ValueError", "plain boom")
    # from the logs alone (a plain script: no error files), as on the bed
    log1 = _ranks_log(table({1: (1, 1, 701), 0: (0, -15, 700)}),
                      {1: ("dist.all_reduce(torch.ones(1))", f"RuntimeError: {GLOO_ECHO}")})
    log2 = _ranks_log(table({3: (1, 1, 801), 2: (0, -15, 800)}),
                      {3: ("explode(5)", "ValueError: plain boom at step 5")})
    f = failure_parsing.diagnose([facts("node-1", 0, log=log1), facts("node-2", 1, state="stopped", log=log2)],
                   first_failed="node-1")
    assert (f.host, f.rank, f.kind, f.exc_type) == ("node-2", 3, "exception", "ValueError"), f
    # an echo is still named when it is all there is, and a first-hand failure on the node that ended
    # first keeps winning over one on a stopped node
    assert failure_parsing.diagnose([a, facts("node-2", 1, state="stopped")], first_failed="node-1").host == "node-1"
    own = facts("node-1", 0, errors=[efile(1, "OSError", "disk full", t)])
    assert failure_parsing.diagnose([own, b], first_failed="node-1").exc_type == "OSError"


def test_an_echo_on_the_root_causes_own_node_in_the_same_second_never_hides_it():
    # The Slurm bed's remaining race (issue 40): on node-2, rank 3 raises; rank 2, in the all_reduce with
    # it, raises gloo's "Connection closed by peer" and exits 1 before torchrun's monitor looks (most
    # runs torchrun SIGTERMs it first). torchrun's table then lists both with exit code 1, in the same
    # whole second: rank 2, the lower rank, must not be taken for the cause.
    echo = ("dist.all_reduce(torch.ones(1))", f"RuntimeError: {GLOO_ECHO}")
    boom = ("explode(5)", "ValueError: plain boom at step 5")
    log2 = _ranks_log(table({2: (0, 1, 800), 3: (1, 1, 801)}), {3: boom, 2: echo})
    log1 = _ranks_log(table({0: (0, -15, 700), 1: (1, -15, 701)}), {})
    for first, states in (("node-2", ("stopped", "failed")), ("node-1", ("failed", "stopped"))):
        nodes = [facts("node-1", 0, state=states[0], log=log1 if first == "node-2" else
                       _ranks_log(table({0: (0, 1, 700), 1: (1, 1, 701)}), {0: echo, 1: echo})),
                 facts("node-2", 1, state=states[1], log=log2)]
        f = failure_parsing.diagnose(nodes, first_failed=first)
        assert (f.host, f.rank, f.exc_type) == ("node-2", 3, "ValueError"), (first, f.summary)
    # with error files' precise times too: an echo a little earlier than the cause is still its echo
    t = 1_800_000_000
    b = facts("node-2", 1, errors=[efile(0, "RuntimeError", GLOO_ECHO, t + 0.01, rank=2),
                                   efile(1, "ValueError", "plain boom", t + 0.02, rank=3)])
    assert failure_parsing.diagnose([facts("node-1", 0, state="stopped"), b], first_failed="node-2").rank == 3


def _error_file(message, **extra) -> str:
    return json.dumps({"message": {"message": message, "extraInfo": extra}})


def test_the_error_file_parser_at_the_bounds_mutation_testing_found_unpinned():
    """scripts/mutate.sh's survivors in parse_error_file and _split_head that are rules: torch's older
    flat format and its whole-second timestamp, the accepted times (0 to 1e11, either end), the rank's
    range (0 to 10**7), the size cap (at it: parsed), the type before the first ': ' only."""
    flat = failure_parsing.parse_error_file(json.dumps({"message": "ValueError: x", "timestamp": "1800000000"}), 0)
    assert flat is not None and (flat.exc_type, flat.time, flat.precise) == ("ValueError", 1.8e9, False)
    for t, want in ((0, 0.0), (1e11 - 1, 1e11 - 1), (1e11, math.inf), (-1, math.inf)):
        assert failure_parsing.parse_error_file(_error_file("E: x", timestamp=str(t)), 0).time == want, t
        ours = failure_parsing.parse_error_file(_error_file("E: x", timestamp="5", clusterddp={"time": t}), 0)
        assert (ours.time, ours.precise) == ((want, True) if want != math.inf else (5.0, False)), t
    for rank, want in ((0, 0), (10 ** 7, 10 ** 7), (10 ** 7 + 1, None), (-1, None), (True, None)):
        assert failure_parsing.parse_error_file(_error_file("E: x", clusterddp={"rank": rank}), 1).rank == want, rank
    padded = _error_file("E: x", pad="p" * failure_parsing.MAX_ERROR_FILE)[:failure_parsing.MAX_ERROR_FILE]
    at_cap = padded[:-len('"}}}')] + '"}}}'
    assert len(at_cap) == failure_parsing.MAX_ERROR_FILE and failure_parsing.parse_error_file(at_cap, 0) is not None
    assert failure_parsing.parse_error_file(at_cap + " ", 0) is None
    assert failure_parsing._split_head("ValueError: bad: thing") == ("ValueError", "bad: thing")
    assert failure_parsing._split_head("KeyboardInterrupt") == ("KeyboardInterrupt", "")
    assert failure_parsing._split_head("no type here: x") == ("Error", "no type here: x")
    assert failure_parsing._split_head("TypeError:") == (
        "Error",
        "TypeError:",
    )  # no ': ' at all: not a type and a message
