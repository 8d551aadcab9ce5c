"""`clusterddp top`'s parts: the node program (in-process, on real /proc), its reply checked as
untrusted, and the view's rates, computed from successive looks (a fake transport at the seam)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterddp import top as top_view
from clusterddp.errors import UsageError
from clusterddp.node import top as node_top
from clusterddp.top import TOP_TAIL
from clusterddp.transport import CommandResult
from helpers import make_record


def run_node(capsys, jobs, regex=top_view.DEFAULT_PROGRESS) -> dict:
    assert node_top.main([json.dumps({"jobs": jobs, "regex": regex, "tail": TOP_TAIL})]) == 0
    return node_top.parse_reply(capsys.readouterr().out.encode(), len(jobs))


def test_the_node_program_reports_each_jobs_state_last_line_step_and_processes(tmp_path, capsys):
    running, ended, gone = tmp_path / "running", tmp_path / "ended", tmp_path / "missing"
    for d in (running, ended):
        d.mkdir()
    (running / "node.log").write_bytes(b"[clusterddp] node 0/2\nepoch 0 Step: 41 loss 2.0\n"
                                       b"rank 1 step 42 loss 1.9\nloading 10%\r loading 90%\r\n\n")
    (ended / "node.log").write_bytes(b"global_step=7\ndone \xff\n")
    (ended / "exit_code").write_text("3\n")
    marker = f"test-top-{os.getpid()}/n1"
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                         env={**os.environ, "CLUSTERDDP_JOB": marker})
    try:
        r = run_node(capsys, [[str(running), marker], [str(ended), "other/n1"], [str(gone), "gone/n1"]])
    finally:
        p.kill()
        p.wait()
    a, b, c = r["jobs"]
    assert (a["state"], a["exit_code"], a["procs"]) == ("running", None, 1)
    assert a["last_line"] == " loading 90%" and a["step"] == 42  # what a terminal shows; the last step line
    assert a["rss"] > 0 and a["cpu_seconds"] >= 0
    assert (b["state"], b["exit_code"], b["step"], b["procs"]) == ("exited", 3, 7, 0)
    assert b["last_line"] == "done \ufffd"
    assert (c["state"], c["last_line"], c["step"]) == ("missing", None, None)
    assert r["mem_total"] > r["mem_available"] > 0 and r["cpu_total"] > 0 and r["ncpu"] >= 1
    # a regex of the user's, its group the step; the whole match without one
    assert run_node(capsys, [[str(running), marker]], r"loss (\d+)")["jobs"][0]["step"] == 1
    assert run_node(capsys, [[str(ended), marker]], r"(?<==)\d+")["jobs"][0]["step"] == 7


def test_the_last_line_shown_is_never_torch_noise_nor_the_source_line_of_its_warning(tmp_path, capsys):
    from clusterddp import noise
    (tmp_path / "node.log").write_bytes(
        b"epoch 0 step 4 loss 16.4\n"
        b"/venv/torch/_subclasses/functional_tensor.py:368: UserWarning: Failed to initialize NumPy: No module "
        b"named 'numpy' (Triggered internally at tensor_numpy.cpp:84.)\n"
        b'  cpu = _conversion_method_template(device=torch.device("cpu"))\n'
        b"[W1202 02:47:33.5 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3\n")
    args = {"jobs": [[str(tmp_path), "m/n1"]], "regex": top_view.DEFAULT_PROGRESS, "tail": TOP_TAIL,
            "skip": list(noise.LINE_PATTERNS)}
    assert node_top.main([json.dumps(args)]) == 0
    job = node_top.parse_reply(capsys.readouterr().out.encode(), 1)["jobs"][0]
    assert job["last_line"] == "epoch 0 step 4 loss 16.4"


def reply(**over) -> bytes:
    job = {"state": "running", "exit_code": None, "last_line": "x", "step": 1, "cpu_seconds": 1.0, "rss": 1,
           "procs": 2, "log_mtime": None, "watch": None, "where": None}
    r = {"time": 1000.0, "jobs": [job], "ncpu": 2, "cpu_total": 10, "cpu_idle": 5, "mem_total": 10,
         "mem_available": 5, "gpus": [{"index": 0, "util": 50, "mem_used": 1.0, "mem_total": 2.0}]}
    for k, v in over.items():
        (job if k in job else r)[k] = v
    return b"motd noise\n" + (node_top.MARK + json.dumps(r)).encode() + b"\n"


@pytest.mark.parametrize(("over", "words"), [
    ({"state": "rm -rf"}, "jobs[0].state"), ({"exit_code": 300}, "exit_code"), ({"exit_code": -1}, "exit_code"),
    ({"step": -5}, "step"), ({"step": 1.5}, "step"), ({"step": True}, "step"), ({"rss": "big"}, "rss"),
    ({"cpu_seconds": float("nan")}, "cpu_seconds"), ({"time": None}, "time"), ({"last_line": 7}, "last_line"),
    ({"gpus": [{"index": 0, "util": 150}]}, "gpu util"), ({"gpus": [{}] * 65}, "gpus"), ({"gpus": "all"}, "gpus"),
    ({"jobs": []}, "expected 1 job"), ({"mem_total": -1}, "mem_total"),
])
def test_a_malformed_reply_is_refused_naming_the_value(over, words):
    with pytest.raises(node_top.TopError, match="malformed") as e:
        node_top.parse_reply(reply(**over), 1)
    assert words in str(e.value)


def test_a_reply_is_cut_to_size_and_noise_is_no_reply():
    r = node_top.parse_reply(reply(last_line="\x1b[2J" + "y" * 10_000), 1)
    assert len(r["jobs"][0]["last_line"]) == node_top.MAX_LINE  # kept as sent (escaped when shown)
    for bad in (b"", b"no mark here\n", node_top.MARK.encode() + b"{not json\n", node_top.MARK.encode() + b"[]\n"):
        with pytest.raises(node_top.TopError):
            node_top.parse_reply(bad, 1)


class FakeNode:
    """A transport whose node answers from a script of replies (one per look), counting commands."""

    def __init__(self, name: str, replies: list) -> None:
        self.name, self.replies, self.commands = name, replies, []

    def run(self, command: str, *, timeout=None, stdin=None) -> CommandResult:
        self.commands.append(command)
        r = self.replies.pop(0)
        if isinstance(r, Exception):
            raise r
        return CommandResult(0, r, b"")

    def close(self) -> None:
        pass


def node_reply(t: float, jobs: list[tuple], cpu_total: int = 1000, cpu_idle: int = 500) -> bytes:
    return (node_top.MARK + json.dumps({
        "time": t, "ncpu": 2, "cpu_total": cpu_total, "cpu_idle": cpu_idle, "mem_total": 8 << 30,
        "mem_available": 6 << 30, "gpus": None,
        "jobs": [{"state": "running", "exit_code": None, "last_line": f"step {s}", "step": s, "cpu_seconds": c,
                  "rss": 1 << 20, "procs": 3} for s, c in jobs]})).encode()


def test_one_command_per_host_per_look_and_rates_from_the_nodes_clocks():
    r1, r2 = make_record("run-1", hosts=("a", "b")), make_record("run-2", hosts=("b",))
    nodes = {
        "a": FakeNode("a", [node_reply(100.0, [(10, 5.0)]), node_reply(102.0, [(30, 7.0)]),
                            node_reply(104.0, [(3, 7.5)]), node_reply(105.0, [(5, 8.0)])]),
        "b": FakeNode("b", [node_reply(50.0, [(0, 1.0), (100, 0.0)], 1000, 500),
                            node_reply(51.0, [(0, 1.5), (150, 0.0)], 1200, 550),
                            OSError("link down"), OSError("still down")]),
    }
    with top_view.Watch([r1, r2], connect=lambda h: nodes[h.name], clock=lambda: 0.0) as w:
        first = w.look()
        second = w.look()
        third = w.look()
    assert [len(n.commands) for n in nodes.values()] == [3, 3]  # b runs two runs' jobs: still one command
    assert '"run-1/b"' in nodes["b"].commands[0] and '"run-2/b"' in nodes["b"].commands[0]
    a1, b1 = first.runs[0].nodes
    assert a1.steps_per_sec is None and a1.cpu_percent is None and a1.node_cpu_percent is None  # one look: no rate
    a2, b2 = second.runs[0].nodes
    (b2_run2,) = second.runs[1].nodes
    assert a2.steps_per_sec == pytest.approx(10.0) and a2.cpu_percent == pytest.approx(100.0)  # (30-10)/2s; 2 s CPU
    assert b2.steps_per_sec is None and b2.cpu_percent == pytest.approx(50.0)  # step 0 twice: no progress seen yet
    assert b2_run2.steps_per_sec == pytest.approx(50.0) and b2_run2.node_cpu_percent == pytest.approx(75.0)
    assert b2.node_cpu_percent == b2_run2.node_cpu_percent  # the node's figure, once per look, for every job
    a3, b3 = third.runs[0].nodes
    assert a3.step == 3 and a3.steps_per_sec is None  # the step went back (a restart): the old readings are dropped
    assert b3.state == "unreachable" and "link down" in (b3.error or "")
    assert third.runs[1].nodes[0].state == "unreachable"
    json.dumps(third.to_json())  # --json prints it
    assert third.to_json()["leases"] is None


def test_progress_regex_is_checked_before_any_node_is_asked():
    assert top_view.check_progress_regex(r"iter (\d+)") == r"iter (\d+)"
    with pytest.raises(UsageError, match="not a regular expression"):
        top_view.check_progress_regex("step (")
    with pytest.raises(UsageError, match="2 groups"):
        top_view.check_progress_regex(r"(epoch|step) (\d+)")


def test_gpus_come_from_nvidia_smi_where_it_answers(tmp_path, monkeypatch):
    """nvidia-smi's CSV read as the node program reads it (a stand-in script: no GPU on this machine)."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf '0, 87, 10240, 81559\\n1, [N/A], 3, 81559\\n'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    gpus, why = node_top._gpus()
    assert why is None and gpus == [{"index": 0, "util": 87.0, "mem_used": 10240.0, "mem_total": 81559.0},
                                    {"index": 1, "util": None, "mem_used": 3.0, "mem_total": 81559.0}]
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the driver' >&2\n"
                   "exit 9\n")
    assert node_top._gpus() == (None, "nvidia-smi: NVIDIA-SMI has failed because it could not communicate "
                                      "with the driver")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert node_top._gpus() == (None, None)


