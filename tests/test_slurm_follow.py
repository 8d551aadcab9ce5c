"""Following a Slurm job while the login host (or Slurm's controller) is out of reach: `up` asks
again with a new connection for a grace period, then stops following with an error that says the
job goes on and how to reach it; the run stays recorded as running. A login host stands in here
(pure control flow, a short grace); the real outage and recovery over SSH is in
tests/test_up_slurm_login.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from clusterddp import inventory, slurm
from clusterddp.errors import HostError, HostErrorKind, SlurmError
from clusterddp.plan import RunSpec
from clusterddp.transport.base import CommandResult

INV = """
slurm:
  nodes: 2
  gpus_per_node: 1
  shared_dir: {shared}
"""


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
    inv = inventory.parse(INV.format(shared=tmp_path / "shared"), "c.yaml")
    (tmp_path / "t.py").write_text("pass\n")
    prep = slurm.prepare(inv, RunSpec("t.py", ()), str(tmp_path / "runs"), tmp_path / "t.py")
    login = _GoneAfterSubmit(error)
    prep = replace(prep, login=login)
    prep.store.create(slurm.new_record(prep, "c.yaml"))
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
    assert rec.status.value == "running" and rec.slurm is not None and rec.slurm.job_id == "4242"
    if isinstance(error, HostError):
        assert got.value.host == "login1" and got.value.kind is HostErrorKind.CONNECTION_LOST
