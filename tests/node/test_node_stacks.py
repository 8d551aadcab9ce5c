"""`clusterddp stacks` on one node, for real: python processes hooked through the job's
``sitecustomize`` (the node program ``stackhook``, as launch.sh writes it), blocked in a C call inside a
function of their own; the node program ``stacks`` run in-process on the real /proc. The reply is
read back by the launcher-side reader (fuzzed in tests/fuzz/test_fuzz_stacks.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from clusterddp import nodescript
from clusterddp.node import stackhook
from clusterddp.node import stacks as node_stacks

JOB = """
import os, sys, threading
if os.environ.get("CDDP_FORK") and os.fork() == 0:  # a data loader's worker: its rank's environment
    threading.Lock().acquire(); threading.Event().wait()
def stuck_in_my_function():
    print("ready", flush=True)
    lock = threading.Lock(); lock.acquire(); lock.acquire()  # blocked in C, for ever
stuck_in_my_function()
"""


def hook_folder(tmp_path):
    """The control folder's stacks/hook/sitecustomize.py, written by launch.sh's own lines."""
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    script = "\n".join([f"CTL={ctl}", *nodescript.stack_hook_lines(), 'echo "$CLUSTERDDP_STACKS|$PYTHONPATH"'])
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": "/elsewhere"}).stdout.strip()
    assert out == f"{ctl}/stacks|{ctl}/stacks/hook:/elsewhere"
    assert (ctl / "stacks" / "hook" / "sitecustomize.py").read_text() == open(stackhook.__file__).read()
    return ctl


def start(ctl, marker, env_extra=None, hooked=True):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"CLUSTERDDP_JOB": marker, "RANK": "3", "LOCAL_RANK": "1", **(env_extra or {})})
    if hooked:
        env.update({"CLUSTERDDP_STACKS": str(ctl / "stacks"), "PYTHONPATH": str(ctl / "stacks" / "hook")})
    p = subprocess.Popen([sys.executable, "-c", JOB], env=env, stdout=subprocess.PIPE, text=True,
                         start_new_session=True)
    assert p.stdout.readline() == "ready\n"
    return p


def ask(capsys, ctl, marker, wait=10.0) -> dict:
    assert node_stacks.main([json.dumps({"ctl": str(ctl), "marker": marker, "wait": wait})]) == 0
    return node_stacks.parse_reply(capsys.readouterr().out.encode())


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        os.killpg(p.pid, signal.SIGKILL)  # with any child it forked
        p.wait()


def test_a_rank_blocked_in_a_c_call_gives_its_stack_and_keeps_running_after_several_asks(tmp_path, capsys, procs):
    ctl = hook_folder(tmp_path)
    marker = f"test-stacks-{os.getpid()}/n1"
    procs.append(start(ctl, marker))
    for _ in range(4):  # each ask signals it again; it stays blocked where it was, alive
        r = ask(capsys, ctl, marker)
        assert r["state"] == "running" and len(r["procs"]) == 1
        (p,) = r["procs"]
        assert (p["pid"], p["role"], p["rank"], p["local_rank"], p["how"]) == (procs[0].pid, "rank", 3, 1,
                                                                              "faulthandler")
        threads = node_stacks.parse_dump(p["dump"])
        assert len(threads) == 1
        tid, _, frames = threads[0]
        assert f"{tid:x}" == p["main"]
        assert [fn for _, _, fn in frames] == ["stuck_in_my_function", "<module>"]
        assert procs[0].poll() is None
    # the dump file holds every dump after the hook's header
    text = (ctl / "stacks" / f"{procs[0].pid}.txt").read_text()
    assert text.startswith(f"CLUSTERDDP_STACKS pid={procs[0].pid} main=0x") and text.count("stuck_in_my_function") == 4


def test_a_ranks_forked_child_is_not_a_rank_of_its_own(tmp_path, capsys, procs):
    ctl = hook_folder(tmp_path)
    marker = f"test-stacks-fork-{os.getpid()}/n1"
    procs.append(start(ctl, marker, {"CDDP_FORK": "1"}))
    r = ask(capsys, ctl, marker)
    assert [(p["pid"], p["how"]) for p in r["procs"]] == [(procs[0].pid, "faulthandler")]


def test_a_process_not_hooked_is_never_signalled(tmp_path, capsys, procs, monkeypatch):
    ctl = hook_folder(tmp_path)
    marker = f"test-stacks-unhooked-{os.getpid()}/n1"
    procs.append(start(ctl, marker, hooked=False))
    monkeypatch.setenv("PATH", str(tmp_path))  # no py-spy here, nor beside the python
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python3"))
    # even with a stale dump file of its pid: the signal's default action would kill it
    (ctl / "stacks" / f"{procs[0].pid}.txt").write_text(f"CLUSTERDDP_STACKS pid={procs[0].pid} main=0x1\n")
    (p,) = ask(capsys, ctl, marker)["procs"]
    assert p["how"] == "none" and "not hooked" in p["note"] and "py-spy is not installed" in p["note"]
    time.sleep(0.2)  # a signal, had one been sent, is delivered by now
    assert procs[0].poll() is None


# A rank whose threads start and end all the time (as while torch sets up a process group and DDP).
CHURN = """
import threading, time
print("ready", flush=True)
while True:
    t = threading.Thread(target=time.sleep, args=(0.001,)); t.start(); t.join()