def test_a_host_that_failed_is_connected_to_again_after_a_while():
    now = [0.0]
    connects: list[str] = []
    replies = [OSError("refused"), node_reply(10.0, [(1, 0.0)])]

    def connect(h):
        connects.append(h.name)
        r = replies.pop(0)
        if isinstance(r, Exception):
            from clusterddp.errors import HostError
            raise HostError(h.name, str(r))
        return FakeNode(h.name, [r])
    with top_view.Watch([make_record("run-1", hosts=("a",))], connect=connect, clock=lambda: now[0]) as w:
        assert w.look().runs[0].nodes[0].state == "unreachable"
        now[0] = top_view.RETRY_AFTER - 1
        assert w.look().runs[0].nodes[0].state == "unreachable" and connects == ["a"]  # not yet: no connect storm
        now[0] = top_view.RETRY_AFTER
        assert w.look().runs[0].nodes[0].state == "running" and connects == ["a", "a"]


def test_the_default_progress_regex_refuses_a_long_line_in_linear_time():
    """"step" then 60,000 spaces: 97 s on a node (every split of the spaces between two \\s*)."""
    import re
    import time
    rx = re.compile(top_view.DEFAULT_PROGRESS)
    line = "step" + " " * 60_000 + "x"
    t0 = time.process_time()
    assert rx.search(line) is None
    assert time.process_time() - t0 < 5.0  # the old pattern: minutes; this one: milliseconds
    for text, step in (("step 5", 5), ("Step: 12", 12), ("step=3", 3), ("STEP #7", 7), ("step : 9", 9),
                       ("step8", 8), ("epoch 2 step  41 loss 0.1", 41)):
        m = rx.search(text)
        assert m and int(m.group(1)) == step, text


