"""The login host seam (clusterddp/slurm_login.py) and the shell it sends (plan.py's login renderers).

The commands are golden-tested as text, then run for real: :class:`SSHLogin` is given a transport that
runs them with this machine's bash (the same text an SSH channel would carry), so the quoting, the
exit codes and the parsing of the answers are exercised without a network. Over real SSH and Slurm:
tests/backends/slurm/test_up_slurm_login.py.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from clusterddp.backends.slurm import commands as slurm_commands
from clusterddp.backends.slurm.login import LocalLogin, SSHLogin, open_login
from clusterddp.backends.slurm.section import SlurmSettings
from clusterddp.errors import SlurmError, UsageError
from clusterddp.inventory import Host
from clusterddp.transport.local import LocalTransport
from clusterddp.upload import SourceFolder
from helpers import REPO
from test_plan import golden


def login_host(**kw) -> Host:
    base = dict(name="login1", address="10.0.0.5", user="me", port=22, identity_file=None, known_hosts="/k",
                host_key_policy="strict", gpus=1, python="python3", workdir="~/clusterddp",
                env=(("SLURM_CONF", "/etc/slurm/it's.conf"), ("X", "a $b `c`")),
                setup=("module load slurm",), connect_timeout=10.0)
    return Host(**{**base, **kw})  # type: ignore[arg-type]


def settings(shared_dir: str) -> SlurmSettings:
    return SlurmSettings(login="local", partition=None, nodes=(1, 1), gpus_per_node=1, request_gpus=False,
                         time=None, account=None, qos=None, constraint=None, sbatch=(), shared_dir=shared_dir,
                         python="python3", setup=(), env=())


def test_the_login_commands_render_as_their_golden_file():
    cmd = slurm_commands.login_command(
        login_host(), ["sbatch", "--parsable", "/shared/runs/r 1/.clusterddp/job.sbatch"]
    )
    text = (
        "\n\n".join(
            [
                "== login_command ==",
                cmd.text,
                "== its stdin ==",
                cmd.stdin.decode(),
                "== home_command ==",
                slurm_commands.home_command(),
                "== file_read_command ==",
                slurm_commands.file_read_command("/shared/runs/r'1/.clusterddp/nodes/node-1.log", 4096, 1 << 20),
                "== small_files_command ==",
                slurm_commands.small_files_command(["/s/a.exit_code", "/s/b c.exit_code"]),
                "== slurm_stage_command ==",
                slurm_commands.stage_command("/shared/runs/r 1", "/shared/runs/r 1/.clusterddp"),
                "== remove_tree_command ==",
                slurm_commands.remove_tree_command("/shared/.clusterddp-check/ab cd"),
                "== node_step_command ==",
                " ".join(slurm_commands.node_step_command("4242", "node-1", "echo 'it''s' $HOME", 62.5, 1000)),
            ]
        )
        + "\n"
    )
    golden("slurm_login_commands.txt", text)
    # the env values never appear in the command text: they travel on stdin
    assert "it's.conf" not in cmd.text and "a $b" not in cmd.text


class _Bash(LocalTransport):
    """This machine's bash as the login host's shell; a file's path as stdin is read whole (tests only)."""

    def run(self, command, *, timeout=None, stdin=None):  # type: ignore[override]
        if isinstance(stdin, os.PathLike):
            stdin = Path(stdin).read_bytes()
        return super().run(command, timeout=timeout, stdin=stdin)


def bash_login(host: Host | None = None) -> SSHLogin:
    login = SSHLogin(host or login_host(setup=()))
    login._t = _Bash("login1")  # what connect() would open, over SSH
    return login


def test_slurm_commands_get_the_login_env_and_setup_and_their_failures_name_the_host(tmp_path):
    login = bash_login(login_host(setup=(f"cd {tmp_path}",)))
    r = login.run(["sh", "-c", 'printf "%s|%s|%s" "$SLURM_CONF" "$X" "$PWD"'])
    assert r.exit_code == 0 and r.text == f"/etc/slurm/it's.conf|a $b `c`|{tmp_path}"
    with pytest.raises(SlurmError, match="sbatch-nope: not found on the login host login1"):
        login.run(["sbatch-nope", "--parsable"])
    with pytest.raises(SlurmError, match=r"login1: \[clusterddp\] setup failed: false"):
        bash_login(login_host(setup=("false",))).run(["true"])


