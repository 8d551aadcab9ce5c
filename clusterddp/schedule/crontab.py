"""The user's crontab: one short line per schedule, tagged ``# clusterddp:NAME``, that fires its spec.

Each line is always of this form (one line in the crontab)::

    0 2 * * * { cd /home/ann/proj && PATH=/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
      /venv/bin/clusterddp schedule fire /srv/runs/schedules/nightly.json ; }
      >> /srv/runs/schedules/nightly.log 2>&1 # clusterddp:nightly

What stays on the line, and why: absolute paths only, because cron starts in the home folder
with ``PATH=/usr/bin:/bin``; ``cd`` to the launch folder and this environment's bin first on
PATH, so ``fire`` starts exactly where and as the run will (``python -m clusterddp`` finds the
same package; ``fire`` sets both again for `up` from the spec, so firing by hand is the same);
and the redirection into ``NAME.log``, so that even an executable or launch folder that has
gone is reported in the log, not in a cron mail nobody reads. ``%`` in those paths is escaped
for cron. Everything else (the `up` options, ``-e`` values) is in the 0600 spec (:mod:`.spec`).

Pure part: rendering (:func:`render_line`; all quoting for the line happens in :func:`_word`,
once), parsing lines, and editing crontab text line by line (:func:`with_line`,
:func:`without_line`) so every other line stays byte for byte as it was. (python-crontab
re-renders foreign lines: it turned ``'a%b'`` into ``'a %b'`` and commented out lines it could
not parse, so it is not used to write.) Effects (``crontab -l``/``crontab -``, the editing lock,
starting an entry as cron would) are the functions at the end of this module.
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ClusterDDPError, UnknownSchedule, UsageError
from ..files import write_private
from ..nodescript import q
from .cron import cron_command
from .fire import lock_within, open_lock
from .spec import ScheduleSpec, check_name, log_path, save_spec, search_path

TAG = "clusterddp:"
LOCK_DEADLINE = 60.0  # seconds to wait for the crontab lock; a holder does `crontab -l` and `crontab -`
CRON_PATH = "/usr/bin:/bin"  # what Debian's cron puts on PATH
MAX_COMMAND = 998  # Debian's cron: "command too long" beyond this many bytes after the time fields
_TAG_RE = re.compile(r"\s#\s*" + re.escape(TAG) + r"([A-Za-z0-9._-]+)\s*$")
_LINE_RE = re.compile(r"^\s*(@[A-Za-z]+|(?:\S+\s+){4}\S+)\s+(.*)$")
_ENV_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")


# ---- the crontab line ----

def _word(s: str) -> str:
    """Quote one word for /bin/sh inside a crontab line.

    cron reads an unescaped ``%`` as end of command, and ``\\%`` as ``%``; so every ``%``
    stands outside the quotes, never right after a backslash, and gets its backslash in
    :func:`render_line`. A newline cannot be written into a one-line entry at all.
    """
    if "\n" in s or "\r" in s:
        raise UsageError(f"{s!r}: a crontab entry is one line; it cannot hold a newline",
                         "use a path without line breaks")
    if not s:
        return q(s)
    return "%".join(q(part) if part else "" for part in s.split("%"))


def render_command(spec: ScheduleSpec) -> str:
    """The shell command of the line, as /bin/sh receives it (before cron's ``%`` escaping)."""
    exe = " ".join(_word(a) for a in spec.executable)
    return (f"{{ cd {_word(spec.launch_dir)} && PATH={_word(search_path(spec.bin_dir))} {exe} schedule fire "
            f"{_word(spec.spec_path)} ; }} >> {_word(spec.log_path)} 2>&1")


def render_line(spec: ScheduleSpec) -> str:
    """The whole crontab line: expression, command (``%`` escaped for cron), tag."""
    check_name(spec.name)
    command = f"{render_command(spec).replace('%', chr(92) + '%')} # {TAG}{spec.name}"
    size = len(command.encode())
    if size > MAX_COMMAND:
        raise UsageError(f"the crontab entry for {spec.name!r} would be {size} characters long; "
                         f"cron refuses more than {MAX_COMMAND}",
                         "use shorter paths (the launch folder, --runs-dir, this environment's folder)")
    return f"{spec.cron} {command}"


@dataclass(frozen=True)
class Entry:
    """A tagged line found in a crontab."""

    name: str
    cron: str
    command: str                  # everything after the time fields, as cron hands it on (tag included)
    index: int                    # line number (0-based) in the crontab text
    runs_dir: str | None          # from the spec path; None if not a line we wrote
    spec_path: str | None = None  # the file `schedule fire` reads; None for a line we did not write
    words: tuple[tuple[str, str], ...] = field(default=(), repr=False, compare=False)  # (raw, word) pairs

    @property
    def log_path(self) -> str | None:
        return log_path(self.runs_dir, self.name) if self.runs_dir else None


# A shell word as _word writes it: bare characters and '...' / "..." quoted parts, unspaced.
_RAW_WORD = re.compile(r"""(?:[^\s'"\\]|'[^']*'|"[^"]*")+""")


def _shell_words(command: str) -> tuple[tuple[str, str], ...] | None:
    """The words of a command line we rendered, each as (raw text, the word the shell sees);
    None when it has anything :func:`_word` never writes (a backslash outside quotes, unpaired quotes)."""
    if len(command) > 8 * MAX_COMMAND:  # never ours (cron runs at most MAX_COMMAND bytes); shlex is quadratic in
        return None                     # a word's length: a 256 KiB one took minutes
    out, pos = [], 0
    for m in _RAW_WORD.finditer(command):
        if command[pos:m.start()].strip():
            return None
        raw = m.group(0)
        try:
            (word,) = shlex.split(raw)
        except ValueError:
            return None
        out.append((raw, word))
        pos = m.end()
    return tuple(out) if not command[pos:].strip() else None


def parse_line(line: str, index: int = 0) -> Entry | None:
    """The tagged clusterddp entry on ``line``, or None for any other line."""
    if line.lstrip().startswith("#") or _ENV_RE.match(line):  # a comment, or NAME=value
        return None
    tag = _TAG_RE.search(line)
    m = _LINE_RE.match(line)
    if not tag or not m:
        return None
    words = _shell_words(cron_command(line[m.start(2):tag.start()])[0]) or ()
    spec = _fire_spec_path(words)
    runs_dir = os.path.dirname(os.path.dirname(spec)) if spec else None
    return Entry(tag.group(1), " ".join(m.group(1).split()), m.group(2), index, runs_dir, spec, words)


class _Words:
    """A cursor over a line's (raw, word) pairs that expects the exact raw text we render."""

    class Mismatch(Exception):
        pass

    def __init__(self, words: tuple[tuple[str, str], ...]) -> None:
        self.words, self.i = words, 0

    def peek(self) -> str | None:
        return self.words[self.i][0] if self.i < len(self.words) else None

    def word(self) -> str:
        if self.i >= len(self.words):
            raise self.Mismatch
        self.i += 1
        return self.words[self.i - 1][1]

    def raw(self, *expected: str) -> None:
        for e in expected:
            if self.peek() != e:
                raise self.Mismatch
            self.i += 1

    def assign(self, var: str) -> str:
        raw = self.peek()
        if raw is None or not raw.startswith(var + "="):
            raise self.Mismatch
        return self.word()[len(var) + 1:]

    def until(self, stop: str) -> list[str]:
        out = []
        while self.peek() != stop:
            out.append(self.word())
        return out

    def end(self) -> None:
        if self.i != len(self.words):
            raise self.Mismatch


def _fire_spec_path(words: tuple[tuple[str, str], ...]) -> str | None:
    """The spec path of a line in today's form (see the module docstring), else None."""
    w = _Words(words)
    try:
        w.raw("{", "cd")
        w.word()
        w.raw("&&")
        w.assign("PATH")
        w.word()
        w.until("schedule")
        w.raw("schedule", "fire")
        spec = w.word()
        w.raw(";", "}", ">>")
        w.word()
        w.raw("2>&1")
        w.end()
    except _Words.Mismatch:
        return None
    return spec if os.path.isabs(spec) else None


def _lines(text: str) -> list[str]:
    """The crontab's lines as cron sees them: split at "\\n" only (str.splitlines would also
    split a foreign line at \\r, \\f and friends, and rewriting it would change it)."""
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def entries(text: str) -> list[Entry]:
    """Every clusterddp entry of a crontab, in order."""
    found = (parse_line(line, i) for i, line in enumerate(_lines(text)))
    return [e for e in found if e is not None]


def find(text: str, name: str) -> Entry | None:
    return next((e for e in entries(text) if e.name == name), None)


def with_line(text: str, name: str, line: str, replace: bool = False) -> str:
    """``text`` with the entry ``name`` set to ``line``: replaced in place with ``replace``,
    else appended; every other line is kept exactly. Raises UsageError if it exists and not ``replace``."""
    lines = _lines(text)
    old = [e.index for e in entries(text) if e.name == name]
    if old and not replace:
        raise UsageError(f"schedule {name!r} already exists",
                         "pass --replace to overwrite it, or choose another name")
    if old:
        lines[old[0]] = line
        lines = [x for i, x in enumerate(lines) if i not in old[1:]]
    else:
        lines.append(line)
    return "\n".join(lines) + "\n"


def without_line(text: str, name: str) -> str:
    """``text`` without the entry ``name`` (UsageError if there is none); other lines kept exactly."""
    old = {e.index for e in entries(text) if e.name == name}
    if not old:
        raise UnknownSchedule(name, current_user().pw_name)
    lines = [x for i, x in enumerate(_lines(text)) if i not in old]
    return "\n".join(lines) + "\n" if lines else ""


def cron_environment(text: str, entry: Entry, user: pwd.struct_passwd) -> dict[str, str]:
    """The environment cron gives ``entry``: its own few variables, then the crontab's
    ``NAME=value`` lines above the entry (cron applies each to the entries after it)."""
    env = {"HOME": user.pw_dir, "LOGNAME": user.pw_name, "SHELL": "/bin/sh", "PATH": CRON_PATH}
    for line in _lines(text)[:entry.index]:
        m = _ENV_RE.match(line)
        if m and not line.lstrip().startswith("#"):
            value = m.group(2)
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            env[m.group(1)] = value
    return env


@contextmanager
def editing(deadline: float = LOCK_DEADLINE) -> Iterator[None]:
    """Serialise read-modify-write of the crontab (and the specs it names) among clusterddp
    processes of this user, waiting at most ``deadline`` seconds for another one."""
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or Path.home() / ".cache") / "clusterddp"
    base.mkdir(parents=True, exist_ok=True)
    path = str(base / "crontab.lock")
    fd = open_lock(path)
    try:
        lock_within(fd, path, deadline, "another clusterddp is editing your crontab")
        yield
    finally:
        os.close(fd)


