"""`clusterddp stacks` of a Slurm run, launcher side, through a login host that stands in for Slurm:
one job step per allocated node (srun --overlap, in the job's allocation, one task on that node),
all at once, each running the node program with that node's own control folder and marker, each
bounded; a node whose step timed out or failed is named and the others are shown; a job that has
not started, or has ended, is refused (exit 2). The real thing: test_up_slurm.py's detached run."""

from __future__ import annotations

import json
import shlex
import threading
from dataclasses import replace

import pytest

from clusterddp import stacks as stack_dumps
from clusterddp.backends import for_record
from clusterddp.backends.slurm import control as slurm_control
from clusterddp.backends.slurm import job as slurm
from clusterddp.backends.slurm.jobpart import SlurmJob, job_of, with_job
from clusterddp.errors import UsageError
from clusterddp.node import stacks as node_stacks
from clusterddp.runspec import RunSpec
from clusterddp.transport.base import CommandResult
from helpers import parse_inventory, resolved

INV = """
slurm:
  nodes: 2
  gpus_per_node: 2
  shared_dir: {shared}
  python: /opt/py/bin/python3
  setup: ["module load python"]
"""

WAITING = ('Current thread 0x0000000000000001 (most recent call first):\n'
           '  File "/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2800 in all_reduce\n'
           '  File "/s/runs/r/train.py", line 17 in <module>\n')


def reply(host: str, ranks: list[int]) -> bytes:
    procs = [{"pid": 100 + r, "role": "rank", "rank": r, "local_rank": r % 2, "how": "faulthandler", "main": "1",
              "dump": WAITING, "note": ""} for r in ranks]
    return ("srun noise\n" + node_stacks.MARK + json.dumps(
        {"time": 1.0, "host": host, "state": "running", "exit_code": None, "procs": procs}) + "\n").encode()


class _Slurm:
    """Job 4242 as ``scontrol`` tells it (``nodelist``, ``state``); each node's step answers as
    ``steps[host]`` says: (exit code, stdout, stderr)."""

    host = None
    name = "login1"

    def __init__(self, steps: dict, nodelist: str = "n[1-2]", state: str = "RUNNING") -> None:
        self.steps, self.nodelist, self.state = steps, nodelist, state
        self.srun: dict[str, tuple[list[str], float]] = {}
        self.at_once = threading.Barrier(len(steps), timeout=10)  # every step is asked before any answers

    def run(self, args, timeout=60):
        if args[:3] == ["scontrol", "-o", "show"]:
            return CommandResult(0, f"JobId=4242 JobState={self.state} Reason=None Partition=main "
                                    f"NodeList={self.nodelist} Restarts=0\n".encode(), b"")
        if args[:3] == ["scontrol", "show", "hostnames"]:
            return CommandResult(0, b"n1\nn2\n", b"")
        assert args[:2] == ["bash", "-c"], args
        words = shlex.split(args[2].split("; ", 1)[1].split(" | head -c ")[0])
        host = next(w.split("=", 1)[1] for w in words if w.startswith("--nodelist="))
        self.srun[host] = (words, timeout)
        self.at_once.wait()
        code, out, err = self.steps[host]
        return CommandResult(code, out, err)

    def small_files(self, paths):
        return {}

    def close(self) -> None:
        pass


def recorded(tmp_path, monkeypatch, login: _Slurm):
    inv = parse_inventory(INV.format(shared=tmp_path / "shared"), "c.yaml")
    (tmp_path / "train.py").write_text("pass\n")
    prep = slurm.prepare(inv, resolved(RunSpec("train.py", ()), inv), str(tmp_path / "runs"), tmp_path / "train.py")
    rec = slurm.new_record(prep, "c.yaml")
    prep.store.create(with_job(rec, replace(job_of(rec), job_id="4242")))
    monkeypatch.setattr(slurm_control, "open_login", lambda recorded: login)
    return prep


