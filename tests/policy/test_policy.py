"""Why a run failed decides what happens next: the classes (GPU errors from NVIDIA Xid lines and
nvidia-smi, collective timeouts in torch's own words), the decision after a failed attempt
(clusterddp.policy) and what it sets aside (clusterddp.quarantine), the inventory's `quarantine:` and
`retry_job_failures:`, and the node's side (its kernel lines stamped, its job's times). On real sshd
hosts with a real kernel log line: tests/quarantine/test_quarantine_ssh.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clusterddp import failure as failure_parsing
from clusterddp import policy
from clusterddp import quarantine as quarantines
from clusterddp.inventory import load
from clusterddp.node import diagnose as diagnose_module
from clusterddp.record import NodeState
from helpers import cddp, make_record

NOW = 1_800_000_000.0
XID_79 = "[  890.431249] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
XID_48 = ("[  891.000001] NVRM: Xid (PCI:0000:5e:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable "
          "double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.")


def table(failures: dict) -> str:
    """torchrun's own failure table for ``{rank: (local_rank, exitcode, pid)}``."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
    return str(ChildFailedError("fail.py", {rank: ProcessFailure(local_rank=lr, pid=pid, exitcode=code,
                                                                error_file="/nonexistent")
                                            for rank, (lr, code, pid) in failures.items()}))


def report(kernel=(), boot=None, started=None, ended=None, smi=None):
    return {"joined": True, "reach": None, "errors": [], "kernel_lines": list(kernel), "kernel_error": None,
            "kernel_boot": boot, "job_started": started, "job_ended": ended, "nvidia_smi": smi, "log": None}


def facts(host, rank, log=b"", state="failed", code=1, **rep):
    return failure_parsing.NodeFacts(host, rank, 1, state, code, None, log, report(**rep))


# ---- the kernel line parser ----

def test_xid_lines_of_old_and_new_drivers_parse_and_only_the_machines_kinds_count():
    x = failure_parsing.parse_xid(XID_79)
    assert (x.code, x.pci, x.pid, x.stamp, x.machine) == (79, "0000:3b:00", 1234, 890.431249, True)
    assert x.text() == "NVIDIA Xid 79 (GPU has fallen off the bus) on GPU PCI:0000:3b:00"
    x = failure_parsing.parse_xid(XID_48)
    assert (x.code, x.pid, x.machine) == (48, None, True) and "double-bit ECC" in x.text()
    old = failure_parsing.parse_xid(
        "NVRM: Xid (0000:03:00): 48, An uncorrectable double bit error (DBE) has been detected"
    )
    assert (old.code, old.pci, old.stamp) == (48, "0000:03:00", None)
    # an illegal address in the job's own kernel (13, 31, 43) is the job's, not the machine's
    assert not failure_parsing.parse_xid(
        "[ 5.0] NVRM: Xid (PCI:0000:3b:00): 31, pid=99, Ch 00000008, MMU Fault"
    ).machine
    for line in ("eth0: link up", "NVRM: Xid (PCI:zz): 79, x", "NVRM: Xid (PCI:0000:3b:00): ٧٩, pid=1", ""):
        assert failure_parsing.parse_xid(line) is None


@given(st.text(max_size=3000))
def test_any_text_is_no_xid_or_a_bounded_one(text):
    x = failure_parsing.parse_xid(text)
    if x is not None:
        assert len(x.line) <= failure_parsing.MAX_LOG_LINE and "\x00" not in x.line
        assert 0 <= x.code < 10 ** 6 and (x.pid is None or 0 <= x.pid < 10 ** 10)
        assert x.stamp is None or 0 <= x.stamp < 10 ** 10


@given(st.integers(0, 999_999), st.from_regex(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}", fullmatch=True),
       st.one_of(st.none(), st.integers(1, 4_000_000)), st.floats(0, 1e9, allow_nan=False),
       st.text(max_size=200).filter(lambda t: "pid=" not in t and "\n" not in t), st.text(max_size=50))
def test_a_written_xid_line_reads_back(code, pci, pid, stamp, rest, before):
    who = f"pid={pid}" if pid is not None else "pid='<unknown>'"
    x = failure_parsing.parse_xid(f"[{stamp:12.6f}] NVRM: Xid (PCI:{pci}): {code}, {who}, name=python, {rest}")
    assert x is not None and (x.code, x.pci, x.pid) == (code, pci, pid)
    assert x.stamp == pytest.approx(stamp, abs=1e-6)
    assert x.machine == (code in failure_parsing.MACHINE_XIDS)


