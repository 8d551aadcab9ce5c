"""The rank sampler (node program ``where``) on one node, for real: python processes hooked through the
job's ``sitecustomize`` as launch.sh writes it, one waiting in a library's ``wait``, one spinning in a
function of its own; ``where`` run in-process on the real /proc. Its cost is measured; its file is read
back by the launcher-side reader (fuzzed in tests/fuzz/test_fuzz_where.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from clusterddp import stragglers as stragglers_module
from clusterddp.node import where as where_module
from test_node_stacks import hook_folder

JOB = """
import os, threading, time
print("ready", flush=True)
def spin_in_my_code():
    while True:
        sum(range(1000))
        time.sleep(0.001)
if os.environ["RANK"] == "0":
    threading.Event().wait()   # a library's wait (threading.py), as a rank inside all_reduce's
spin_in_my_code()
"""


@pytest.fixture
def ranks(tmp_path):
    ctl = hook_folder(tmp_path)
    (tmp_path / "job.py").write_text(JOB)
    started = []
    for rank in (0, 1):
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update({"CLUSTERDDP_JOB": "job-where/h", "RANK": str(rank), "LOCAL_RANK": str(rank),
                    "CLUSTERDDP_STACKS": str(ctl / "stacks"), "PYTHONPATH": str(ctl / "stacks" / "hook")})
        p = subprocess.Popen([sys.executable, str(tmp_path / "job.py")], env=env, stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
        assert p.stdout.readline() == "ready\n"
        started.append(p)
    yield ctl, started
    for p in started:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_each_rank_is_found_waiting_or_in_its_own_code_and_the_cost_is_small(ranks, monkeypatch):
    ctl, procs = ranks
    monkeypatch.setattr(where_module, "DUMP_MOST", 2000)  # the dump files are cut back to their header as they pass it
    n, interval = 8, 0.5
    cpu0, wall0 = time.process_time(), time.monotonic()
    where_module.run({"ctl": str(ctl), "marker": "job-where/h", "host": "h", "interval": interval}, None, samples=n)
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    header, samples = where_module.parse((ctl / "where.jsonl").read_bytes())
    assert header["host"] == "h" and header["interval"] == interval
    assert len(samples) == n - 1  # the first look only starts the CPU counters
    for s in samples:
        assert s["ranks"][0] == ("w", "wait"), s
        state, where = s["ranks"][1]
        assert state == "c" and where.startswith("spin_in_my_code (job.py:"), s
        assert 0 <= s["cpu"] <= 100 and 0 <= s["cpu_job"] <= s["cpu"] + 0.1 and s["ncpu"] >= 1
        assert s["cpu_wait"] is not None and 0 <= s["cpu_wait"] <= 1  # /proc/PID/schedstat's run delay
    for p in procs:  # the ranks ran on, their dump files kept small
        assert p.poll() is None
        assert (ctl / "stacks" / f"{p.pid}.txt").stat().st_size < 2000 + 8192
    # The cost: CPU seconds the sampler spent a sample, against the default interval; well under 1% of one
    # CPU (a job's rank keeps one busy at least). Its CPU time, not its wall time: a loaded machine waits longer.
    per_sample = cpu / n
    print(f"where: {per_sample * 1000:.1f} ms CPU a sample ({per_sample / where_module.INTERVAL:.3%} of a CPU at "
          f"{where_module.INTERVAL:g}s), {wall / n:.2f}s wall a sample")
    assert per_sample / where_module.INTERVAL < 0.01


def test_state_of_a_main_threads_frames():
    lib = "/usr/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py"
    user = "/runs/r/train.py"
    assert where_module.state_of([(lib, 10, "all_reduce"), (lib, 5, "wrapper"), (user, 41, "train")]) == (
        "w",
        "all_reduce",
    )
    grad = [("/x/site-packages/torch/autograd/graph.py", 8, "_engine_run_backward"),
            ("/x/site-packages/torch/_tensor.py", 9, "backward"), (user, 50, "step")]
    assert where_module.state_of(grad) == ("w", "_engine_run_backward")
    # running inside backward: computing its own gradients (a slow rank), not waiting for the others'
    assert where_module.state_of(grad, running=True) == ("c", "_engine_run_backward (computing)")
    assert where_module.state_of([(lib, 10, "all_reduce"), (user, 41, "train")], running=True) == ("w", "all_reduce")
    # in the user's own code, whatever it calls further out; a user function named like a collective is the user's
    assert where_module.state_of([(user, 12, "extra_work"), (lib, 1, "all_reduce")]) == (
        "c",
        "extra_work (train.py:12)",
    )
    assert where_module.state_of([(user, None, "all_reduce")]) == ("c", "all_reduce (train.py:?)")
    # a library computing, outside any collective (the forward pass); no frames at all
    assert where_module.state_of([("/x/site-packages/torch/nn/modules/linear.py", 3, "forward"), (user, 2, "f")]) == \
        ("c", "f (train.py:2)")
    assert where_module.state_of([("/x/site-packages/torch/nn/functional.py", 3, "relu")]) == ("c", "relu")
    assert where_module.state_of([]) == ("?", "")


def test_running_now_reads_the_state_in_proc():
    assert where_module.running_now(os.getpid())  # this test runs
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.5)
        deadline = time.monotonic() + 30
        while where_module.running_now(sleeper.pid) and time.monotonic() < deadline:  # asleep once started
            time.sleep(0.1)
        assert not where_module.running_now(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not where_module.running_now(2 ** 30)  # no such process


def test_the_file_is_thinned_below_its_bound_and_keeps_its_header(tmp_path):
    path = tmp_path / "where.jsonl"
    w = where_module.Writer(str(path), {"schema": 1, "kind": where_module.KIND, "host": "h"}, 4096)
    written = 0
    for i in range(400):
        if w.due():
            w.write((json.dumps({"t": float(i), "ranks": {"0": ["w", "all_reduce"]}}) + "\n").encode())
            written += 1
    data = path.read_bytes()
    assert len(data) <= 4096 and w.stride > 1 and written < 400
    header, samples = where_module.parse(data)
    assert header["host"] == "h"
    ts = [s["t"] for s in samples]
    assert ts == sorted(ts) and ts[0] < 100 and ts[-1] > 300  # the whole course, coarser
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_parse_keeps_good_lines_and_drops_the_rest():
    good = {"t": 5.0, "ranks": {"0": ["w", "all_reduce"], "1": ["c", "f (a.py:1)"]}, "cpu": 50.0, "cpu_job": 40.0,
            "cpu_other": 10.0, "ncpu": 4, "throttled": 0.5, "gpu_others": ["x (pid 1, GPU g)"], "other_top": "y\x1b",
            "cpu_wait": 0.25}
    data = b"\n".join(
        [
            json.dumps({"kind": where_module.KIND, "host": "h", "interval": 2}).encode(),
            json.dumps(good).encode(),
            b"garbage",
            b'{"t": -1, "ranks": {}}',
            b'{"t": 1e400, "ranks": {}}',
            b'{"t": 6, "ranks": {"x": ["w", ""], "2": ["z", ""], "3": ["w"]}, "cpu": 101}',
            b"[1]",
        ]
    )
    header, samples = where_module.parse(data)
    assert header == {"host": "h", "interval": 2.0, "started": None}
    assert samples[0] == {"t": 5.0, "ranks": {0: ("w", "all_reduce"), 1: ("c", "f (a.py:1)")}, "cpu": 50.0,
                          "cpu_job": 40.0, "cpu_other": 10.0, "ncpu": 4.0, "other_top": "y?", "throttled": 0.5,
                          "cpu_wait": 0.25, "gpu_others": ["x (pid 1, GPU g)"]}
    assert samples[1]["t"] == 6.0 and samples[1]["ranks"] == {} and samples[1]["cpu"] is None
    assert len(samples) == 2


def test_a_cpu_quota_is_read_from_the_ranks_cgroup_and_its_run_delay_grows(tmp_path):
    """A busy process held to 20% of a CPU by a cgroup quota (v1's cpu.cfs_quota_us, where this machine lets
    a test make one): its cgroup's throttled time and its run delay (schedstat) grow by most of the wall time."""
    from pathlib import Path
    group = Path("/sys/fs/cgroup/cpu") / f"cddp-where-{os.getpid()}"
    try:
        group.mkdir()
        (group / "cpu.cfs_quota_us").write_text("20000")
    except OSError:
        pytest.skip("no writable cgroup v1 cpu controller here")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        (group / "tasks").write_text(str(busy.pid))
        stat = where_module.cgroup_stat(busy.pid)
        assert stat is not None and stat[0] == str(group / "cpu.stat"), stat
        t0, thr0, delay0 = time.monotonic(), where_module.throttled_s(stat), where_module.run_delay([busy.pid])
        time.sleep(2.0)
        wall = time.monotonic() - t0
        assert (
            where_module.throttled_s(stat) - thr0
        ) / wall > stragglers_module.THROTTLED  # enough for the decider to say so
        assert (where_module.run_delay([busy.pid]) - delay0) / wall > stragglers_module.CPU_WAIT
        assert where_module.running_now(busy.pid)  # held back, not asleep
    finally:
        busy.kill()
        busy.wait()
        group.rmdir()
    assert where_module.run_delay([2 ** 30]) is None and where_module.throttled_s(None) is None