def test_a_nodes_texts_are_kept_to_one_line_in_what_top_shows(capsys):
    """A node can put a newline in last_line; printed as is it would be a line of top's own."""
    from clusterddp.node import reply as node_reply
    data = {"last_line": "loss 0.1\nPASS: forged", "gpu_error": None}
    assert node_reply.one_line_each(data) == {"last_line": "loss 0.1\\nPASS: forged", "gpu_error": None}


def test_the_node_program_sends_the_logs_last_write_and_the_watchers_file_checked(tmp_path, capsys):
    """watch.json (the node's watcher, runs with a stall timeout: BRIEF's hang interface) is read bounded,
    and only as its numbers and state: a link, a huge file, a list or text in its place is no watch; the
    launcher checks the numbers again."""
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    (ctl / "node.log").write_text("step 1\n")
    os.utime(ctl / "node.log", (1000.0, 1000.0))
    job = [[str(ctl), "m/n1"]]
    got = run_node(capsys, job)["jobs"][0]
    assert got["log_mtime"] == 1000.0 and got["watch"] is None
    view = {"time": 1001.0, "last_progress": 990.5, "run_last_progress": 995, "timeout": 60, "state": "watching"}
    (ctl / "watch.json").write_text(json.dumps({**view, "other": 1}))
    assert run_node(capsys, job)["jobs"][0]["watch"] == {"last_progress": 990.5, "run_last_progress": 995,
                                                         "timeout": 60, "state": "watching"}
    (ctl / "watch.json").write_text(json.dumps({**view, "last_progress": None, "state": "odd"}))
    assert run_node(capsys, job)["jobs"][0]["watch"] == {"last_progress": None, "run_last_progress": 995,
                                                         "timeout": 60, "state": None}  # no progress here yet
    big = json.dumps(view) + " " * node_top.MAX_WATCH
    for bad in ("[1, 2]", "{not json", big, json.dumps({**view, "last_progress": "soon"}),
                json.dumps({**view, "timeout": True}), json.dumps({**view, "timeout": None})):
        (ctl / "watch.json").write_text(bad)
        assert run_node(capsys, job)["jobs"][0]["watch"] is None, bad
    (ctl / "watch.json").unlink()
    (tmp_path / "elsewhere.json").write_text(json.dumps(view))
    (ctl / "watch.json").symlink_to(tmp_path / "elsewhere.json")
    assert run_node(capsys, job)["jobs"][0]["watch"] is None  # never followed through a link
    (ctl / "watch.json").unlink()
    (ctl / "watch.json").write_text(json.dumps({**view, "last_progress": -5}))
    with pytest.raises(node_top.TopError, match="watch.last_progress"):  # out of range: checked launcher side
        run_node(capsys, job)


