"""A failure's diagnosis from the node's log (clusterddp/failure.py): a script without @record leaves
no error file, but torch prefixes its uncaught exception with ``[rank<N>]: `` in the node's log (before
the process group exists, nothing does), and torchrun's table names the rank that exited with code 1."""

from __future__ import annotations

from clusterddp import failure as failures
from clusterddp.failure import NodeFacts, diagnose

LOG = b"""[clusterddp] node 1/2 on node-2 iface=eth0 job 7
[rank3]: Traceback (most recent call last):
[rank3]:   File "/w/fail.py", line 12, in <module>
[rank3]:     explode(5)
[rank3]:   File "/w/fail.py", line 8, in explode
[rank3]:     raise ValueError("plain boom at step %d" % step)
[rank3]: ValueError: plain boom at step 5
[rank2]: Traceback (most recent call last):
[rank2]:   File "/w/fail.py", line 13, in <module>
[rank2]: RuntimeError: Connection closed by peer
Traceback (most recent call last):
  File "/venv/torch/distributed/run.py", line 1032, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
fail.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-01_20:30:52
  host      : node-2
  rank      : 2 (local_rank: 0)
  exitcode  : -15 (pid: 11)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 11
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_20:30:52
  host      : node-2
  rank      : 3 (local_rank: 1)
  exitcode  : 1 (pid: 12)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""
REPORT = {"joined": True, "reach": None, "errors": [], "kernel_lines": [], "kernel_error": None,
          "nvidia_smi": None, "log": None}


def _diagnose(log: bytes, rep: dict = REPORT):
    return diagnose([NodeFacts("node-2", 1, 2, "failed", 1, None, log, rep)], "node-2")


def test_an_exception_without_an_error_file_is_read_from_the_ranks_own_traceback():
    f = _diagnose(LOG)
    assert (f.kind, f.rank, f.local_rank, f.exc_type, f.message) == (
        "exception", 3, 1, "ValueError", "plain boom at step 5")
    assert f.frames[-1] == '/w/fail.py:8 in explode: raise ValueError("plain boom at step %d" % step)'
    # rank 2 was SIGTERMed by torchrun (an echo): its own RuntimeError is not read, its signal is
    assert [(r.rank, r.kind) for r in failures.rank_errors(NodeFacts("n", 1, 2, "failed", 1, None, LOG, REPORT))] == [
        (2, "signal"), (3, "exception")]


def test_torchruns_own_traceback_an_earlier_attempt_or_another_ranks_is_never_taken():
    lines = failures.attempt_lines(LOG)
    assert failures.rank_traceback(lines, 2) == ("RuntimeError: Connection closed by peer", (
        'Traceback (most recent call last):\n  File "/w/fail.py", line 13, in <module>\n'
        "RuntimeError: Connection closed by peer"))
    assert failures.rank_traceback(lines, 5) is None
    assert failures.bare_traceback(lines) is None  # only torchrun's ChildFailedError is unprefixed
    restarted = LOG + b"[clusterddp] node 1/2 on node-2 iface=eth0 job 7\n"
    assert failures.rank_traceback(failures.attempt_lines(restarted), 3) is None  # the last attempt printed none
    one = b"Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nKeyError: 'k'\n"
    assert failures.bare_traceback(failures.attempt_lines(one)) == ("KeyError: 'k'", one.decode().rstrip("\n"))


def test_without_a_prefix_the_last_traceback_before_the_exit_is_the_failing_ranks():
    # a plain script (no process group yet): a traceback it printed itself and caught, then the one it
    # died of; torchrun's own ChildFailedError after it is never taken
    caught = (b"Traceback (most recent call last):\n  File \"/w/fail.py\", line 3, in <module>\n"
              b"KeyError: 'optional'\nrank 3 carries on\n")
    died = (b"Traceback (most recent call last):\n  File \"/w/fail.py\", line 9, in <module>\n    f()\n"
            b"  File \"/w/fail.py\", line 7, in f\n    raise ValueError('boom on rank 3 at step 3')\n"
            b"ValueError: boom on rank 3 at step 3\n")
    attempt = LOG.index(b"[rank3]")
    bare = LOG[:attempt] + caught + died + LOG[LOG.index(b"Traceback (most recent call last):\n  File \"/venv"):]
    f = _diagnose(bare)
    assert (f.kind, f.rank, f.exc_type, f.message) == ("exception", 3, "ValueError", "boom on rank 3 at step 3")
    assert f.frames[-1] == "/w/fail.py:7 in f: raise ValueError('boom on rank 3 at step 3')"


def test_a_chained_exception_is_the_one_raised_last():
    chained = LOG.replace(b"[rank3]: ValueError: plain boom at step 5\n", (
        b"[rank3]: ValueError: plain boom at step 5\n\n"
        b"[rank3]: During handling of the above exception, another exception occurred:\n\n"
        b"[rank3]: Traceback (most recent call last):\n"
        b"[rank3]:   File \"/w/fail.py\", line 14, in <module>\n"
        b"[rank3]: RuntimeError: could not recover\n"))
    f = _diagnose(chained)
    assert (f.exc_type, f.message) == ("RuntimeError", "could not recover")


ARGPARSE = b"""[clusterddp] node 0/1 on vm
usage: distributed.py [-h] [--steps STEPS]
usage: distributed.py [-h] [--steps STEPS]
distributed.py: error: unrecognized arguments: --local_rank=0
distributed.py: error: unrecognized arguments: --local_rank=1
E1201 23:37:16.382000 9049 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 2) local_rank: 0
Traceback (most recent call last):
  File "/venv/torch/distributed/run.py", line 1032, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
distributed.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-01_23:37:16
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 2 (pid: 9296)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_23:37:16
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 2 (pid: 9295)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_argparses_usage_error_is_the_cause_and_the_tail_is_the_ranks_not_torchruns_table():
    f = diagnose([NodeFacts("local", 0, 2, "failed", 1, None, ARGPARSE, REPORT)], "local")
    assert (f.kind, f.rank) == ("exit", 0)
    assert f.summary == "exited with code 2: distributed.py: error: unrecognized arguments: --local_rank=0"
    assert f.log_tail == tuple(ARGPARSE.decode().splitlines()[1:5])  # no agent line, no table
    assert f.lines(others=False)[0] == (
        "root cause: local, rank 0 (local rank 0): exited with code 2: distributed.py: error: "
        "unrecognized arguments: --local_rank=0")


def test_the_tail_of_a_rank_killed_by_a_signal_leaves_out_other_ranks_tracebacks_and_torchruns_report():
    killed = LOG.replace(b"[rank3]: Traceback (most recent call last):\n", b"rank 3 at step 9\n").replace(
        b"exitcode  : 1 (pid: 12)", b"exitcode  : -9 (pid: 12)")
    f = _diagnose(killed)
    assert (f.kind, f.rank, f.signal) == ("signal", 3, "SIGKILL")
    assert f.log_tail[0] == "rank 3 at step 9" and not any(
        "[rank2]" in line or "=====" in line or "exitcode" in line for line in f.log_tail), f.log_tail
