"""A broken or hostile Slurm login host (issue 23): sinfo, scontrol and squeue answers are read
defensively (clusterddp/backends/slurm/answers.py), Slurm's text is escaped before it is printed, and a
run whose job gave a refused answer is cancelled and recorded failed, never left running. The
login host here is a stand-in answering crafted bytes (pure logic; the real bed is in test_up_slurm.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from clusterddp.backends.slurm import answers
from clusterddp.backends.slurm import check as slurm_check
from clusterddp.backends.slurm import control as slurm_control
from clusterddp.backends.slurm import job as slurm
from clusterddp.backends.slurm.jobpart import SlurmJob, job_of, with_job
from clusterddp.errors import SlurmAnswerError
from clusterddp.record import RunStatus
from clusterddp.runspec import RunSpec
from clusterddp.transport.base import CommandResult
from helpers import parse_inventory, resolved

INV = """
slurm:
  nodes: 2
  gpus_per_node: 1
  request_gpus: {gpus}
  partition: main
  shared_dir: {shared}
"""
BAD_COUNTS = ["abc", "9" * 5000, "\u0661\u0662", "\u00b2", "-1", "1e3", ""]


@pytest.mark.parametrize("text", BAD_COUNTS)
def test_a_count_that_is_no_count_is_refused_naming_the_field_never_a_traceback(text):
    with pytest.raises(SlurmAnswerError) as e:
        answers.count(text, "sinfo: node count")
    assert e.value.message.startswith("sinfo: node count: ") and len(e.value.message) < 200
    assert answers.count("12", "x") == 12


def test_scontrol_show_job_fields_are_checked_and_bounded():
    ok = answers.job_fields("JobId=7 JobState=RUNNING Reason=None Restarts=2 Partition=" + "p" * 5000, "7")
    assert (ok["JobState"], ok["Restarts"], len(ok["Partition"])) == ("RUNNING", "2", answers.MAX_FIELD)
    with pytest.raises(SlurmAnswerError, match=r"scontrol show job 7: Restarts: 'abc' is not a count"):
        answers.job_fields("JobId=7 JobState=RUNNING Restarts=abc", "7")
    with pytest.raises(SlurmAnswerError, match=r"JobState='\\x1b\[2J' is not a job state"):
        answers.job_fields("JobId=7 JobState=\x1b[2J", "7")


@pytest.mark.parametrize("name", ["../../..", "..", ".", "a/b", "x\x1b[31m", "/etc"])
def test_a_node_name_that_is_no_folder_name_is_refused(name):
    with pytest.raises(SlurmAnswerError, match="is not a node name"):
        answers.hostnames(f"node-1 {name}\n", "node-[1-2]")
    assert answers.hostnames("node-1\nnode_2.x\n", "n") == ("node-1", "node_2.x")


class _Login:
    """A login host whose Slurm answers ``job`` to `scontrol show job` and ``names`` to `show hostnames`."""

    host = None
    name = "slurm"

    def __init__(self, job: bytes = b"", names: bytes = b"", sinfo: bytes = b"") -> None:
        self.job, self.names, self.sinfo, self.asked = job, names, sinfo, []

    def run(self, args, timeout=60):
        self.asked.append(list(args))
        if args[0] == "sbatch":
            return CommandResult(0, b"4242\n", b"")
        if args[:3] == ["scontrol", "-o", "show"]:
            return CommandResult(0, self.job, b"")
        if args[:3] == ["scontrol", "show", "hostnames"]:
            return CommandResult(0, self.names, b"")
        if args[0] == "scancel":
            return CommandResult(0, b"", b"")
        if args[:2] == ["sinfo", "--version"]:
            return CommandResult(0, b"slurm 22.05.8\n", b"")
        if args[0] == "sinfo":
            return CommandResult(0, self.sinfo, b"")
        raise AssertionError(args)

    def stage(self, *args) -> None:
        pass

    def small_files(self, paths):
        return {}

    def read(self, path, offset, limit):
        return None

    def close(self) -> None:
        pass

    @property
    def cancelled(self) -> bool:
        return ["scancel", "4242"] in self.asked


def _inv(tmp_path, gpus: bool = False):
    return parse_inventory(INV.format(shared=tmp_path / "shared", gpus=str(gpus).lower()), "c.yaml")


def _prep(tmp_path, login: _Login) -> slurm.Prepared:
    (tmp_path / "t.py").write_text("pass\n")
    i = _inv(tmp_path)
    prep = slurm.prepare(i, resolved(RunSpec("t.py", ()), i), str(tmp_path / "runs"), tmp_path / "t.py")
    prep = replace(prep, login=login)  # type: ignore[arg-type]
    prep.store.create(slurm.new_record(prep, "c.yaml"))
    return prep


@pytest.mark.parametrize(("job", "names", "said"), [
    (b"JobId=4242 JobState=RUNNING Reason=None NodeList=n[1-2] Restarts=abc\n", b"n1 n2\n", "Restarts: 'abc'"),
    (b"JobId=4242 JobState=RUNNING Reason=None NodeList=n[1-2] Restarts=0\n", b"n1 ../../..\n", "'../../..'"),
], ids=["restarts", "nodelist"])
def test_up_cancels_the_job_and_records_the_run_failed_when_an_answer_is_refused(tmp_path, job, names, said):
    login = _Login(job, names)
    prep = _prep(tmp_path, login)
    with pytest.raises(SlurmAnswerError) as e:
        slurm.execute(prep, lambda h, b: None)
    assert said in e.value.message and "run record" not in e.value.message
    assert "Slurm job 4242 was cancelled" in (e.value.hint or "")
    assert login.cancelled
    rec = prep.store.load(prep.plan.run_id)
    assert rec.status is RunStatus.FAILED and rec.ended_at is not None
    assert not (tmp_path / "shared" / "runs").exists() or not any((tmp_path / "shared").rglob("..*"))


def test_status_of_a_running_run_whose_job_answers_garbage_fails_it_and_cancels_the_job(tmp_path, monkeypatch):
    login = _Login(b"JobId=4242 JobState=RUNNING NodeList=n[1-2] Restarts=abc\n", b"n1 n2\n")
    prep = _prep(tmp_path, login)
    run_id = prep.plan.run_id
    prep.store.update(run_id, lambda r: with_job(r, replace(job_of(r), job_id="4242")))
    monkeypatch.setattr(slurm_control, "open_login", lambda recorded: login)
    with pytest.raises(SlurmAnswerError, match="Restarts: 'abc' is not a count"):
        slurm_control.status(prep.store, run_id)
    assert login.cancelled and prep.store.load(run_id).status is RunStatus.FAILED


@pytest.mark.parametrize("count", ["abc", "9" * 5000, "\u0661"])
def test_check_names_a_node_or_gpu_count_that_is_no_count(tmp_path, monkeypatch, count):
    cases = [(False, f"main*|up|{count}|idle|(null)\n")]
    if count[0].isdigit():  # gres `gpu:abc` names no count at all: 0 GPUs
        cases.append((True, f"main*|up|2|idle|gpu:{count}\n"))
    for gpus, sinfo in cases:
        login = _Login(sinfo=sinfo.encode())
        monkeypatch.setattr(slurm_check, "open_login", lambda s, login=login: login)
        report = slurm_check.run_slurm_checks(_inv(tmp_path, gpus=gpus))
        (host,) = report.hosts
        bad = [f for f in host.findings if f.status == "fail"]
        assert [f.value for f in bad] == ["bad answer"] and "is not a count" in (bad[0].problem or ""), host


def test_slurms_words_are_escaped_before_they_reach_the_terminal(capsys):
    from clusterddp.cli.up import Printed
    info = slurm.JobInfo("7", "PENDING", "\x1b]0;owned\x07Priority", "main", ())
    Printed(raw=False, hide=None).say(slurm.job_line(info))
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\\x1b]0;owned\\x07Priority" in out


def test_a_slurm_run_seen_ended_long_after_records_when_its_nodes_exit_codes_were_written():
    """As for SSH runs (issue 24 s5): a detached run looked at 10 min after it ended records its own end,
    the last exit code file's time, not the look's; a stop (no node times) is recorded at the stop."""
    from datetime import datetime, timedelta, timezone

    from clusterddp.backends.base import RunOutcome
    from clusterddp.errors import NodeOutcome
    from helpers import make_record

    start = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
    now = start + timedelta(minutes=10, seconds=37)
    rec = make_record("20261201-120000-5a5a", (), started_at=start.isoformat(),
                      backend=SlurmJob(run_dir="/shared/runs/r", job_id="7", nproc=1).part())
    info = slurm.JobInfo("7", "COMPLETED", "None", "main", ("n1", "n2"))
    done = RunOutcome(RunStatus.SUCCEEDED, (NodeOutcome("n1", 0, 0), NodeOutcome("n2", 1, 0)))
    ends = [(start + timedelta(seconds=s)).timestamp() for s in (58, 61)] + [float("inf")]  # inf: none written
    seen = slurm_control._seen(rec, info, done, ends, now)
    assert seen.status is RunStatus.SUCCEEDED and seen.ended_at == "2026-12-01T12:01:01+00:00"
    assert slurm_control._seen(rec, info, done, (), now).ended_at == now.isoformat(timespec="seconds")
