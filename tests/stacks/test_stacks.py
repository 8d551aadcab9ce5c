"""`clusterddp stacks`' launcher side: every node asked at once through a fake transport at the seam
(one that answers, one that fails, one that answers garbage), the grouping that names the odd rank
out, the dumps saved in the run folder, the text and --json, and a run that has ended refused."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from clusterddp import stacks as stack_dumps
from clusterddp.errors import HostError, HostErrorKind, UsageError
from clusterddp.node import stacks as node_stacks
from clusterddp.node.reply import ReplyError
from clusterddp.record import RunStatus
from clusterddp.sizes import ranges
from clusterddp.store import RunStore
from clusterddp.transport import CommandResult
from helpers import make_record


def dump(*frames: tuple[str, int, str], tid: int = 1) -> str:
    lines = [f"Current thread 0x{tid:016x} (most recent call first):"]
    lines += [f'  File "{f}", line {ln} in {fn}' for f, ln, fn in frames]
    return "\n".join(lines) + "\n"


TORCH = "/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
WAITING = dump((TORCH, 2800, "all_reduce"), ("/w/runs/r/train.py", 12, "step"), ("/w/runs/r/train.py", 30, "<module>"))
STUCK = dump(("/usr/lib/python3.11/threading.py", 320, "wait"), ("/w/runs/r/train.py", 7, "stuck_in_my_function"),
             ("/w/runs/r/train.py", 28, "<module>"))


def proc(pid, rank, local, text, role="rank", how="faulthandler", note=""):
    return {"pid": pid, "role": role, "rank": rank, "local_rank": local, "how": how, "main": "1" if text else None,
            "dump": text, "note": note}


def reply(procs, state="running", exit_code=None) -> bytes:
    return b"motd\n" + (node_stacks.MARK + json.dumps({"time": 1.0, "host": "x", "state": state,
                                                      "exit_code": exit_code, "procs": procs}) + "\n").encode()


class FakeNode:
    def __init__(self, answer) -> None:
        self.answer, self.commands = answer, []

    def run(self, command: str, *, timeout=None, stdin=None) -> CommandResult:
        self.commands.append((command, timeout))
        if isinstance(self.answer, Exception):
            raise self.answer
        return CommandResult(0, self.answer, b"")

    def close(self) -> None:
        pass


def fake(answers: dict):
    nodes = {h: FakeNode(a) for h, a in answers.items()}
    return nodes, (lambda host: nodes[host.name])


def two_by_two(rank3=STUCK):
    # each host has the script in a run folder of its own
    return {"a": reply([proc(10, None, None, dump(("/v/bin/torchrun", 8, "<module>")), role="agent"),
                        proc(11, 0, 0, WAITING), proc(12, 1, 1, WAITING)]),
            "b": reply([proc(21, 2, 0, WAITING.replace("/w/runs/", "/b/runs/")), proc(22, 3, 1, rank3)])}


def test_the_rank_not_where_the_others_are_is_named_first_with_its_own_frames(tmp_path):
    rec = make_record("r", hosts=("a", "b"))
    nodes, connect = fake(two_by_two())
    taken = stack_dumps.take(rec, connect=connect, wait=2.0)
    for n in nodes.values():  # one command each, bounded: the wait on the node plus the answer's bound
        ((command, timeout),) = n.commands
        assert '"wait": 2.0' in command and timeout == stack_dumps.ANSWER_S + 2.0
    groups = stack_dumps.group(taken.procs)
    assert [(g.odd, g.ranks) for g in groups] == [(True, [3]), (False, [0, 1, 2])]
    assert stack_dumps.summary(groups[0].procs[0].main) == "stuck_in_my_function -> wait (train.py:7)"
    assert stack_dumps.summary(groups[1].procs[0].main) == "step -> all_reduce (train.py:12)"
    from clusterddp.cli.stacks import render
    store = RunStore(tmp_path / "runs")
    store.create(rec)
    stack_dumps.save(store, taken)
    text = render(taken, groups)
    assert text[1:4] == ["rank 3 (b local 1, pid 22): stuck_in_my_function -> wait (train.py:7)  <- the odd one out",
                         "    stuck_in_my_function (/w/runs/r/train.py:7)", "    <module> (/w/runs/r/train.py:28)"]
    assert text[4] == "ranks 0-2 (a, b): step -> all_reduce (train.py:12)"
    assert text[5] == "torchrun agent (a, pid 10): <module> (torchrun:8)"
    # every dump saved whole: stacks/<time>/<host>/rank<N>.txt, the agent's by pid
    saved = sorted(p.relative_to(taken.saved).as_posix() for p in taken.saved.rglob("*.txt"))
    assert saved == ["a/agent-10.txt", "a/rank0.txt", "a/rank1.txt", "b/rank2.txt", "b/rank3.txt"]
    assert taken.saved.parent == store.run_dir("r") / "stacks"
    assert STUCK in (taken.saved / "b" / "rank3.txt").read_text()
    data = stack_dumps.to_json(taken, groups)
    assert data["groups"][0]["odd"] and data["groups"][0]["procs"][0]["host"] == "b"
    assert data["groups"][0]["procs"][0]["main"][1] == {"file": "/w/runs/r/train.py", "line": 7,
                                                        "function": "stuck_in_my_function"}


def test_a_node_that_does_not_answer_or_answers_garbage_is_named_and_the_others_shown():
    rec = make_record("r", hosts=("a", "b", "c"))
    answers = two_by_two()
    answers["b"] = HostError("b", "timed out", kind=HostErrorKind.TIMEOUT)
    answers["c"] = node_stacks.MARK.encode() + b'{"time": 1, "procs": "no"}\n'
    taken = stack_dumps.take(rec, connect=fake(answers)[1])
    assert set(taken.unanswered) == {"b", "c"}
    assert "timed out" in taken.unanswered["b"] and "host" in taken.unanswered["c"]
    assert sorted(p.rank for p in taken.procs if p.role == "rank") == [0, 1]


def test_same_place_whatever_line_of_the_innermost_frame_and_no_majority_names_no_odd_one():
    looping = [dump(("/w/t.py", ln, "spin"), ("/w/t.py", 3, "<module>")) for ln in (10, 11)]
    rec = make_record("r", hosts=("a",))
    taken = stack_dumps.take(rec, connect=fake({"a": reply([proc(1, 0, 0, looping[0]), proc(2, 1, 1, looping[1])])})[1])
    assert [(g.odd, g.ranks) for g in stack_dumps.group(taken.procs)] == [(False, [0, 1])]
    taken = stack_dumps.take(rec, connect=fake({"a": reply([proc(1, 0, 0, WAITING), proc(2, 1, 1, STUCK)])})[1])
    assert [g.odd for g in stack_dumps.group(taken.procs)] == [False, False]
    # a rank with no dump (not hooked, no py-spy): its own group, last, saying why
    taken = stack_dumps.take(rec, connect=fake({"a": reply([proc(1, 0, 0, WAITING), proc(2, 1, 1, WAITING),
                                                  proc(3, 2, 2, "", how="none", note="not hooked")])})[1])
    groups = stack_dumps.group(taken.procs)
    assert [g.ranks for g in groups] == [[0, 1], [2]]
    from clusterddp.cli.stacks import render
    assert "rank 2 (a local 2, pid 3): no stack: not hooked" in render(taken, groups)


def test_the_main_thread_is_the_one_the_hook_named_not_the_one_that_took_the_signal():
    text = dump(("/w/t.py", 5, "in_a_thread"), tid=2) + dump(("/w/t.py", 9, "main_work"), tid=1).replace(
        "Current thread", "Thread")
    threads = tuple((t, c, tuple(f)) for t, c, f in node_stacks.parse_dump(text))
    assert stack_dumps._main(threads, "1")[0][2] == "main_work"
    assert stack_dumps._main(threads, None)[0][2] == "in_a_thread"


def test_an_ended_or_unknown_run_is_refused_with_exit_2(tmp_path):
    store = RunStore(tmp_path / "runs")
    store.create(make_record("20261201-000000-done", status=RunStatus.SUCCEEDED, ended_at="2026-12-01T00:01:00Z"))
    with pytest.raises(UsageError, match=r"run 20261201-000000-done has ended \(succeeded at 2026-12-01T00:01:00Z\)"):
        stack_dumps.running_record(store, "20261201-000000")
    from clusterddp.cli.app import app
    r = CliRunner().invoke(app, ["stacks", "nope", "--runs-dir", str(tmp_path / "runs")])
    assert r.exit_code == 2 and "nope" in r.output, r.output
    r = CliRunner().invoke(app, ["stacks", "20261201-000000", "--runs-dir", str(tmp_path / "runs")])
    assert r.exit_code == 2 and "has ended" in r.output and "Traceback" not in r.output, r.output


def test_ranges():
    assert ranges([3, 0, 1, 2, 7, 9, 10]) == "0-3, 7, 9-10"


@pytest.mark.parametrize("edit", [
    {"time": 1e300}, {"time": -1}, {"time": 10 ** 400}, {"exit_code": 999}, {"state": "hung"},
    {"procs": [proc(0, 0, 0, "")]}, {"procs": [proc(1, True, 0, "")]}, {"procs": [proc(1, 0, 0, "", role="daemon")]},
    {"procs": [dict(proc(1, 0, 0, ""), main="zz")]}, {"procs": [proc(1, 0, 0, "x" * (node_stacks.MOST_DUMP + 1))]}])
def test_a_reply_out_of_its_ranges_is_refused(edit):
    r = {"time": 1.0, "host": "x", "state": "running", "exit_code": None, "procs": [], **edit}
    with pytest.raises(ReplyError):
        node_stacks.parse_reply((node_stacks.MARK + json.dumps(r) + "\n").encode())


def test_a_note_from_the_node_is_one_line():
    r = {"time": 1.0, "host": "x", "state": "running", "exit_code": None, "procs": [proc(1, 0, 0, "", note="a\nb")]}
    assert node_stacks.parse_reply((node_stacks.MARK + json.dumps(r)).encode())["procs"][0]["note"] == "a\\nb"


def test_the_command_shows_the_others_when_a_node_does_not_answer_exit_1_and_a_failed_save_is_a_warning(
        tmp_path, monkeypatch):
    rec = make_record("20261201-000000-live", hosts=("a", "b", "c"))
    store = RunStore(tmp_path / "runs")
    store.create(rec)
    answers = two_by_two()
    answers["c"] = HostError("c", "timed out after 10s", kind=HostErrorKind.TIMEOUT)
    real_take = stack_dumps.take
    monkeypatch.setattr(stack_dumps, "take", lambda r, wait: real_take(r, connect=fake(answers)[1], wait=wait))
    (store.run_dir(rec.run_id) / "stacks").write_text("in the way")  # the dumps cannot be saved
    from clusterddp.cli.app import app
    r = CliRunner().invoke(app, ["stacks", "20261201-000000", "--runs-dir", str(tmp_path / "runs")])
    assert r.exit_code == 1, r.output
    assert "rank 3 (b local 1, pid 22): stuck_in_my_function -> wait (train.py:7)  <- the odd one out" in r.output
    assert "c: no stacks: " in r.output and "timed out after 10s" in r.output
    assert "warning: the dumps are not saved" in r.output and "Traceback" not in r.output


DEEP = """import faulthandler, sys, threading
def level1(): level2()
def level2(): level3()
def level3(): level4()
def level4(): level5()
def level5(): level6()
def level6():
    faulthandler.dump_traceback(sys.stdout, all_threads=False)  # as the rank's hook dumps it
    threading.Event().wait(0)  # a library frame inside the user's innermost one, as all_reduce is