REPORT_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.floats(), st.text(max_size=20))


def _xid(code: int, pid: int, stamp: float) -> str:
    return f"[{stamp}] NVRM: Xid (PCI:0000:3b:00): {code}, pid={pid}, x"


@given(st.lists(st.one_of(st.text(max_size=300), st.sampled_from([XID_79, XID_48]),
                          st.builds(_xid, st.integers(0, 200), st.integers(0, 99), st.floats(0, 1e12))), max_size=8),
       REPORT_VALUES, REPORT_VALUES, REPORT_VALUES, st.one_of(st.none(), st.text(max_size=300)),
       st.sets(st.integers(0, 99), max_size=5))
def test_any_report_gives_no_gpu_error_or_one_bounded_line(lines, boot, started, ended, smi, pids):
    rep = {**report(lines, smi=smi), "kernel_boot": boot, "job_started": started, "job_ended": ended}
    got = failure_parsing.gpu_error(rep, pids)
    if got is not None:
        what, line = got
        assert "\n" not in what and len(line) <= failure_parsing.MAX_LOG_LINE and "\n" not in line


# ---- GPU errors during the job, and whose ----

def test_a_gpu_error_counts_during_the_job_and_for_its_ranks_only():
    boot = NOW - 1000  # the 79 line is stamped 890 s after boot: NOW - 110
    during = dict(boot=boot, started=NOW - 200, ended=NOW - 100)
    assert failure_parsing.gpu_error(report([XID_79], **during), pids={1234})[0].startswith("NVIDIA Xid 79")
    assert failure_parsing.gpu_error(report([XID_79], **during), pids={77}) is None  # another process's GPU
    assert (
        failure_parsing.gpu_error(report([XID_79], boot=boot, started=NOW - 50), pids={1234}) is None
    )  # before this job
    assert (
        failure_parsing.gpu_error(report([XID_79], boot=boot, started=NOW - 300, ended=NOW - 200), {1234}) is None
    )  # after
    assert failure_parsing.gpu_error(report([XID_48], **during)) is not None  # naming no process: the machine's
    assert (
        failure_parsing.gpu_error(report([XID_79.replace(": 79,", ": 13,")], **during), {1234}) is None
    )  # the job's own
    assert failure_parsing.gpu_error(report([XID_79]), {1234}) is not None  # no times said: the line counts
    smi = "nvidia-smi failed: Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error"
    assert failure_parsing.gpu_error(report(smi=smi)) == ("nvidia-smi cannot read a GPU", smi)
    assert failure_parsing.gpu_error(report(smi="nvidia-smi failed: No devices were found")) is None
    assert failure_parsing.gpu_error(None) is None


def test_the_gpu_node_is_the_root_cause_even_when_another_rank_failed_first():
    t = time.time()
    boot = t - 1000
    b_log = ("[rank1]: RuntimeError: CUDA error: unspecified launch failure\n" + table({1: (0, 1, 1234)})).encode()
    a = facts("a", 0, log=("[rank0]: RuntimeError: Connection closed by peer\n" + table({0: (0, 1, 900)})).encode())
    b = facts("b", 1, log=b_log, kernel=[XID_79], boot=boot, started=boot + 800, ended=boot + 900)
    f = failure_parsing.diagnose([a, b], first_failed="a")
    assert (f.host, f.kind) == ("b", "gpu"), f
    head, line, then = f.summary.splitlines()
    assert head == "GPU error: NVIDIA Xid 79 (GPU has fallen off the bus) on GPU PCI:0000:3b:00"
    assert line == XID_79 and then.startswith("then ")
    assert [h for h, _ in f.others] == ["a"]
    # the same line naming a process of another job: no GPU error of this run
    other = facts("b", 1, log=b_log, kernel=[XID_79.replace("pid=1234", "pid=4321")], boot=boot)
    assert failure_parsing.diagnose([a, other], first_failed="a").kind != "gpu"


# ---- collective timeouts, in torch's own words ----

GLOO_TIMEOUT_JOB = textwrap.dedent('''
    import datetime, time, torch, torch.distributed as dist
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=2))
    if dist.get_rank() == 0:
        try:
            dist.all_reduce(torch.ones(1))
        except RuntimeError as e:
            print("WORDS", str(e).replace("\\n", " "), flush=True)
    else:
        time.sleep(5)
    dist.destroy_process_group()
''')


