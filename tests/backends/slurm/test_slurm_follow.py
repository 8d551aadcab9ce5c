"""Looking at a Slurm job from the launcher.

Following it while the login host (or Slurm's controller) is out of reach: `up` asks
again with a new connection for a grace period, then stops following with an error that says the
job goes on and how to reach it; the run stays recorded as running. A login host stands in here
(pure control flow, a short grace); the real outage and recovery over SSH is in
tests/backends/slurm/test_up_slurm_login.py. And `status` reads the shared folder before it locks the run record.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from clusterddp import store as store_mod
from clusterddp.backends.slurm import control as slurm_control
from clusterddp.backends.slurm import job as slurm
from clusterddp.backends.slurm.jobpart import job_of, with_job
from clusterddp.errors import HostError, HostErrorKind, SlurmError
from clusterddp.runspec import RunSpec
from clusterddp.store import RunStore
from clusterddp.transport.base import CommandResult
from helpers import parse_inventory, resolved

INV = """
slurm:
  nodes: 2
  gpus_per_node: 1
  shared_dir: {shared}
"""


def _recorded(tmp_path, job_id: str | None = None) -> slurm.Prepared:
    """A planned Slurm run of a `login: local` inventory, recorded as running (with ``job_id``, as
    if sbatch had answered); tests give it their stand-in login."""
    inv = parse_inventory(INV.format(shared=tmp_path / "shared"), "c.yaml")
    (tmp_path / "t.py").write_text("pass\n")
    prep = slurm.prepare(inv, resolved(RunSpec("t.py", ()), inv), str(tmp_path / "runs"), tmp_path / "t.py")
    rec = slurm.new_record(prep, "c.yaml")
    prep.store.create(with_job(rec, replace(job_of(rec), job_id=job_id)))
    return prep


class _GoneAfterSubmit:
    """Takes the sbatch, then every later look fails with ``error``."""

    host = None
    name = "login1"

    def __init__(self, error: Exception) -> None:
        self.error, self.looks, self.closed = error, 0, 0

    def stage(self, *args) -> None:
        pass

    def run(self, args, timeout=60):
        if args[0] == "sbatch":
            return CommandResult(0, b"4242\n", b"")
        self.looks += 1
        raise self.error

    def read(self, path, offset, limit):
        raise self.error

    def close(self) -> None:
        self.closed += 1


@pytest.mark.parametrize("error", [
    HostError("login1", "connection lost", kind=HostErrorKind.CONNECTION_LOST),
    SlurmError("scontrol show job 4242 failed (exit 1): Unable to contact slurm controller"),
])
def test_a_login_host_gone_for_longer_than_the_grace_ends_following_but_not_the_job(tmp_path, error):
    login = _GoneAfterSubmit(error)
    prep = replace(_recorded(tmp_path), login=login)
    notes: list[str] = []
    with pytest.raises(type(error)) as got:
        slurm.execute(prep, lambda h, b: None, on_note=notes.append, grace=0.6, runs_dir_flag=" --runs-dir R")
    run_id = prep.plan.run_id
    assert str(error.message) in str(got.value)
    assert got.value.hint is not None and "Slurm job 4242 goes on" in got.value.hint
    assert f"`clusterddp stop {run_id} --runs-dir R` ends it" in got.value.hint
    assert notes == [f"{error.message}; asking again for 0.6 s (the job goes on meanwhile)"]
    assert login.looks >= 2 and login.closed == login.looks  # asked again, each time on a new connection
    rec = prep.store.load(run_id)
    assert rec.status.value == "running" and job_of(rec).job_id == "4242"
    if isinstance(error, HostError):
        assert got.value.host == "login1" and got.value.kind is HostErrorKind.CONNECTION_LOST


class _Running:
    """A login host on which job 4242 runs on n1 and n2, and n1 has written exit code 0. While it
    reads the shared folder, another launcher (another RunStore on the same runs folder, as another
    process would be) updates the run record: that must not wait on this look."""

    host = None
    name = "login1"

    def __init__(self, other: RunStore, run_id: str) -> None:
        self.other, self.run_id, self.updated_meanwhile = other, run_id, False

    def run(self, args, timeout=60):
        if args[:3] == ["scontrol", "-o", "show"]:
            return CommandResult(0, b"JobId=4242 JobState=RUNNING Reason=None Partition=main NodeList=n[1-2]\n", b"")
        if args[:3] == ["scontrol", "show", "hostnames"]:
            return CommandResult(0, b"n1\nn2\n", b"")
        raise AssertionError(args)

    def small_files(self, paths):
        self.other.update(self.run_id, lambda r: replace(r, name="renamed meanwhile"))
        self.updated_meanwhile = True
        return {p: ("0\n", 1.0) for p in paths if p.endswith("/n1/exit_code")}

    def close(self) -> None:
        pass


def test_status_reads_the_shared_folder_before_it_locks_the_run_record(tmp_path, monkeypatch):
    monkeypatch.setattr(store_mod, "LOCK_TIMEOUT", 2.0)  # a wait on a held lock fails in 2 s, not 60
    prep = _recorded(tmp_path, job_id="4242")
    login = _Running(RunStore(str(tmp_path / "runs")), prep.plan.run_id)
    monkeypatch.setattr(slurm_control, "open_login", lambda recorded: login)
    got = slurm_control.status(prep.store, prep.plan.run_id)
    assert login.updated_meanwhile and got.name == "renamed meanwhile"  # the other update was kept
    seen = [(n.host, n.state.value, n.exit_code) for n in got.nodes]
    assert seen == [("n1", "succeeded", 0), ("n2", "running", None)]


class _InterruptedThenGone(_GoneAfterSubmit):
    """Takes the sbatch; the first look at the job is interrupted (Ctrl-C); then scancel cannot
    reach the login host."""

    def run(self, args, timeout=60):
        if args[0] == "sbatch":
            return CommandResult(0, b"4242\n", b"")
        if args[0] == "scontrol" and self.looks == 0:
            self.looks += 1
            raise KeyboardInterrupt
        self.looks += 1
        raise self.error


def test_a_ctrl_c_whose_scancel_cannot_reach_slurm_says_the_job_was_not_cancelled(tmp_path):
    login = _InterruptedThenGone(HostError("login1", "cannot connect: connection refused",
                                           kind=HostErrorKind.UNREACHABLE))
    prep = replace(_recorded(tmp_path), login=login)
    with pytest.raises(HostError) as got:
        slurm.execute(prep, lambda h, b: None)
    run_id = prep.plan.run_id
    assert str(got.value).startswith("login1: cannot connect: connection refused")
    assert got.value.hint is not None and "Slurm job 4242 may still be running: it was not cancelled" in got.value.hint
    assert f"`clusterddp stop {run_id}` cancels it" in got.value.hint
    assert prep.store.load(run_id).status.value == "running"  # not recorded as stopped: it may well run on


class _EndedThenCollectInterrupted:
    """Takes the sbatch; job 4242 has ended (COMPLETED on n1 and n2, each exit code 0); a Ctrl-C comes
    as the collect opens the first node's log."""

    host = None
    name = "login1"

    def stage(self, *args) -> None:
        pass

    def run(self, args, timeout=60):
        if args[0] == "sbatch":
            return CommandResult(0, b"4242\n", b"")
        if args[:3] == ["scontrol", "-o", "show"]:
            return CommandResult(0, b"JobId=4242 JobState=COMPLETED Reason=None Partition=main NodeList=n[1-2] "
                                    b"Restarts=0\n", b"")
        if args[:3] == ["scontrol", "show", "hostnames"]:
            return CommandResult(0, b"n1\nn2\n", b"")
        raise AssertionError(args)

    def read(self, path, offset, limit):
        return b""

    def small_files(self, paths):
        return {p: ("0\n", 1.0) for p in paths}

    def open_file(self, path):
        raise KeyboardInterrupt

    def collect_host(self, run_dir):
        return None, None  # where the shared folder is read: the Ctrl-C comes before it is used

    def close(self) -> None:
        pass


def test_a_ctrl_c_during_the_end_of_run_collect_records_the_jobs_outcome_and_says_how_to_fetch_the_rest(tmp_path):
    """As for an SSH run (clusterddp.backends.lifecycle.end): the job succeeded, only the collect was cut
    short; before the one lifecycle, a Slurm run was left `running`, saying nothing."""
    prep = replace(_recorded(tmp_path), login=_EndedThenCollectInterrupted())
    notes: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        slurm.execute(prep, lambda h, b: None, on_note=notes.append)
    run_id = prep.plan.run_id
    assert notes == [f"[clusterddp] collect interrupted: the run is recorded succeeded; "
                     f"`clusterddp collect {run_id}` fetches its logs and files"]
    rec = prep.store.load(run_id)
    assert rec.status.value == "succeeded" and rec.ended_at is not None
    assert [(n.host, n.state.value, n.exit_code) for n in rec.nodes] == [("n1", "succeeded", 0), ("n2", "succeeded", 0)]
