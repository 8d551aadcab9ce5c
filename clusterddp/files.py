"""The file habits every writer and reader of local files shares, each written once.

- :func:`replacing` / :func:`write_private`: an atomic private write: a temp file of its own
  (unique name, 0600 whatever the umask) beside the target, fsynced, renamed over it; readers see
  the old file or the new one, never half, and writers at once each leave a whole one.
- :func:`try_lock` / :func:`lock_polled`: an exclusive ``flock`` taken without waiting, or polled
  to a deadline (``flock`` itself waits for ever behind a hung holder).
- :func:`read_bounded`: a user-named or on-disk file read as untrusted: opened non-blocking (a FIFO
  in its place must not hang us), regular files only (a FIFO, a device such as ``/dev/zero``, a
  folder refused with a message naming the path), at most ``limit`` bytes.
- :func:`make_folders`: a folder and every missing parent, each one it makes 0700 whatever the umask.

Nothing here prints; failures are :class:`~clusterddp.errors.FileRefused` (reads) or OSError
(writes), which each caller turns into its own located error.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, BinaryIO

from .errors import FileRefused

FILE_MODE, DIR_MODE = 0o600, 0o700


def make_private(f: int | str, st: os.stat_result | None = None) -> None:
    """Make an open file (or a path) ours-only (0600), when it is ours; the umask may have left it
    looser or (0o277) unwritable. Files of another user are left alone."""
    st = st or (os.fstat(f) if isinstance(f, int) else os.stat(f))
    if stat.S_IMODE(st.st_mode) == FILE_MODE or st.st_uid != os.geteuid():
        return
    try:
        os.fchmod(f, FILE_MODE) if isinstance(f, int) else os.chmod(f, FILE_MODE)
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EROFS):
            raise


@contextmanager
def replacing(path: str | Path, fsync: bool = True) -> Iterator[BinaryIO]:
    """A temp file of its own (0600, a unique name) beside ``path``, fsynced and renamed over it
    when the block ends without an exception, removed otherwise (the old file stays).

    ``fsync=False`` for files that can be rebuilt (the run store's records and log copies: its
    index is rebuilt from them, and a log copy fetched again), where a sync per write costs more
    than a lost last write."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            make_private(f.fileno())
            yield f
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def make_folders(path: str | Path) -> None:
    """Make ``path`` and each missing folder above it, every one it makes 0700 whatever the umask
    (``os.makedirs`` gives the parents it makes the umask's mode, 0755 as a rule). Folders that are
    there already are left as they are; raises OSError."""
    path = Path(os.path.abspath(path))
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=DIR_MODE)
        except FileExistsError:  # another process made it at the same moment: its mode is its own
            continue
        os.chmod(folder, DIR_MODE)  # mkdir's mode is cut by the umask


def write_private(path: str | Path, data: bytes, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` atomically, 0600 (see :func:`replacing`)."""
    with replacing(path, fsync) as f:
        f.write(data)


def try_lock(f: int | IO) -> bool:
    """Take the exclusive flock on ``f`` (a descriptor or file) if it is free now; never waits."""
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def lock_polled(f: int | IO, deadline: float, timed_out: Callable[[], Exception]) -> None:
    """Take the exclusive flock on ``f`` before ``deadline`` (a ``time.monotonic()`` time), polling;
    past it, raise ``timed_out()`` (an error naming the file and, where known, its holder)."""
    pause = 0.01
    while not try_lock(f):
        left = deadline - time.monotonic()
        if left <= 0:
            raise timed_out() from None
        time.sleep(min(pause, left))
        pause = min(pause * 2, 0.2)


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_bounded(path: str | Path, limit: int, nofollow: bool = False) -> tuple[bytes, os.stat_result]:
    """The bytes of the regular file ``path`` (at most ``limit``) and its stat, read without blocking.

    Raises :class:`FileRefused` (its ``reason``: ``missing``, ``symlink`` with ``nofollow``,
    ``unreadable``, ``not_regular`` or ``too_large``), never hangs on a FIFO and never reads more
    than ``limit + 1`` bytes (``/dev/zero`` is refused before any read)."""
    p = str(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_NOFOLLOW if nofollow else 0)
    try:
        fd = os.open(p, flags)
    except (FileNotFoundError, NotADirectoryError):
        raise FileRefused(p, "missing", "no such file") from None
    except OSError as e:
        if nofollow and e.errno == errno.ELOOP:
            raise FileRefused(p, "symlink", "is a symbolic link, not a regular file") from None
        raise FileRefused(p, "unreadable", f"cannot be read: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(p, "not_regular", f"is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > limit:  # known before reading: no need to read the first limit bytes
            raise FileRefused(p, "too_large", f"{st.st_size:,} bytes, more than the {limit:,} allowed")
        chunks, size = [], 0
        while size <= limit:  # a file growing while read: stop past the limit all the same
            try:
                chunk = os.read(fd, limit + 1 - size)
            except OSError as e:
                raise FileRefused(p, "unreadable", f"cannot be read: {e.strerror or e}") from None
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise FileRefused(p, "too_large", f"more than the {limit:,} bytes allowed")
        return b"".join(chunks), st
    finally:
        os.close(fd)