def gloo_timeout_message(tmp_path) -> str:
    """What torch's gloo raises when a collective times out: a real 2-process job whose rank 1 never comes."""
    (tmp_path / "job.py").write_text(GLOO_TIMEOUT_JOB)
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        "job.py"], capture_output=True, text=True, timeout=150, cwd=tmp_path,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    words = [line[6:] for line in p.stdout.splitlines() if line.startswith("WORDS ")]
    assert words, p.stdout + p.stderr
    return words[0]


def test_a_gloo_collective_timeout_and_an_nccl_watchdog_abort_are_timeouts(tmp_path):
    words = gloo_timeout_message(tmp_path)
    assert "Timed out waiting 2000ms for recv operation to complete" in words, words
    t = time.time()
    efile = {"attempt": 0, "local_rank": 0, "truncated": False, "data": json.dumps(
        {"message": {"message": f"RuntimeError: {words}", "extraInfo": {"timestamp": str(int(t))}}})}
    node = failure_parsing.NodeFacts("a", 0, 1, "failed", 1, None, b"", {**report(), "errors": [efile]})
    f = failure_parsing.diagnose([node], first_failed="a")
    assert f.kind == "timeout" and f.summary.startswith("a collective timed out: RuntimeError: ") and \
        f.exc_type == "RuntimeError", f
    # NCCL's watchdog logs, then (TORCH_NCCL_ASYNC_ERROR_HANDLING's default) aborts the rank: SIGABRT
    # (then the C++ stack of the abort, and torchrun's own traceback and table)
    log = ("[rank1]:[E1202 08:01:02.123456789 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective "
           "operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
           "ran for 600081 milliseconds before timing out.\n"
           + "".join(f"frame #{i}: <unknown function> + 0x{i:x} (0x7f in libtorch_cuda.so)\n" for i in range(40))
           + "Traceback (most recent call last):\n  File \"/v/bin/torchrun\", line 8, in <module>\n"
           "    sys.exit(main())\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
           + table({1: (0, -6, 4321)})).encode()
    f = failure_parsing.diagnose([facts("b", 1, log=log)], first_failed="b")
    assert f.kind == "timeout" and f.signal == "SIGABRT", f
    assert f.summary.splitlines()[0] == "a collective timed out: killed by SIGABRT"
    assert "Watchdog caught collective operation timeout" in f.summary.splitlines()[1]
    # a plain exception stays one
    plain = {**efile, "data": json.dumps({"message": {"message": "ValueError: boom"}})}
    assert (
        failure_parsing.diagnose(
            [failure_parsing.NodeFacts("a", 0, 1, "failed", 1, None, b"", {**report(), "errors": [plain]})], "a"
        ).kind
        == "exception"
    )


# ---- the decision ----

def failed(kind, host="b", summary="x", **nodes):
    rec = make_record("r1", hosts=("a", "b", "c"))
    states = {"a": NodeState.STOPPED, "b": NodeState.FAILED, "c": NodeState.STOPPED, **nodes}
    return replace(rec, nodes=tuple(replace(n, state=states[n.host]) for n in rec.nodes),
                   failure=failure_parsing.Failure(host, kind, summary, rank=1))


@pytest.mark.parametrize("kind", policy.JOB)
def test_the_jobs_own_failures_end_the_run_unless_the_inventory_asks_to_retry(kind):
    d = policy.after_failure(failed(kind, summary="ValueError: boom\nmore"))
    assert (d.carry_on, d.hosts) == (False, ())
    assert d.why.startswith("b, rank 1: ValueError: boom: ") and "\n" not in d.why
    assert d.why.endswith(", so not moved to another machine (retry_job_failures: true in the inventory retries it "
                          "elsewhere)")
    d = policy.after_failure(failed(kind, summary="ValueError: boom"), retry_job_failures=True)
    assert (d.carry_on, d.hosts) == (True, ("b",)) and "retry_job_failures" in d.why
    assert policy.machine_faults(failed(kind)) == {}


def test_the_machines_failures_carry_on_without_it_a_gpu_error_at_once():
    d = policy.after_failure(failed("lost", summary="lost: stopped answering", b=NodeState.LOST))
    assert (d.carry_on, d.hosts) == (True, ("b",))
    assert d.why == "b lost: the machine's failure, not the job's"
    gpu = failed("gpu", summary="GPU error: NVIDIA Xid 79 (GPU has fallen off the bus) on GPU PCI:0000:3b:00\nline")
    d = policy.after_failure(gpu)
    assert (d.carry_on, d.hosts) == (True, ("b",)) and "\n" not in d.why
    assert d.why.startswith("b: GPU error: NVIDIA Xid 79 (GPU has fallen off the bus)")
    assert policy.machine_faults(gpu)["b"].at_once
    # a node lost and another's GPU failing: both go
    both = replace(gpu, nodes=tuple(replace(n, state=NodeState.LOST) if n.host == "c" else n for n in gpu.nodes))
    assert policy.after_failure(both).hosts == ("c", "b")
    # one line, short, whatever the failure's text holds
    long = failed("exception", summary="E: " + "x\x00" * 5000)
    assert len(policy.after_failure(long).why) <= policy.MAX_WHY and "\x00" not in policy.after_failure(long).why


