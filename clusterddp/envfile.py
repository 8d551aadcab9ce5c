"""Env values given to a run: ``-e`` flags and the ``NAME=VALUE`` file format of ``-e @FILE``.

One module reads and writes that format: the CLI reads what a user (or ``schedule fire``, through
a memfd) hands it, and :func:`render` writes what :func:`read` reads back, for any text value.
Nothing here prints; a file readable by others is reported through ``warn``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable

from .errors import FileRefused, UsageError
from .files import read_bounded
from .inventory import ENV_NAME_RE, reserved_env, show

MAX_FILE = 1 << 20
Env = tuple[tuple[str, str], ...]


def parse(flags: Iterable[str], warn: Callable[[str], None]) -> Env:
    """``-e`` flags as pairs: a valid name that clusterddp does not set itself, with its value.

    ``-e NAME=VALUE`` gives the value on the command line, where every user of this machine can
    read it (``ps``); ``-e NAME`` takes it from the launcher's environment and ``-e @FILE`` reads
    ``NAME=VALUE`` lines from a file (:func:`read`), so secrets need not be on it.
    """
    out: list[tuple[str, str]] = []
    for p in flags:
        if p.startswith("@"):
            out += read(p[1:], warn)
            continue
        k, sep, v = p.partition("=")
        if not ENV_NAME_RE.fullmatch(k):
            raise UsageError(f"-e/--env {show(p)}: expected NAME=VALUE, NAME or @FILE, with a valid variable name "
                             "(letters, digits and _, not starting with a digit)", "e.g. -e NCCL_DEBUG=INFO")
        if not sep:
            if k not in os.environ:
                raise UsageError(f"-e/--env {k}: not set in this environment (-e NAME passes this shell's value on)",
                                 f"export {k}=... first, or give -e {k}=VALUE or -e @FILE")
            v = os.environ[k]
        out.append(_pair(k, v, f"-e/--env {k}"))
    return tuple(out)


def read(path: str, warn: Callable[[str], None]) -> list[tuple[str, str]]:
    """``NAME=VALUE`` lines of ``path``: blank lines and ``#`` comments skipped, an ``export``
    before the name allowed; the value is the rest of the line, verbatim, or, when it starts with
    a double quote, a JSON string (to carry newlines or leading spaces)."""
    try:  # non-blocking, regular files only, bounded: a FIFO or a device named here is refused, not waited on
        data, st = read_bounded(path, MAX_FILE)
    except FileRefused as e:
        if e.reason == "too_large":
            raise UsageError(f"-e @{path}: larger than {MAX_FILE >> 20} MiB", "an env file holds NAME=VALUE lines"
                             ) from None
        raise UsageError(f"-e @{path}: cannot read it: {e.problem}", "give a regular file of NAME=VALUE lines"
                         ) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"-e @{path}: not UTF-8 text (byte {e.start})", "save it as UTF-8") from None
    if st.st_mode & 0o077 and not path.startswith(("/dev/fd/", "/proc/")):
        warn(f"warning: -e @{path} is readable by other users (mode {st.st_mode & 0o777:04o}); "
             f"chmod 600 {path} keeps its secrets yours")
    out = []
    for n, line in enumerate(text.split("\n"), 1):
        where = f"{path}:{n}"
        body = line.rstrip("\r").lstrip()
        if not body or body.startswith("#"):
            continue
        if body.startswith("export "):
            body = body[len("export "):].lstrip()
        k, sep, v = body.partition("=")
        if not sep or not ENV_NAME_RE.fullmatch(k):
            raise UsageError(f"{where}: expected NAME=VALUE, got {show(line[:80])}",
                             "one NAME=VALUE per line; # starts a comment line")
        if v.startswith('"'):
            try:
                v = json.loads(v)
                assert isinstance(v, str)
            except (ValueError, AssertionError):
                raise UsageError(f"{where}: {k}'s value starts with a double quote but is not one JSON string",
                                 'write it as a JSON string ("a\\nb") or without the leading quote') from None
        out.append(_pair(k, v, f"{where}: {k}"))
    return out


def render(env: Env) -> bytes:
    """The env as :func:`read` reads it back: every value a JSON string, so any text survives."""
    return "".join(f"{k}={json.dumps(v)}\n" for k, v in env).encode()


def _pair(k: str, v: str, where: str) -> tuple[str, str]:
    why = reserved_env(k)
    if why:
        raise UsageError(f"{where}: reserved", why)
    if not _utf8(v) or "\0" in v:
        raise UsageError(f"{where}: the value is not UTF-8 text (or holds NUL)", "pass it as UTF-8 text")
    return k, v


def _utf8(text: str) -> bool:
    """False for undecodable bytes in an argument (Python keeps them as lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
