"""Where a `slurm:` inventory's Slurm commands run and its shared folder is read: the login host.

``login: local`` is this machine (:class:`LocalLogin`: subprocess and local files); a host entry is
a login host reached over SSH (:class:`SSHLogin`: the commands :mod:`clusterddp.plan` renders, run
through :mod:`clusterddp.transport`). :mod:`clusterddp.slurm`, ``slurm_control`` and
``slurm_check`` talk to Slurm and the shared folder only through a :class:`Login`.

The SSH connection opens on first use (``--dry-run`` contacts nothing) and is kept for the run.
An unreachable login host, or a refused host key, is the transport's HostError naming it.
"""

from __future__ import annotations

import io
import os
import posixpath
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Protocol, cast

from . import plan as P
from .errors import SlurmError, UsageError
from .inventory import LOCAL, Host, SlurmSettings
from .transport.base import CommandResult, Tail, Transport

if TYPE_CHECKING:
    from .jobs import SourceFolder

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
        ctl = Path(control_dir)
        try:
            if ctl.exists():
                raise UsageError(f"{run_dir} already holds a run", "use another run id")
            ctl.mkdir(parents=True, mode=0o700)
            ctl.chmod(0o700)
            (ctl / "nodes").mkdir(mode=0o700)
            for rel, _ in folder.entries if folder else ():
                assert folder is not None
                src, dst = folder.root / rel.rstrip("/"), Path(run_dir) / rel.rstrip("/")
                if rel.endswith("/"):
                    dst.mkdir(exist_ok=True)
                elif src.is_symlink():  # sent as a link, never followed, as the SSH upload does
                    dst.symlink_to(os.readlink(src))
                else:
                    shutil.copy2(src, dst)
            for name, text in private.items():
                fd = os.open(ctl / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(text)
        except OSError as e:
            raise UsageError(f"cannot stage the run in {run_dir}: {e}",
                             "slurm.shared_dir must be a folder this machine can write") from None

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
        from .transport.local import LocalTransport
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
            from .transport import connect
            self._t = connect(self._host)
        return self._t

    def run(self, args: Sequence[str], timeout: float = COMMAND_TIMEOUT) -> CommandResult:
        cmd = P.login_command(self._host, args)
        r = self._transport().run(cmd.text, stdin=cmd.stdin, timeout=timeout)
        if r.exit_code == 127 and b"not found" in r.stderr:
            raise _not_found(f"the login host {self.name}", args)
        if r.exit_code == P.LOGIN_SETUP_FAILED and b"[clusterddp] setup failed" in r.stderr:
            raise SlurmError(f"{self.name}: {r.stderr.decode(errors='replace').strip()[-300:]}",
                             "fix slurm.login.setup")
        return r

    def shared_dir(self, s: SlurmSettings) -> str:
        # asked even for an absolute path: a login host that cannot be reached is found before a run is recorded
        path = s.shared_dir
        r = self._transport().run(P.home_command(), timeout=READ_TIMEOUT)
        home = r.text.strip()
        if path.startswith("/"):
            return posixpath.normpath(path)
        if r.exit_code != 0 or not home.startswith("/"):
            raise SlurmError(f"{self.name}: cannot tell the login user's home (for slurm.shared_dir {path})",
                             "give slurm.shared_dir as an absolute path")
        return posixpath.normpath(posixpath.join(home, path[2:] if path.startswith("~/") else
                                                 "" if path == "~" else path))

    def stage(self, run_dir: str, control_dir: str, folder: SourceFolder | None, private: dict[str, str]) -> None:
        # One stream: a gzip tar (in a 0600 temporary file, sent in chunks) of the script's folder and the
        # private files, unpacked by one command; the env values in node.sh never touch a command line.
        fd, name = tempfile.mkstemp(prefix="clusterddp-stage-", suffix=".tar.gz")
        try:
            with os.fdopen(fd, "wb") as f, tarfile.open(fileobj=f, mode="w:gz", compresslevel=1) as tar:
                for rel, _ in folder.entries if folder else ():
                    assert folder is not None
                    tar.add(folder.root / rel.rstrip("/"), arcname=rel.rstrip("/"), recursive=False)
                ctl = posixpath.relpath(control_dir, run_dir)
                for fname, text in private.items():
                    data = text.encode()
                    info = tarfile.TarInfo(f"{ctl}/{fname}")
                    info.size, info.mode = len(data), 0o600
                    tar.addfile(info, io.BytesIO(data))
            r = self._transport().run(P.slurm_stage_command(run_dir, control_dir), stdin=Path(name),
                                      timeout=600)
        except OSError as e:
            raise UsageError(f"cannot pack the script's folder: {e}",
                             "make every file there readable, or move the script to a folder of its own") from None
        finally:
            os.unlink(name)
        if r.exit_code == P.NO_FILE:
            raise UsageError(f"{run_dir} on {self.name} already holds a run", "use another run id")
        if r.exit_code != 0:
            said = r.stderr.decode(errors="replace").strip()[-300:]
            raise UsageError(f"cannot stage the run in {run_dir} on {self.name}: {said or f'exit {r.exit_code}'}",
                             "slurm.shared_dir must be a folder the login user can write")

    def read(self, path: str, offset: int, limit: int) -> bytes | None:
        r = self._transport().run(P.file_read_command(path, offset, limit), timeout=READ_TIMEOUT)
        return None if r.exit_code == P.NO_FILE else r.stdout

    def small_files(self, paths: Sequence[str]) -> dict[str, tuple[str, float]]:
        if not paths:
            return {}
        r = self._transport().run(P.small_files_command(paths), timeout=READ_TIMEOUT)
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
            code = self._transport().stream(P.file_read_command(path, 0, 1 << 62), write, timeout=READ_TIMEOUT,
                                            stderr_to=Tail())
            if code == P.NO_FILE:
                raise FileNotFoundError(path)
            tmp.seek(0)
            yield cast(BinaryIO, tmp)

    def remove_tree(self, path: str) -> None:
        self._transport().run(P.remove_tree_command(path), timeout=READ_TIMEOUT)

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