"""


def test_a_process_whose_threads_keep_changing_is_not_signalled(tmp_path, capsys, procs, monkeypatch):
    ctl = hook_folder(tmp_path)
    marker = f"test-stacks-churn-{os.getpid()}/n1"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"CLUSTERDDP_JOB": marker, "RANK": "0", "LOCAL_RANK": "0", "CLUSTERDDP_STACKS": str(ctl / "stacks"),
                "PYTHONPATH": str(ctl / "stacks" / "hook")})
    p = subprocess.Popen([sys.executable, "-c", CHURN], env=env, stdout=subprocess.PIPE, text=True,
                         start_new_session=True)
    procs.append(p)
    assert p.stdout.readline() == "ready\n"
    monkeypatch.setenv("PATH", str(tmp_path))  # no py-spy here, nor beside the python
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python3"))
    dump = ctl / "stacks" / f"{p.pid}.txt"
    header = dump.read_text()
    (r,) = ask(capsys, ctl, marker, wait=1.5)["procs"]
    assert r["how"] == "none" and r["note"].startswith("not signalled: its threads kept starting or ending for 0.5s")
    assert r["note"].endswith("; py-spy is not installed on this node")
    assert dump.read_text() == header and p.poll() is None  # no dump was asked for; it runs on


def test_calm_names_the_processes_whose_threads_stay_the_same(procs):
    still = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    churn = subprocess.Popen([sys.executable, "-c", CHURN], stdout=subprocess.PIPE, text=True, start_new_session=True)
    procs += [still, churn]
    assert still.stdout.readline() == churn.stdout.readline() == "ready\n"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert node_stacks.calm([still.pid, churn.pid, int(gone.stdout)], most=0.5) == {still.pid}


def test_the_hook_runs_the_sitecustomize_it_shadows(tmp_path):
    ctl = hook_folder(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['SHADOWED_RAN'] = 'yes'\n")
    env = {**os.environ, "CLUSTERDDP_STACKS": str(ctl / "stacks"),
           "PYTHONPATH": f"{ctl / 'stacks' / 'hook'}:{other}"}
    out = subprocess.run([sys.executable, "-c", "import os, sitecustomize; print(os.environ.get('SHADOWED_RAN'), "
                          "sitecustomize.__file__)"], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["yes", str(other / "sitecustomize.py")] and out.stderr == ""
    # a folder it cannot write to: the python starts anyway, unhooked
    env["CLUSTERDDP_STACKS"] = str(tmp_path / "missing")
    assert subprocess.run([sys.executable, "-c", "print(1)"], env=env, capture_output=True, text=True).stdout == "1\n"


def test_a_node_whose_job_has_ended_or_is_missing_says_so(tmp_path, capsys):
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    (ctl / "exit_code").write_text("3\n")
    r = ask(capsys, ctl, "no-such-job/n1")
    assert (r["state"], r["exit_code"], r["procs"]) == ("ended", 3, [])
    assert ask(capsys, tmp_path / "gone", "no-such-job/n1")["state"] == "missing"


DUMP = """Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 324 in wait
  File "/x/lib/python3.11/site-packages/torch/utils/data/_utils/pin_memory.py", line 55 in _pin_memory_loop