def test_shared_dir_is_expanded_with_the_login_users_home(monkeypatch):
    login = bash_login()
    monkeypatch.setenv("HOME", "/home/me")
    assert login.shared_dir(settings("~/clusterddp")) == "/home/me/clusterddp"
    assert login.shared_dir(settings("~")) == "/home/me"
    assert login.shared_dir(settings("scratch/x/../y")) == "/home/me/scratch/y"
    assert login.shared_dir(settings("/shared//c")) == "/shared/c"


def test_staging_reading_and_small_files_over_the_login_shell(tmp_path):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "train.py").write_text("print('hi')\n")
    (src / "train.py").chmod(0o750)
    (src / "pkg" / "m.py").write_text("x = 1\n")
    (src / "link").symlink_to("/etc/passwd")
    folder = SourceFolder(src, (("pkg/", 0), ("pkg/m.py", 6), ("train.py", 12), ("link", 0)))
    run_dir = str(tmp_path / "shared" / "runs" / "r 1")
    ctl = run_dir + "/.clusterddp"
    login = bash_login()
    login.stage(run_dir, ctl, folder, {"node.sh": "export SECRET='s'\n", "job.sbatch": "#!/bin/sh\n"})
    run = Path(run_dir)
    assert (run / "train.py").read_text() == "print('hi')\n" and (run / "pkg" / "m.py").read_text() == "x = 1\n"
    assert stat.S_IMODE((run / "train.py").stat().st_mode) == 0o750  # the script's modes, as copied locally
    assert os.readlink(run / "link") == "/etc/passwd"  # a link is sent as a link, never followed
    assert stat.S_IMODE(Path(ctl).stat().st_mode) == 0o700
    assert stat.S_IMODE((Path(ctl) / "nodes").stat().st_mode) == 0o700
    for name in ("node.sh", "job.sbatch"):
        assert stat.S_IMODE((Path(ctl) / name).stat().st_mode) == 0o600
    assert (Path(ctl) / "node.sh").read_text() == "export SECRET='s'\n"
    # the upload builder's tarball, as for SSH runs: clusterddp.train for nodes whose python lacks it
    shipped = Path(ctl) / "lib" / "clusterddp" / "train.py"
    assert shipped.read_bytes() == (REPO / "clusterddp" / "train.py").read_bytes()
    with pytest.raises(UsageError, match="already holds a run"):  # a run folder is never reused
        login.stage(run_dir, ctl, None, {})

    log = Path(ctl) / "nodes" / "node-1.log"
    log.write_bytes(b"0123456789")
    assert login.read(str(log), 0, 4) == b"0123" and login.read(str(log), 4, 100) == b"456789"
    assert login.read(str(log), 10, 100) == b"" and login.read(str(log) + ".nope", 0, 10) is None
    with login.open_file(str(log)) as f:
        assert f.read() == b"0123456789"
    with pytest.raises(FileNotFoundError), login.open_file(str(log) + ".nope"):
        pass
    code = Path(ctl) / "nodes" / "node 1.exit_code"
    code.write_text("3\n")
    got = login.small_files([str(log) + ".nope", str(code)])
    assert list(got) == [str(code)] and got[str(code)][0] == "3"
    assert abs(got[str(code)][1] - code.stat().st_mtime) < 0.01
    assert login.small_files([]) == {}
    login.remove_tree(run_dir)
    assert not run.exists()


def test_a_local_login_is_this_machine_and_nothing_is_contacted_before_use():
    assert isinstance(open_login("local"), LocalLogin) and isinstance(open_login(None), LocalLogin)
    remote = open_login(login_host(address="192.0.2.1"))  # TEST-NET: would hang if contacted
    assert isinstance(remote, SSHLogin) and remote._t is None
    remote.close()


def test_the_run_record_keeps_the_login_host_and_reads_it_back_strictly():
    from clusterddp.backends.slurm.jobpart import SlurmJob
    from clusterddp.errors import RecordError
    from clusterddp.record import BackendPart
    job = SlurmJob(run_dir="/s/runs/r", job_id="7", login=login_host())
    data = dict(job.part().data)
    assert data["login"]["address"] == "10.0.0.5" and data["login"]["env"]["SLURM_CONF"] == "/etc/slurm/it's.conf"
    assert SlurmJob.from_part(BackendPart("slurm", 2, data)) == job
    assert "login" not in SlurmJob(run_dir="/s").part().data  # a local login: the record reads as before
    older = BackendPart("slurm", 1, {"run_dir": "/s", "job_id": None, "partition": None})
    assert SlurmJob.from_part(older).login is None
    with pytest.raises(RecordError, match="slurm.login.port"):
        SlurmJob.from_part(BackendPart("slurm", 2, {**data, "login": {**data["login"], "port": "22"}}))
