"""CI that a teardown flake cannot turn red (issue 22, section 6), without hiding a real abort.

torch 2.13's gloo threads outlive ``destroy_process_group`` while something holds the group, and one
still dropping a finished collective when the interpreter exits is killed mid-destructor: SIGABRT,
"terminate called without an active exception", after the script's last line. Two defences:

- every test job that makes a process group ends it (barrier, then ``destroy_process_group`` or
  ``ct.cleanup(barrier=True)``), which joins gloo's threads before the interpreter exits; a job
  ending on a bare ``barrier()`` left them running into the exit (checked below, by reading the
  test modules' job scripts);
- ``helpers.cddp`` runs an `up` that should succeed once more when it failed only that way, and
  warns that it did (pytest lists the warning); the same abort twice, or any other failure, fails.

`up` itself reports such a run as failed (the README says why and what to do)."""

from __future__ import annotations

import ast
import json
import warnings
from pathlib import Path

import pytest

import helpers
from helpers import REPO, cddp, gloo_exit_abort, record, run_id_of

# A rank's last line, then what the gloo abort does at interpreter exit (std::terminate's message
# and SIGABRT), on rank 1: every time, or (ONCE set) only on the first run of the test.
EXIT_ABORT = r'''
import atexit, os
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
dist.barrier()
dist.destroy_process_group()
os.write(1, f"rank {rank} done\n".encode())
once = os.environ.get("ONCE")
if rank == 1 and not (once and os.path.exists(once)):
    if once:
        open(once, "w").close()
    atexit.register(lambda: (os.write(2, b"terminate called without an active exception\n"), os.abort()))
'''


def _job(tmp_path: Path) -> Path:
    (tmp_path / "exit_abort.py").write_text(EXIT_ABORT)
    return tmp_path / "exit_abort.py"


def _runs(tmp_path: Path) -> list[dict]:
    return sorted((record(tmp_path / "runs", p.name) for p in (tmp_path / "runs").iterdir()
                   if (p / "run.json").exists()), key=lambda r: r["started_at"])


def test_an_up_failed_only_by_the_gloo_exit_abort_is_run_once_more_and_says_so(tmp_path):
    """Mutation: the retry in helpers.cddp removed (the first run's failure is the test's)."""
    _job(tmp_path)
    with pytest.warns(UserWarning, match=r"retried `clusterddp up local exit_abort.py \.\.\.` once: run \S+: "
                                         r"local rank 1 was killed by SIGABRT .* the gloo abort at interpreter exit"):
        r = cddp("up", "local", "exit_abort.py", "--gpus", "2", "--runs-dir", "runs", cwd=tmp_path, check_rc=0,
                 env={"ONCE": str(tmp_path / "aborted-once")})
    first, second = _runs(tmp_path)
    assert (first["status"], first["failure"]["signal"]) == ("failed", "SIGABRT") and second["status"] == "succeeded"
    assert run_id_of(r.stdout) == second["run_id"]


def test_the_same_abort_twice_still_fails_and_up_reports_it_as_a_failed_run(tmp_path):
    _job(tmp_path)
    with warnings.catch_warnings(record=True) as said, pytest.raises(AssertionError, match="rc=1"):
        warnings.simplefilter("always")
        cddp("up", "local", "exit_abort.py", "--gpus", "2", "--runs-dir", "runs", cwd=tmp_path, check_rc=0)
    assert len(said) == 1 and "retried" in str(said[0].message)  # once, not until it passes
    runs = _runs(tmp_path)
    assert len(runs) == 2
    for rec in runs:  # what `up` says of such a run: failed, the rank killed by SIGABRT (README: failures)
        f = rec["failure"]
        assert rec["status"] == "failed" and rec["exit_code"] == 1, rec
        assert (f["kind"], f["rank"], f["signal"], f["summary"]) == ("signal", 1, "SIGABRT", "killed by SIGABRT"), f


def _fake_run(tmp_path: Path, signal: str = "SIGABRT", log: str = "rank 1 done\n" + helpers.TERMINATE + "\n",
              error_file: bool = False) -> tuple[Path, str]:
    runs, run_id = tmp_path / "runs", "20261201-120000-ab12"
    (runs / run_id / "logs").mkdir(parents=True)
    (runs / run_id / "run.json").write_text(json.dumps({"status": "failed", "failure": {
        "host": "node2", "kind": "signal", "rank": 3, "signal": signal, "summary": f"killed by {signal}"}}))
    (runs / run_id / "logs" / "node2.log").write_text(log)
    (runs / run_id / "logs" / "node1.log").write_text("rank 0 done\n")
    if error_file:
        d = runs / run_id / "errors" / "node1" / "attempt_0" / "0"
        d.mkdir(parents=True)
        (d / "error.json").write_text("{}")
    return runs, run_id


CHILD_FAILED = ("Traceback (most recent call last):\n  File \"torch/distributed/run.py\", line 9, in main\n"
                "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n")


@pytest.mark.parametrize("change, retried", [
    ({}, True),
    ({"log": "rank 1 done\n" + helpers.TERMINATE + "\n" + CHILD_FAILED}, True),   # torchrun's own traceback
    ({"signal": "SIGKILL"}, False),                                                # not an abort
    ({"log": "rank 1 done\n"}, False),                                             # no std::terminate
    ({"log": "Traceback (most recent call last):\nValueError: x\n" + helpers.TERMINATE + "\n" + CHILD_FAILED},
     False),                                                                       # a rank raised
    ({"error_file": True}, False),                                                 # a rank's error file
])
def test_only_an_abort_after_every_rank_got_through_counts_as_the_gloo_exit_abort(tmp_path, change, retried):
    """Mutations: any of the three conditions in helpers.gloo_exit_abort dropped."""
    assert bool(gloo_exit_abort(*_fake_run(tmp_path, **change))) is retried


# ---- every test job that makes a process group ends it ----

MAKES_GROUP = ("init_process_group(", "ct.init(")
ENDS_GROUP = ("destroy_process_group()", "ct.cleanup(")
# Jobs that never reach their end on purpose: every rank fails or is killed, or waits to be stopped.
NEVER_ENDS = ("os._exit(", "os.kill(os.getpid()", "while True:", "raise ")


def _job_scripts() -> list[tuple[str, int, str]]:
    out = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    any(m in node.value for m in MAKES_GROUP) and "\n" in node.value.strip():
                out.append((str(path.relative_to(REPO)), node.lineno, node.value))
    return out


def test_every_test_job_that_makes_a_process_group_ends_it_before_the_interpreter_exits():
    jobs = _job_scripts()
    assert len(jobs) >= 10, jobs  # the scan finds the test modules' jobs
    unended = [f"{path}:{line}" for path, line, text in jobs
               if not any(e in text for e in ENDS_GROUP) and not any(n in text for n in NEVER_ENDS)]
    assert unended == [], ("these test jobs leave their process group (and gloo's threads) to the interpreter's "
                           f"exit, where torch 2.13 aborts now and then: end them with destroy_process_group(): "
                           f"{unended}")