WATCH = {"last_progress": 1.0, "run_last_progress": 1.0, "timeout": 5, "state": "watching"}


@pytest.mark.parametrize(("watch", "words"), [
    ("yes", "jobs[0].watch"), ({**WATCH, "last_progress": -1}, "watch.last_progress"),
    ({**WATCH, "timeout": float("inf")}, "watch.timeout"), ({**WATCH, "timeout": None}, "watch.timeout"),
    ({**WATCH, "run_last_progress": "x"}, "watch.run_last_progress"), ({**WATCH, "state": "rm"}, "watch.state"),
])
def test_a_malformed_watch_in_a_reply_is_refused_naming_the_value(watch, words):
    with pytest.raises(node_top.TopError, match="malformed") as e:
        node_top.parse_reply(reply(watch=watch, log_mtime=1.0), 1)
    assert words in str(e.value)
    with pytest.raises(node_top.TopError, match="log_mtime"):
        node_top.parse_reply(reply(log_mtime=-3.0), 1)


def watched_reply(t: float, state: str = "running", log_mtime: float | None = None,
                  watch: dict | None = None) -> bytes:
    return (node_top.MARK + json.dumps({
        "time": t, "ncpu": 2, "gpus": None,
        "jobs": [{"state": state, "exit_code": None, "last_line": "x", "step": None, "cpu_seconds": 0.0,
                  "rss": 0, "procs": 1, "log_mtime": log_mtime, "watch": watch}]})).encode()


def test_seconds_since_progress_on_the_nodes_clock_and_stalled_past_the_runs_timeout():
    """a: its watcher's file (the run has a stall timeout), its own last line 61 s > 60 s ago on its own
    clock: stalled, though the run's last line (another node's) was 10 s ago; b: no watcher, its log's
    last write 30 s ago on a clock 10^6 s away from a's: 30 s, never stalled; c: ended: no figure;
    d: no progress line on it yet, the watcher says the run is stalled: marked."""
    r = make_record("run-1", hosts=("a", "b", "c", "d"))
    nodes = {"a": FakeNode("a", [watched_reply(5061.0, log_mtime=5060.0, watch={
                 "last_progress": 5000.0, "run_last_progress": 5051.0, "timeout": 60, "state": "watching"})]),
             "b": FakeNode("b", [watched_reply(1_005_030.0, log_mtime=1_005_000.0)]),
             "c": FakeNode("c", [watched_reply(10.0, "exited", log_mtime=1.0)]),
             "d": FakeNode("d", [watched_reply(100.0, log_mtime=99.0, watch={
                 "last_progress": None, "run_last_progress": 30.0, "timeout": 60, "state": "stalled"})])}
    with top_view.Watch([r], connect=lambda h: nodes[h.name], clock=lambda: 0.0) as w:
        a, b, c, d = w.look().runs[0].nodes
    assert (a.since_progress, a.progress_from, a.stall_timeout, a.stalled) == (61.0, "watch", 60, True)
    assert (a.run_since_progress, a.watch_state) == (10.0, "watching")
    assert (b.since_progress, b.progress_from, b.stall_timeout, b.stalled) == (30.0, "log", None, False)
    assert (c.since_progress, c.stalled) == (None, False)
    assert (d.since_progress, d.run_since_progress, d.stalled) == (None, 70.0, True)
    from clusterddp.cli.top import _since
    assert (_since(a), _since(b), _since(c), _since(d)) == ("61s stalled (>60s)", "30s", "-", "none stalled (>60s)")
    b.since_progress = 185.0
    assert _since(b) == "3m05s"
    b.since_progress = 7300.0
    assert _since(b) == "2h01m"