def test_one_overlapping_step_per_node_runs_the_node_program_with_that_nodes_folder_and_marker(tmp_path, monkeypatch):
    login = _Slurm({"n1": (0, reply("n1", [0, 1]), b""),
                    "n2": (124, b"", b"srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\n")})
    prep = recorded(tmp_path, monkeypatch, login)
    run_id, run_dir = prep.plan.run_id, prep.plan.run_dir
    rec = prep.store.load(run_id)
    taken = for_record(rec).stacks(prep.store, rec, 2.0)  # through the backend seam, as the CLI asks
    # the record learnt the allocation (a detached run's first look), the job's nodes in its order
    assert prep.store.load(run_id).hosts == ["n1", "n2"]
    limit = slurm_control.STEP_START_S + stack_dumps.ANSWER_S + 2.0
    for host in ("n1", "n2"):
        words, timeout = login.srun[host]
        assert words[:3] == ["timeout", "-k", "5"] and float(words[3]) == limit and timeout > limit
        i = words.index("srun")
        assert words[i + 1:i + 10] == ["--jobid=4242", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={host}",
                                       "--job-name=clusterddp-node", "--input=none", "--quiet", "bash"]
        command = words[-1]
        assert command.startswith("{ module load python\n}")  # the inventory's setup lines, then its python
        program = shlex.split(command)
        assert program[program.index("-S") - 1] == "/opt/py/bin/python3"
        args = json.loads(program[-1])
        assert args == {"ctl": f"{run_dir}/.clusterddp/nodes/{host}", "marker": f"{run_id}/{host}", "wait": 2.0}
    assert [(p.host, p.rank) for p in taken.procs] == [("n1", 0), ("n1", 1)]
    assert list(taken.unanswered) == ["n2"]
    assert taken.unanswered["n2"] == f"n2: its job step did not answer within {limit:g}s"


def test_a_step_that_fails_or_answers_garbage_is_named_by_what_srun_said(tmp_path, monkeypatch):
    login = _Slurm({"n1": (1, b"", b"srun: error: Unable to create step for job 4242: Job/step already completing "
                                   b"or completed\n"),
                    "n2": (0, b"not the program's reply\n", b"")})
    prep = recorded(tmp_path, monkeypatch, login)
    rec = prep.store.load(prep.plan.run_id)
    taken = for_record(rec).stacks(prep.store, rec, 1.0)
    assert not taken.procs
    assert taken.unanswered["n1"] == ("n1: its job step failed (exit 1): srun: error: Unable to create step for "
                                      "job 4242: Job/step already completing or completed")
    assert taken.unanswered["n2"].startswith("n2: no stacks reply from its job step (exit 0): no CLUSTERDDP_STACKS")


def test_a_job_that_has_not_started_is_refused_and_no_step_is_asked_for(tmp_path, monkeypatch):
    login = _Slurm({}, nodelist="", state="PENDING")
    prep = recorded(tmp_path, monkeypatch, login)
    rec = prep.store.load(prep.plan.run_id)
    with pytest.raises(UsageError, match=r"slurm job 4242 has not started yet: no rank runs"):
        for_record(rec).stacks(prep.store, rec, 1.0)
    assert login.srun == {}


def test_the_record_keeps_the_nodes_settings_for_the_nodes_it_learns_later(tmp_path):
    from clusterddp.record import BackendPart
    inv = parse_inventory(INV.format(shared=tmp_path / "shared"), "c.yaml")
    (tmp_path / "train.py").write_text("pass\n")
    prep = slurm.prepare(inv, resolved(RunSpec("train.py", ()), inv), str(tmp_path / "runs"), tmp_path / "train.py")
    job = job_of(slurm.new_record(prep, "c.yaml"))
    assert job.node is not None
    assert (job.node.python, job.node.setup) == ("/opt/py/bin/python3", ("module load python",))
    assert SlurmJob.from_part(job.part()) == job
    older = BackendPart("slurm", 1, {"run_dir": "/s", "job_id": "7", "partition": None})
    assert SlurmJob.from_part(older).node is None  # older
