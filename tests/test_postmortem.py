"""The launcher side of a failure's diagnosis (clusterddp/postmortem.py): a script without @record
leaves no error file, but torch prefixes its uncaught exception with ``[rank<N>]: `` in the node's
log, and torchrun's table names the rank that exited with code 1."""

from __future__ import annotations

from clusterddp import postmortem
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


def test_an_exception_without_an_error_file_is_read_from_the_ranks_own_traceback():
    rep = postmortem.with_log_exception(REPORT, LOG)
    assert [e["local_rank"] for e in rep["errors"]] == [1]  # rank 2 was SIGTERMed: not an exit 1
    f = diagnose([NodeFacts("node-2", 1, 2, "failed", 1, None, LOG, rep)], "node-2")
    assert (f.kind, f.rank, f.local_rank, f.exc_type, f.message) == (
        "exception", 3, 1, "ValueError", "plain boom at step 5")
    assert f.frames[-1] == '/w/fail.py:8 in explode: raise ValueError("plain boom at step %d" % step)'


def test_torchruns_own_traceback_an_earlier_attempt_or_another_ranks_is_never_taken():
    assert postmortem.exception_in_log(LOG, 2) == ("RuntimeError: Connection closed by peer", (
        'Traceback (most recent call last):\n  File "/w/fail.py", line 13, in <module>\n'
        "RuntimeError: Connection closed by peer"))
    assert postmortem.exception_in_log(LOG, 5) is None  # only torchrun's ChildFailedError is unprefixed
    restarted = LOG + b"[clusterddp] node 1/2 on node-2 iface=eth0 job 7\n"
    assert postmortem.exception_in_log(restarted, 3) is None  # the last attempt printed none
    bare = LOG.replace(b"[rank3]: ", b"").replace(b"[rank2]: ", b"")
    assert postmortem.with_log_exception(REPORT, bare) == REPORT  # two unprefixed tracebacks: whose? unknown
    one = b"Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nKeyError: 'k'\n"
    assert postmortem.exception_in_log(one, 0) == ("KeyError: 'k'", one.decode().rstrip("\n"))