@pytest.mark.parametrize(("line", "step"), [
    ("Epoch 3 | rank 1", 3), ("[GPU0] Epoch 5 | Batchsize: 32 | Steps: 64", 5),  # pytorch/examples multinode.py
    ("[GPU1] Epoch 2 Iter 40 | train Loss 0.10422", 40),                          # its minGPT-ddp: the iteration
    ("epoch 3/10 loss 1.2", 3), ("Epoch: 4", 4), ("train_epoch=7", 7), ("[rank0]: Epoch 7 | x", 7),
    ("iter 12", 12), ("Iteration: 7", 7), ("Iter 9/100", 9), ("[ 3/100] loss 2.1", 3), ("[3/100]", 3),
    ("[step 12/500]", 12), ("global_step 12", 12), ("epoch=9 step=1000", 1000),
    ("Steps: 64", None), ("epochs 5", None), ("myepoch 5", None), ("lr 3e-4 [1/2", None), ("loss 5", None),
])
def test_the_default_progress_regex_reads_epochs_iterations_and_n_of_m(line, step):
    import re
    m = re.compile(top_view.DEFAULT_PROGRESS).search(line)
    assert (int(m.group(1)) if m else None) == step, line


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=" \t[]/:=#0123456789EepochstiraP_|", max_size=300))
def test_the_default_progress_regex_finds_digits_or_nothing_and_is_one_group(text):
    import re
    rx = re.compile(top_view.DEFAULT_PROGRESS)
    assert top_view.check_progress_regex(top_view.DEFAULT_PROGRESS) == top_view.DEFAULT_PROGRESS and rx.groups == 1
    m = rx.search(text)
    assert m is None or m.group(1).isdigit()


@pytest.mark.parametrize("line", ["epoch" + " " * 60_000 + "x", "epoch " * 20_000, "[" + " " * 60_000,
                                  "Epoch 1 " + "step " * 20_000, " " * 100_000 + "epoch", "iter" + " " * 60_000])
def test_the_epoch_and_n_of_m_forms_refuse_a_long_line_in_linear_time(line):
    import re
    import time
    t0 = time.process_time()
    re.compile(top_view.DEFAULT_PROGRESS).search(line)
    assert time.process_time() - t0 < 5.0


def test_top_says_which_option_to_set_when_a_running_node_prints_no_step_it_reads():
    import io

    from rich.console import Console

    from clusterddp.cli.top import STEP_HINT, table

    def shown(step, line="batch 7 loss 0.1"):
        snap = top_view.Snapshot(0.0, [top_view.RunView("r1", None, "running",
                                          [top_view.NodeView("a", 0, "running", last_line=line, step=step)])])
        out = io.StringIO()
        Console(file=out, width=400, highlight=False).print(table(snap))
        return out.getvalue()
    assert "--progress-regex REGEX" in shown(None) and "--progress-regex" in STEP_HINT
    assert "--progress-regex" not in shown(7) and "--progress-regex" not in shown(None, line=None)


