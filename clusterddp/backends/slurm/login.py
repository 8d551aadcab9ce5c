"""Where a `slurm:` inventory's Slurm commands run and its shared folder is read: the login host.

``login: local`` is this machine (:class:`LocalLogin`: subprocess and local files); a host entry is
a login host reached over SSH (:class:`SSHLogin`: the commands :mod:`clusterddp.plan` renders, run
through :mod:`clusterddp.transport`). :mod:`.job`, :mod:`.control` and
:mod:`.check` talk to Slurm and the shared folder only through a :class:`Login`.

The SSH connection opens on first use (``--dry-run`` contacts nothing) and is kept for the run.
An unreachable login host, or a refused host key, is the transport's HostError naming it.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Protocol, cast

from ... import upload
from ...errors import SlurmError, UsageError
from ...inventory import LOCAL, Host
from ...transport.base import CommandResult, Tail, Transport
from . import commands as slurm_commands
from .section import SlurmSettings

if TYPE_CHECKING:
    from ...upload import SourceFolder

COMMAND_TIMEOUT = 60.0
READ_TIMEOUT = 60.0


class Login(Protocol):
    name: str      # how messages name the login host: "slurm" for this machine, else its inventory name
    host: Host | None  # None: this machine

    def run(self, args: Sequence[str], timeout: float = COMMAND_TIMEOUT) -> CommandResult:
        """A Slurm client command; raises SlurmError when it cannot run there (HostError: host unreachable)."""
        ...

    def shared_dir(self, s: SlurmSettings) -> str:
        """``s.shared_dir`` as an absolute path on the login host (``~``: the login user's home there)."""
        ...

    def stage(self, run_dir: str, control_dir: str, folder: SourceFolder | None, private: dict[str, str]) -> None:
        """Create the run folder and its 0700 control folder (refused if it exists), copy the script's folder
        into it, and write ``private`` (name -> text: job.sbatch, node.sh) 0600 in the control folder."""
        ...

    def read(self, path: str, offset: int, limit: int) -> bytes | None:
        """At most ``limit`` bytes of a file in the shared folder from ``offset``; None when it is not there."""
        ...

    def small_files(self, paths: Sequence[str]) -> dict[str, tuple[str, float]]:
        """The text and mtime of each of ``paths`` that exists (exit code files)."""
        ...

    @contextmanager
    def open_file(self, path: str) -> Iterator[BinaryIO]:
        """A whole file of the shared folder to read (never held in memory); FileNotFoundError if missing."""
        ...

    def remove_tree(self, path: str) -> None:
        """Remove a folder clusterddp made in the shared folder (check's probe); errors ignored."""
        ...

    def collect_host(self, run_dir: str) -> tuple[Transport, Host]:
        """A transport where the shared folder is, and the host to run the collect program as there."""
        ...

    def close(self) -> None: ...


def _not_found(where: str, args: Sequence[str]) -> SlurmError:
    return SlurmError(f"{args[0]}: not found on {where}",
                      "run clusterddp on a Slurm login host (slurm-client installed), or set slurm.login")


def _stage(run: Callable[[str, Path], CommandResult], where: str, run_dir: str, control_dir: str,
           folder: SourceFolder | None, private: dict[str, str]) -> None:
    """Stage a run the same way wherever the login host is: one stream, the upload builder's tarball
    (:func:`clusterddp.upload.pack`: the script's folder, the shipped clusterddp.train and the 0600
    job.sbatch and node.sh), unpacked by one command (``run(command, tarball)``) into a run folder
    it creates; the env values in node.sh never touch a command line."""
    up = upload.pack(folder or upload.SourceFolder(Path("."), ()), private, posixpath.relpath(control_dir, run_dir))
    try:
        r = run(slurm_commands.stage_command(run_dir, control_dir), up.path)
    except OSError as e:
        raise UsageError(f"cannot stage the run in {run_dir} on {where}: {e}",
                         "slurm.shared_dir must be a folder the login user can write") from None
    finally:
        up.discard()
    if r.exit_code == slurm_commands.NO_FILE:
        raise UsageError(f"{run_dir} on {where} already holds a run", "use another run id")
    if r.exit_code != 0:
        said = r.stderr.decode(errors="replace").strip()[-300:]
        raise UsageError(f"cannot stage the run in {run_dir} on {where}: {said or f'exit {r.exit_code}'}",
                         "slurm.shared_dir must be a folder the login user can write")


class LocalLogin:
    """This machine is the login host: Slurm's commands run here, the shared folder is a local path."""

    name = "slurm"
    host: Host | None = None

    def run(self, args: Sequence[str], timeout: float = COMMAND_TIMEOUT) -> CommandResult:
        try:
            # A session of its own: a Ctrl-C meant for clusterddp does not kill sbatch after it submitted
            r = subprocess.run(list(args), capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL,
                               start_new_session=True)
        except FileNotFoundError:
            raise _not_found("this machine", args) from None
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{' '.join(args[:3])} did not answer within {timeout:g}s",
                             "is slurmctld up? try `sinfo`") from None
        return CommandResult(r.returncode, r.stdout, r.stderr)

    def shared_dir(self, s: SlurmSettings) -> str:
        return os.path.abspath(os.path.expanduser(s.shared_dir))

    def stage(self, run_dir: str, control_dir: str, folder: SourceFolder | None, private: dict[str, str]) -> None:
        def run(command: str, tarball: Path) -> CommandResult:
            with open(tarball, "rb") as f:
                r = subprocess.run(["bash", "-c", command], stdin=f, capture_output=True, timeout=600)
            return CommandResult(r.returncode, r.stdout, r.stderr)
        _stage(run, "this machine", run_dir, control_dir, folder, private)

    def read(self, path: str, offset: int, limit: int) -> bytes | None:
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                return f.read(limit)
        except FileNotFoundError:
            return None

    def small_files(self, paths: Sequence[str]) -> dict[str, tuple[str, float]]:
        out = {}
        for p in paths:
            try:
                with open(p, "rb") as f:
                    out[p] = (f.read(32).decode(errors="replace"), os.fstat(f.fileno()).st_mtime)
            except OSError:
                continue
        return out

    @contextmanager
    def open_file(self, path: str) -> Iterator[BinaryIO]:
        with open(path, "rb") as f:
            yield f

    def remove_tree(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def collect_host(self, run_dir: str) -> tuple[Transport, Host]:
        from ...transport.local import LocalTransport
        host = Host(name="shared", address="shared", user=None, port=None, identity_file=None, known_hosts="",
                    host_key_policy="strict", gpus=1, python=sys.executable, workdir=run_dir, env=(), setup=(),
                    connect_timeout=10.0, transport="local")
        return cast(Transport, LocalTransport(host.name)), host

    def close(self) -> None:
        pass


class SSHLogin:
    """A login host reached over SSH: Slurm's commands run there after its setup lines and env; the
    shared folder is read and written there."""

    def __init__(self, host: Host) -> None:
        self.host: Host | None = host
        self._host = host
        self.name = host.name
        self._t: Transport | None = None

    def _transport(self) -> Transport:
        if self._t is None:
            from ...transport import connect
            self._t = connect(self._host)
        return self._t

    def run(self, args: Sequence[str], timeout: float = COMMAND_TIMEOUT) -> CommandResult:
        cmd = slurm_commands.login_command(self._host, args)
        r = self._transport().run(cmd.text, stdin=cmd.stdin, timeout=timeout)
        if r.exit_code == 127 and b"not found" in r.stderr:
            raise _not_found(f"the login host {self.name}", args)
        if r.exit_code == slurm_commands.LOGIN_SETUP_FAILED and b"[clusterddp] setup failed" in r.stderr:
            raise SlurmError(f"{self.name}: {r.stderr.decode(errors='replace').strip()[-300:]}",
                             "fix slurm.login.setup")
        return r

    def shared_dir(self, s: SlurmSettings) -> str:
        # asked even for an absolute path: a login host that cannot be reached is found before a run is recorded
        path = s.shared_dir
        r = self._transport().run(slurm_commands.home_command(), timeout=READ_TIMEOUT)
        home = r.text.strip()
        if path.startswith("/"):
            return posixpath.normpath(path)
        if r.exit_code != 0 or not home.startswith("/"):
            raise SlurmError(f"{self.name}: cannot tell the login user's home (for slurm.shared_dir {path})",
                             "give slurm.shared_dir as an absolute path")
        return posixpath.normpath(posixpath.join(home, path[2:] if path.startswith("~/") else
                                                 "" if path == "~" else path))

    def stage(self, run_dir: str, control_dir: str, folder: SourceFolder | None, private: dict[str, str]) -> None:
        _stage(lambda command, tarball: self._transport().run(command, stdin=tarball, timeout=600), self.name,
               run_dir, control_dir, folder, private)

    def read(self, path: str, offset: int, limit: int) -> bytes | None:
        r = self._transport().run(slurm_commands.file_read_command(path, offset, limit), timeout=READ_TIMEOUT)
        return None if r.exit_code == slurm_commands.NO_FILE else r.stdout

    def small_files(self, paths: Sequence[str]) -> dict[str, tuple[str, float]]:
        if not paths:
            return {}
        r = self._transport().run(slurm_commands.small_files_command(paths), timeout=READ_TIMEOUT)
        out = {}
        for line in r.text.splitlines():
            i, _, rest = line.partition(" ")
            mtime, _, text = rest.partition(" ")
            try:
                out[paths[int(i)]] = (text, float(mtime))
            except (ValueError, IndexError):  # not an answer of small_files_command: skipped
                continue
        return out

    @contextmanager
    def open_file(self, path: str) -> Iterator[BinaryIO]:
        # spooled to a private temporary file as it arrives: a log may be far larger than memory
        with tempfile.TemporaryFile() as tmp:
            def write(chunk: bytes) -> None:
                tmp.write(chunk)

            code = self._transport().stream(
                slurm_commands.file_read_command(path, 0, 1 << 62), write, timeout=READ_TIMEOUT, stderr_to=Tail()
            )
            if code == slurm_commands.NO_FILE:
                raise FileNotFoundError(path)
            tmp.seek(0)
            yield cast(BinaryIO, tmp)

    def remove_tree(self, path: str) -> None:
        self._transport().run(slurm_commands.remove_tree_command(path), timeout=READ_TIMEOUT)

    def collect_host(self, run_dir: str) -> tuple[Transport, Host]:
        return self._transport(), replace(self._host, name="shared", workdir=run_dir, gpus=1)

    def close(self) -> None:
        if self._t is not None:
            self._t.close()
            self._t = None


def open_login(login: str | Host | None) -> Login:
    """The login of an inventory (``slurm.login``) or a run record (``slurm.login``; None: this machine).
    Nothing is contacted yet."""
    if login is None or login == LOCAL:
        return LocalLogin()
    assert isinstance(login, Host)
    return SSHLogin(login)