Current thread 0x00007f0000000001 (most recent call first):
  File "/x/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "/work/job/train.py", line 41 in backward
  File "/work/job/train.py", line ??? in <module>
garbage line
"""


def test_parse_dump_reads_faulthandlers_threads_innermost_first():
    threads = node_stacks.parse_dump(DUMP)
    assert [(tid, cur) for tid, cur, _ in threads] == [(2 + 0x7f0000000000, False), (1 + 0x7f0000000000, True)]
    assert threads[1][2] == [("/x/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", 81, "wrapper"),
                             ("/work/job/train.py", 41, "backward"), ("/work/job/train.py", None, "<module>")]
    # the thread-name form of newer Pythons
    assert node_stacks.parse_dump("Thread 0x00000000000000ff [MainThread] (most recent call first):\n"
                                  '  File "a.py", line 1 in f\n') == [(255, False, [("a.py", 1, "f")])]


# What py-spy 0.4.3 `dump --json` printed for such a process (one thread, frames innermost first).
PY_SPY = [{"pid": 0, "thread_id": 140057186683776, "thread_name": "MainThread", "os_thread_id": 0, "active": False,
           "owns_gil": False, "process_info": None, "frames": [
               {"name": "Condition.wait", "filename": "/usr/lib/python3.11/threading.py", "module": None,
                "short_filename": "threading.py", "line": 327, "locals": None, "is_entry": False},
               {"name": "stuck_in_my_function", "filename": "/w/job.py", "module": None, "short_filename": "job.py",
                "line": 5, "locals": None, "is_entry": True}]}]


def test_a_process_not_hooked_is_read_by_py_spy_where_the_node_has_it(tmp_path, capsys, procs, monkeypatch):
    ctl = hook_folder(tmp_path)
    marker = f"test-stacks-py-spy-{os.getpid()}/n1"
    procs.append(start(ctl, marker, hooked=False))
    fake = tmp_path / "bin"
    fake.mkdir()
    answer = json.dumps([dict(PY_SPY[0], pid=procs[0].pid, os_thread_id=procs[0].pid)])
    (fake / "py-spy").write_text(f"#!/bin/sh\n[ \"$1 $2 $3 $4\" = 'dump --json --pid {procs[0].pid}' ] || exit 3\n"
                                 f"echo '{answer}'\n")
    (fake / "py-spy").chmod(0o755)
    monkeypatch.setenv("PATH", str(fake))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python3"))
    (p,) = ask(capsys, ctl, marker)["procs"]
    assert (p["how"], p["main"], p["note"]) == ("py-spy", f"{PY_SPY[0]['thread_id']:x}", "")
    ((tid, _, frames),) = node_stacks.parse_dump(p["dump"])
    assert frames == [("/usr/lib/python3.11/threading.py", 327, "Condition.wait"),
                      ("/w/job.py", 5, "stuck_in_my_function")]
    # py-spy refused (no ptrace rights): its last line of error, no stack
    (fake / "py-spy").write_text("#!/bin/sh\necho 'Error: Permission Denied' >&2\nexit 1\n")
    (p,) = ask(capsys, ctl, marker)["procs"]
    assert p["how"] == "none" and p["note"].endswith("py-spy failed (ptrace rights?): Error: Permission Denied")
    assert procs[0].poll() is None