def test_sigterm_ends_the_sampler_at_once_even_in_its_sleep(tmp_path):
    """launch.sh kills the rank sampler once the job has ended; it leaves then, not after its interval
    (a sampler still there after a Ctrl-C reads as a job left running)."""
    where_py = os.path.join(os.path.dirname(where_module.__file__), "where.py")
    env = dict(os.environ, CLUSTERDDP_JOB="r1/node-1", CLUSTERDDP_HOST="node-1")
    p = subprocess.Popen([sys.executable, "-S", where_py, str(tmp_path), json.dumps({"interval": 60})], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "where.jsonl").exists():  # its header written: it is in its loop's sleep next
            assert p.poll() is None and time.monotonic() < deadline, p.stderr.read() if p.stderr else ""
            time.sleep(0.05)
        time.sleep(0.2)
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=20)  # the interval is 60 s: without the way out of the sleep this times out
        assert p.returncode == 0
    finally:
        p.kill()
        p.wait()


CHURN = """
import threading, time, sys
print("ready", flush=True)
if sys.argv[1] == "churn":  # threads made and ended all the time, as a rank starting its process group
    while True:
        ts = [threading.Thread(target=time.sleep, args=(0.01,)) for _ in range(4)]
        [t.start() for t in ts]
        [t.join() for t in ts]
threading.Event().wait()
"""