def _restore(path: str, data: bytes | None) -> None:
    """Put a file back as it was (``None``: it did not exist)."""
    if data is None:
        Path(path).unlink(missing_ok=True)
    else:
        write_private(path, data)


def _read_or_none(path: str) -> bytes | None:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        return None


# ---- effects: the user's crontab ----

def current_user() -> pwd.struct_passwd:
    return pwd.getpwuid(os.getuid())


def _crontab(args: list[str], text: str | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["crontab", *args], input=text, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise ClusterDDPError("`crontab` not found: scheduled runs use the system cron",
                              "install it (Debian/Ubuntu: apt-get install cron) and start the cron service") from None


def read_crontab() -> str:
    """The user's crontab text ('' when there is none)."""
    r = _crontab(["-l"])
    if r.returncode != 0:
        if "no crontab for" in r.stderr:
            return ""
        raise ClusterDDPError(f"crontab -l failed: {r.stderr.strip()}")
    return r.stdout


def write_crontab(text: str) -> None:
    r = _crontab(["-"], text)
    if r.returncode != 0:
        raise ClusterDDPError(f"crontab refused the new table: {r.stderr.strip()}",
                              "your crontab was left as it was")


@dataclass(frozen=True)
class Edit:
    """What an edit of the crontab did, for the CLI to tell."""

    text: str               # the crontab after the edit
    replaced: bool = False


def _commit(before: str, text: str, specs: list[ScheduleSpec]) -> None:
    """Write ``specs``, then ``text`` as the crontab; if cron refuses it, put the spec files back."""
    saved = [(s.spec_path, _read_or_none(s.spec_path)) for s in specs]
    try:
        for s in specs:
            save_spec(s)
        if text != before:
            write_crontab(text)
    except BaseException:
        for path, data in saved:
            try:
                _restore(path, data)
            except OSError:
                pass
        raise


def add(spec: ScheduleSpec, replace: bool = False) -> Edit:
    """Write ``spec``'s file and line."""
    line = render_line(spec)
    with editing():
        text = read_crontab()
        old = find(text, spec.name)
        new = with_line(text, spec.name, line, replace)  # refuses before anything is written
        _commit(text, new, [spec])
    if old and old.spec_path and old.spec_path != spec.spec_path:  # replaced by one in another runs folder
        Path(old.spec_path).unlink(missing_ok=True)
    return Edit(new, replaced=old is not None)


def remove(name: str) -> Entry:
    """Remove the line of schedule ``name``, then its spec file; return the line's entry."""
    with editing():
        text = read_crontab()
        entry = find(text, name)
        write_crontab(without_line(text, name))
        if entry and entry.spec_path:
            Path(entry.spec_path).unlink(missing_ok=True)
    assert entry is not None  # without_line raised otherwise
    return entry


# ---- effects: running ----

def current_executable() -> tuple[tuple[str, ...], str]:
    """How this environment calls clusterddp, and its bin folder (put first on the entry's PATH).

    The bin folder is not resolved: a virtualenv's python is a link out of it.
    """
    bin_dir = os.path.dirname(os.path.abspath(sys.executable))
    exe = os.path.join(bin_dir, "clusterddp")
    if os.path.isfile(exe) and os.access(exe, os.X_OK):
        return (exe,), bin_dir
    return (os.path.abspath(sys.executable), "-m", "clusterddp"), bin_dir


def cron_daemon_running() -> bool:
    """Whether a cron daemon runs on this machine (as far as this process can see)."""
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip() in ("cron", "crond"):
                return True
        except OSError:
            pass
    return False


def start(text: str, entry: Entry) -> subprocess.Popen:
    """Start ``entry`` of crontab ``text`` now, exactly as cron would: its command through cron's
    ``%`` rules, run by ``$SHELL -c`` with cron's environment only, in the home folder.
    Its output outside the entry's own log goes to our stdout (cron would mail it)."""
    env = cron_environment(text, entry, current_user())
    command, stdin = cron_command(entry.command)
    try:
        proc = subprocess.Popen([env["SHELL"], "-c", command], env=env, cwd=env["HOME"], stdin=subprocess.PIPE)
    except OSError as e:
        raise ClusterDDPError(f"cannot start schedule {entry.name!r} as cron would: {e}") from None
    assert proc.stdin is not None
    try:
        proc.stdin.write(stdin.encode())
        proc.stdin.close()
    except BrokenPipeError:
        pass
    return proc