def test_a_gpu_error_quarantines_at_once_for_the_inventorys_time_and_a_loss_then_a_gpu_error_too(tmp_path):
    q = quarantines.Quarantine(tmp_path / "q.json")
    gpu = failed("gpu", summary="GPU error: NVIDIA Xid 48 (double-bit ECC error) on GPU PCI:0000:5e:00\nl")
    [e] = quarantines.after_run(gpu, 600, q=q, now=NOW)
    assert (e.host, e.machine, e.until - e.since, e.run_id) == ("b", "10.0.0.2:22", 600, "r1")
    assert e.why == "GPU error: NVIDIA Xid 48 (double-bit ECC error) on GPU PCI:0000:5e:00 in run r1"
    # lost in one run (a strike), its GPU failing in the next: set aside, both named
    q2 = quarantines.Quarantine(tmp_path / "q2.json")
    assert quarantines.after_run(replace(failed("lost", b=NodeState.LOST), run_id="r0"), q=q2, now=NOW) == []
    [e] = quarantines.after_run(gpu, q=q2, now=NOW + 60)
    assert e.until - e.since == quarantines.DEFAULT_S and e.why.endswith("in run r1 (lost in run r0 before)")
    assert q2.strikes() == []
    # the job's own failure sets nothing aside and wipes nobody's strike but the machines that ran to the end
    assert quarantines.after_run(failed("exception"), q=quarantines.Quarantine(tmp_path / "q3.json"), now=NOW) == []


def test_the_same_host_failing_again_after_a_loss_is_the_machines_second_failure(tmp_path):
    q = quarantines.Quarantine(tmp_path / "q.json")
    signal = failed("signal", summary="killed by SIGBUS")
    assert policy.after_failure(signal).carry_on is False and q.struck(signal) == set()
    assert quarantines.after_run(replace(failed("lost", b=NodeState.LOST), run_id="r0"), q=q, now=NOW) == []
    assert q.struck(signal, NOW + 60) == {"b"}
    d = policy.after_failure(signal, struck=q.struck(signal, NOW + 60))
    assert (d.carry_on, d.hosts) == (True, ("b",))
    assert d.why == ("b: failed again after a loss in its previous run (killed by SIGBUS): the machine's failure, "
                     "not the job's")
    # the job's own exception stays the job's, strike or not
    assert policy.after_failure(failed("exception"), struck={"b"}).carry_on is False
    [e] = quarantines.after_run(signal, q=q, now=NOW + 60)
    assert e.host == "b" and e.why == "lost in run r0, then failed in run r1: killed by SIGBUS"
    assert q.strikes() == [] and q.struck(signal, NOW + 61) == set()


# ---- the inventory ----

@pytest.mark.parametrize("given_, seconds", [(None, 7200), ("2h", 7200), ("90m", 5400), ("1h30m", 5400),
                                             (3600, 3600), ("1d", 86400)])
def test_quarantine_in_the_inventory(tmp_path, given_, seconds):
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  - {name: a}\n" + (f"quarantine: {given_}\n" if given_ is not None else ""))
    got = load(str(inv))
    assert got.quarantine_s == seconds and got.retry_job_failures is False
    assert got.select(["a"]).quarantine_s == seconds


def test_quarantine_stragglers_in_the_inventory_is_off_by_default_and_kept_by_select(tmp_path):
    from clusterddp.errors import InventoryError
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  - {name: a}\n  - {name: b}\n")
    assert load(str(inv)).quarantine_stragglers is False
    inv.write_text("hosts:\n  - {name: a}\n  - {name: b}\nquarantine_stragglers: true\n")
    assert load(str(inv)).quarantine_stragglers is True and load(str(inv)).select(["a"]).quarantine_stragglers
    inv.write_text("hosts:\n  - {name: a}\nquarantine_stragglers: often\n")
    with pytest.raises(InventoryError, match="quarantine_stragglers"):
        load(str(inv))