def test_only_a_rank_whose_threads_did_not_change_since_the_last_look_is_signalled(tmp_path):
    """faulthandler's all-thread dump can crash a rank whose threads come and go meanwhile (a SIGSEGV seen
    in CI as a rank set up DDP): `steady` lets `look` signal a rank only when its thread count is unchanged
    since the previous look (the same thread ids: a count can stay while threads come and go); the others
    are '?', never signalled."""
    procs = {k: subprocess.Popen([sys.executable, "-c", CHURN, k], stdout=subprocess.PIPE, text=True)
             for k in ("churn", "still")}
    try:
        for p in procs.values():
            assert p.stdout.readline().strip() == "ready"
        pids = {k: p.pid for k, p in procs.items()}
        ranks = [{"pid": pids["churn"], "rank": 0}, {"pid": pids["still"], "rank": 1}]
        safe, counts = where_module.steady(ranks, {})
        assert safe == set() and len(counts[pids["still"]]) == 1  # a first look: nobody yet
        signalled: list = []
        for _ in range(5):  # the churning one is caught with another count in almost every look
            time.sleep(0.05)
            safe, counts = where_module.steady(ranks, counts)
            signalled.append(safe)
        assert all(pids["still"] in s for s in signalled)
        assert not any(pids["churn"] in s for s in signalled), signalled
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        was = {gone.pid: frozenset({"1"})}
        assert where_module.steady([{"pid": gone.pid, "rank": 2}], was) == (set(), {gone.pid: None})
        # look leaves a rank out of `safe` unsignalled: '?', and nothing is sent to it (it has no hook here)
        sent: list = []
        real_kill = os.kill
        try:
            os.kill = lambda pid, sig: sent.append(pid)  # type: ignore[assignment]
            out = where_module.look(str(tmp_path), ranks, signal.SIGUSR2, 0.1, safe={pids["still"]})
        finally:
            os.kill = real_kill  # type: ignore[assignment]
        assert out["0"] == ["?", ""] and pids["churn"] not in sent
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