def test_a_run_its_backend_refused_is_reached_again_after_a_while_not_at_every_look():
    """A Slurm job that pends is refused by its backend's reach, its row saying why; top asks again
    every RETRY_AFTER (not at every look), and shows its nodes once reached."""
    from clusterddp.nodeops import nodes_of
    now = [0.0]
    connects: list[str] = []
    asked: list[str] = []
    waiting, ready = make_record("run-1", hosts=("a",)), make_record("run-2", hosts=("b",))

    class Reached:
        def __init__(self, rec) -> None:
            self.key, self.nodes = "hosts", tuple(nodes_of(rec))

        def connect(self, h):
            connects.append(h.name)
            return FakeNode(h.name, [node_reply(10.0, [(1, 0.0)])] * 10)

        def close(self) -> None:
            pass

    def reach(rec):
        asked.append(rec.run_id)
        if rec.run_id == "run-1" and now[0] < top_view.RETRY_AFTER:
            raise UsageError("top: run run-1 is a slurm run, and its slurm job 7 has not started yet (pending)",
                             "`clusterddp status run-1` says when it starts")
        return Reached(rec)
    with top_view.Watch([waiting, ready], reach=reach, clock=lambda: now[0]) as w:
        one, two = w.look().runs
        assert one.nodes == [] and one.error == ("top: run run-1 is a slurm run, and its slurm job 7 has not started "
                                                 "yet (pending); hint: `clusterddp status run-1` says when it starts")
        assert [v.state for v in two.nodes] == ["running"] and two.error is None
        now[0] = top_view.RETRY_AFTER - 1
        w.look()
        assert asked == ["run-1", "run-2"]  # not yet
        now[0] = top_view.RETRY_AFTER
        one, two = w.look().runs
        assert asked == ["run-1", "run-2", "run-1"]
        assert [v.state for v in one.nodes] == ["running"] and one.error is None
        assert connects.count("b") == 2 and connects.count("a") == 1  # its group's fleet renewed once, for a
        assert w.refusals == {}


def where_tail(rank: int, state: str, n: int = 40, cut: bool = True) -> str:
    """The end of a node's where.jsonl: its first line cut mid-way, as the node program sends it."""
    lines = [json.dumps({"t": 1000.0 + 2 * i, "ranks": {str(rank): [state, "all_reduce" if state == "w" else
                                                                    "extra_work (job.py:9)"]},
                         "cpu": 50.0, "cpu_job": 40.0, "cpu_other": 10.0, "ncpu": 2}) for i in range(n)]
    text = "\n".join(lines) + "\n"
    return text[17:] if cut else text


def test_top_names_the_host_the_others_wait_for_from_the_nodes_rank_samples(tmp_path, capsys):
    # the node program sends the end of the rank sampler's file
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    (ctl / "where.jsonl").write_text("x" * (node_top.WHERE_TAIL + 10) + "\n" + where_tail(0, "w", cut=False))
    got = run_node(capsys, [[str(ctl), "m"]])["jobs"][0]["where"]
    assert len("\n".join(got)) == node_top.WHERE_TAIL and "\n".join(got).endswith(where_tail(0, "w", cut=False))
    with pytest.raises(node_top.TopError, match="jobs.0..where"):
        node_top.parse_reply(reply(where=7), 1)
    # the view names the host, with its ranks, since when and why
    r = make_record("run-1", hosts=("a", "b"))

    def answer(tail: str) -> bytes:
        doc = json.loads(watched_reply(100.0, log_mtime=99.0)[len(node_top.MARK):])
        doc["jobs"][0]["where"] = tail.split("\n")
        return (node_top.MARK + json.dumps(doc)).encode()
    nodes = {"a": FakeNode("a", [answer(where_tail(0, "w"))]), "b": FakeNode("b", [answer(where_tail(1, "c"))])}
    with top_view.Watch([r], connect=lambda h: nodes[h.name], clock=lambda: 0.0) as w:
        snap = w.look()
    (s,) = snap.runs[0].stragglers
    assert (s["host"], s["ranks"], s["until"]) == ("b", [1], None) and "extra_work (job.py:9)" in s["why"]
    json.dumps(snap.to_json())
    from rich.console import Console

    from clusterddp.cli.top import straggler_line, table
    assert straggler_line("run-1", s).startswith("run run-1: straggler b (ranks 1) since ")
    Console(width=300).print(table(snap))
    assert "run run-1: straggler b (ranks 1) since" in capsys.readouterr().out
    # every node alike: nobody named
    nodes = {"a": FakeNode("a", [answer(where_tail(0, "c"))]), "b": FakeNode("b", [answer(where_tail(1, "c"))])}
    with top_view.Watch([r], connect=lambda h: nodes[h.name], clock=lambda: 0.0) as w:
        assert w.look().runs[0].stragglers == []