def test_a_bad_quarantine_is_a_located_error_exit_2(tmp_path):
    from clusterddp.errors import InventoryError
    inv = tmp_path / "inv.yaml"
    for value, words in (("10s", "must be from 1m to 30d"), ("40d", "must be from 1m to 30d"),
                         ("true", "must be an age such as 2h"), ("[2h]", "must be an age such as 2h")):
        inv.write_text(f"hosts:\n  - {{name: a}}\nquarantine: {value}\nretry_job_failures: true\n")
        with pytest.raises(InventoryError) as e:
            load(str(inv))
        assert str(e.value).startswith(f"{inv}:3: quarantine: {words}"), str(e.value)
    (tmp_path / "t.py").write_text("print(1)\n")
    inv.write_text("hosts:\n  - {name: a}\nquarantine: soon\n")
    r = cddp("up", str(inv), str(tmp_path / "t.py"), "--dry-run", check_rc=2)
    assert f"{inv}:3: quarantine: 'soon' is not an age: give one such as 2h, 90m or 1d" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    inv.write_text("hosts:\n  - {name: a}\nretry_job_failures: 1\n")
    with pytest.raises(InventoryError, match="retry_job_failures"):
        load(str(inv))


# ---- the node's side ----

def test_the_node_sends_stamped_kernel_lines_its_boot_and_its_jobs_times(tmp_path, monkeypatch):
    ctl = tmp_path / "ctl"
    (ctl / "errors").mkdir(parents=True)
    (ctl / "pid").write_text("1\n")
    os.utime(ctl / "pid", (NOW, NOW))
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "dmesg").write_text(f"#!/bin/sh\necho '{XID_79}'\necho '[  891.0] eth0: link up'\n")
    (fake / "dmesg").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    out = tmp_path / "answer"
    with open(out, "w") as f:
        diagnose_module.main([str(ctl), json.dumps({"mode": "report"})], f)
    a = diagnose_module.read_answer(out.read_bytes())
    assert a["kernel_lines"] == [XID_79]
    assert abs(a["kernel_boot"] - (time.time() - time.monotonic())) < 5
    assert (a["job_started"], a["job_ended"]) == (NOW, None)
    # what a node sends is checked again: times that are no times are dropped
    bad = json.dumps({"joined": True, "kernel": {"lines": [], "boot": float("nan")},
                      "job": {"started": True, "ended": 1e300}}).encode()
    assert {k: diagnose_module.read_answer(bad)[k] for k in ("kernel_boot", "job_started", "job_ended")} == \
        {"kernel_boot": None, "job_started": None, "job_ended": None}


# ---- one sentence, one meaning (issue 39 §5) ----

def test_a_run_that_cannot_carry_on_never_says_it_carries_on():
    """The line a run ends with after a machine's failure and no spare: built by the code that builds
    it (the decision, then :func:`clusterddp.backends.ssh.attempts.next_hosts`' reason)."""
    from clusterddp.backends.ssh import attempts
    from clusterddp.inventory import parse
    d = policy.after_failure(failed("lost", host="b", summary="lost", b=NodeState.LOST))
    inv = parse("defaults: {user: me}\nhosts: [{name: a, address: 10.0.0.1}, {name: b, address: 10.0.0.2}, "
                "{name: c, address: 10.0.0.3}]\n", "lab.yaml")
    nxt = attempts.next_hosts(inv.hosts, d.hosts, [], None)
    assert isinstance(nxt, str)
    line = policy.ends(d.why, nxt)
    assert line == ("b lost: the machine's failure, not the job's; no healthy spare for b, and without "
                    "--nodes MIN:MAX the run does not go on with fewer nodes")
    assert "carrying on" not in line and "the run ends" not in line
    # the job's own failure: said once that it ends, and why, without "the run ends" twice
    job = policy.after_failure(failed("exception", summary="ValueError: boom"))
    assert policy.ends(job.why).count("not moved") == 1 and "the run ends" not in job.why
    # a retried job failure that then cannot start does not say "retried"
    retry = policy.after_failure(failed("exception", summary="ValueError: boom"), retry_job_failures=True)
    assert "retried" not in policy.ends(retry.why, "no healthy spare for b")


@pytest.mark.parametrize("parts", [("a lost: x", ""), ("a lost: x; ", "  "), ("a lost: x", "restarts: 1 allows; "),
                                   ("", "the next attempt could not start: ")])
def test_the_end_line_never_dangles_a_separator(parts):
    line = policy.ends(*parts)
    assert not line.rstrip().endswith((";", ":", ",")) and "; ;" not in line and line == line.strip()