level1()
"""


def test_the_frames_shown_are_the_innermost_of_a_real_deeper_stack(tmp_path):
    import subprocess
    import sys

    from clusterddp import hang as hang_module
    from clusterddp.cli.stacks import render
    script = tmp_path / "runs" / "r" / "deep.py"
    script.parent.mkdir(parents=True)
    script.write_text(DEEP)
    text = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True).stdout
    text = text.replace("Stack (most recent call first)", "Current thread 0x0000000000000001 (most recent call first)")
    frames = [f for _, _, f in node_stacks.parse_dump(text)][0]
    assert [fn for _, _, fn in frames] == ["level6", "level5", "level4", "level3", "level2", "level1", "<module>"]
    rec = make_record("r", hosts=("a", "b"))
    nodes, connect = fake({"a": reply([proc(11, 0, 0, WAITING), proc(12, 1, 1, WAITING)]),
                           "b": reply([proc(21, 2, 0, WAITING), proc(22, 3, 1, text)])})
    taken = stack_dumps.take(rec, connect=connect, wait=1.0)
    groups = stack_dumps.group(taken.procs)
    odd = groups[0].procs[0]
    assert groups[0].odd and odd.rank == 3
    want = ["level6", "level5", "level4"]  # the innermost three of the user's seven, innermost first
    assert [fn for _, _, fn in stack_dumps.innermost_users(odd.main)] == want
    shown = "\n".join(render(taken, groups))
    assert [line.split()[0] for line in shown.splitlines() if "deep.py:" in line and "level" in line
            and "<-" not in line] == want, shown
    assert "level1 (" not in shown and "level3 (" not in shown, shown
    assert [f.split(" (")[0] for f in hang_module._rank(odd).frames] == want  # the hang report's, in run.json too
