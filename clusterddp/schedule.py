"""Scheduled runs: one line in the user's crontab per schedule.

Pure part: a frozen :class:`ScheduleSpec` renders to the exact crontab line (:func:`render_line`);
all quoting for that line happens in :func:`_word`, once. Lines are found again by their tag
comment ``# clusterddp:NAME``, and the crontab text is edited line by line (:func:`with_line`,
:func:`without_line`) so every other line stays byte for byte as it was. (python-crontab
re-renders foreign lines: it turned ``'a%b'`` into ``'a %b'`` and commented out lines it could not
parse, so it is not used to write.)

The command of a line, for a schedule ``nightly`` (wrapped here; one line in the crontab)::

    R=/srv/runs C=/venv/bin/clusterddp ; mkdir -p "$R/schedules" && { cd /home/ann/proj &&
      export PATH=/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin &&
      flock -E 75 -n "$R/schedules/nightly.lock" "$C" up /home/ann/inv.yaml /home/ann/proj/train.py
      --runs-dir "$R" --schedule nightly -- --epochs 1 ; rc=$? ;
      [ $rc -ne 75 ] || "$C" schedule _skipped nightly --runs-dir "$R" ; }
      >> "$R/schedules/nightly.log" 2>&1 ; exit $rc # clusterddp:nightly

cron gives a bare environment (``PATH=/usr/bin:/bin``, cwd = home, no ssh-agent), so the line
names everything absolutely and sets PATH itself; the runs folder and the executable are
named once (``$R``, ``$C``) because cron refuses commands over 998 bytes. ``flock -n`` makes a run that would overlap
the previous one exit 75 at once; the line then records the skip through the hidden
``schedule _skipped`` command. Effects (``crontab -l``/``crontab -``, running a line as cron
does) are the functions at the end of this module.
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Iterator

from .errors import ClusterDDPError, UsageError
from .plan import RunSpec, q

NAME_RE = re.compile(r"^[A-Za-z0-9._-]+$")
TAG = "clusterddp:"
SKIP_EXIT = 75  # `flock -E 75`: the previous run still holds the lock (EX_TEMPFAIL)
SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
CRON_PATH = "/usr/bin:/bin"  # what Debian's cron puts on PATH
MAX_COMMAND = 998  # Debian's cron: "command too long" beyond this many bytes after the time fields
KEYWORDS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
_MONTHS = "jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec"
_DAYS = "sun|mon|tue|wed|thu|fri|sat"
# What cron itself accepts per field; croniter knows more (L, #, ?, seconds) that cron would misread.
_FIELD_RES = [re.compile(p, re.IGNORECASE) for p in (
    r"^[0-9*/,-]+$", r"^[0-9*/,-]+$", r"^[0-9*/,-]+$",
    rf"^(?:[0-9*/,-]|{_MONTHS})+$", rf"^(?:[0-9*/,-]|{_DAYS})+$")]
_FIELD_NAMES = ("minute", "hour", "day of month", "month", "day of week")
_TAG_RE = re.compile(r"\s#\s*" + re.escape(TAG) + r"([A-Za-z0-9._-]+)\s*$")
_LINE_RE = re.compile(r"^\s*(@[A-Za-z]+|(?:\S+\s+){4}\S+)\s+(.*)$")
_ENV_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")


# ---- names and expressions ----

def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise UsageError(f"schedule name {name!r}: use letters, digits, '.', '_' or '-'",
                         "it names the crontab tag, the lock and the log file, e.g. nightly-eval")
    return name


def check_cron(expr: str, now: datetime | None = None) -> str:
    """The expression, whitespace normalised, if cron and croniter both accept it and it ever fires."""
    from croniter import croniter

    norm = " ".join(expr.split())
    example = "e.g. --cron '0 2 * * *' (02:00 every day) or --cron @daily"
    if norm.startswith("@"):
        if norm.lower() not in KEYWORDS:
            raise UsageError(f"--cron {expr!r}: unknown or unsupported keyword",
                             f"use five fields or one of {', '.join(KEYWORDS)}")
        norm = norm.lower()
    else:
        fields = norm.split(" ") if norm else []
        if len(fields) != 5:
            raise UsageError(f"--cron {expr!r}: expected 5 fields (minute hour day month weekday), "
                             f"got {len(fields)}", example)
        for f, rx, what in zip(fields, _FIELD_RES, _FIELD_NAMES):
            if not rx.match(f):
                raise UsageError(f"--cron {expr!r}: {what} field {f!r} is not valid for cron", example)
    if not croniter.is_valid(norm):
        raise UsageError(f"--cron {expr!r}: not a valid cron expression", example)
    try:
        next_runs(norm, 1, now)
    except ValueError:  # croniter's CroniterBadDateError
        raise UsageError(f"--cron {expr!r}: never fires (no such date)", example) from None
    return norm


def next_runs(expr: str, n: int = 3, now: datetime | None = None) -> list[datetime]:
    """The next ``n`` times cron starts ``expr``, in local time (cron's clock), after ``now``."""
    from croniter import croniter

    it = croniter(expr, now or datetime.now().astimezone())
    return [it.get_next(datetime) for _ in range(n)]


# ---- the entry ----

@dataclass(frozen=True)
class ScheduleSpec:
    """Everything one crontab line says: when, where, and which `clusterddp up` it runs.

    Paths are absolute: cron starts in the home folder with a bare PATH.
    """

    name: str
    cron: str                        # validated, normalised
    workdir: str                     # where `schedule add` ran; the run starts here
    runs_dir: str
    executable: tuple[str, ...]      # how to call clusterddp: ("/venv/bin/clusterddp",) or (python, "-m", "clusterddp")
    bin_dir: str                     # the environment's bin folder, first on PATH
    inventory: str                   # absolute path, or "local"
    run: RunSpec                     # script absolute
    hosts: tuple[str, ...] = ()
    agent_socket: str | None = None  # SSH_AUTH_SOCK for the run, if the user named one

    @property
    def lock_path(self) -> str:
        return lock_path(self.runs_dir, self.name)

    @property
    def log_path(self) -> str:
        return log_path(self.runs_dir, self.name)


def lock_path(runs_dir: str, name: str) -> str:
    return os.path.join(runs_dir, "schedules", f"{name}.lock")


def log_path(runs_dir: str, name: str) -> str:
    return os.path.join(runs_dir, "schedules", f"{name}.log")


def search_path(bin_dir: str) -> str:
    return ":".join(dict.fromkeys((bin_dir, *SYSTEM_PATH)))


def up_options(spec: ScheduleSpec) -> list[str]:
    """What follows ``up INVENTORY SCRIPT --runs-dir RUNS`` in the entry."""
    r = spec.run
    argv = ["--schedule", spec.name]
    if r.name:
        argv += ["--name", r.name]
    if spec.hosts:
        argv += ["--hosts", ",".join(spec.hosts)]
    if r.gpus is not None:
        argv += ["--gpus", str(r.gpus)]
    if r.master_port is not None:
        argv += ["--master-port", str(r.master_port)]
    for k, v in r.env:
        argv += ["-e", f"{k}={v}"]
    for g in r.collect:
        argv += ["--collect", g]
    if r.max_restarts:
        argv += ["--max-restarts", str(r.max_restarts)]
    if r.script_args:
        argv += ["--", *r.script_args]
    return argv


def up_argv(spec: ScheduleSpec) -> list[str]:
    """The `clusterddp up` command line the entry runs."""
    return [*spec.executable, "up", spec.inventory, spec.run.script, "--runs-dir", spec.runs_dir, *up_options(spec)]


def _word(s: str) -> str:
    """Quote one word for /bin/sh inside a crontab line.

    cron reads an unescaped ``%`` as end of command, and ``\\%`` as ``%``; so every ``%``
    stands outside the quotes, never right after a backslash, and gets its backslash in
    :func:`render_line`. A newline cannot be written into a one-line entry at all.
    """
    if "\n" in s or "\r" in s:
        raise UsageError(f"{s!r}: a crontab entry is one line; it cannot hold a newline",
                         "pass the value without line breaks")
    if not s:
        return q(s)
    return "%".join(q(part) if part else "" for part in s.split("%"))


def _cmd(argv: list[str]) -> str:
    return " ".join(_word(a) for a in argv)


def render_command(spec: ScheduleSpec) -> str:
    """The shell command of the entry, as /bin/sh receives it (before cron's ``%`` escaping).

    The runs folder and the executable are named once, as ``$R`` and ``$C``: cron refuses
    commands longer than :data:`MAX_COMMAND`.
    """
    exports = [f"PATH={_word(search_path(spec.bin_dir))}"]
    if spec.agent_socket:
        exports.append(f"SSH_AUTH_SOCK={_word(spec.agent_socket)}")
    exe, *pre = spec.executable
    c = " ".join(['"$C"', *map(_word, pre)])
    base = f'"$R/schedules/{spec.name}'  # the name is [A-Za-z0-9._-]+: safe inside double quotes
    return (f"R={_word(spec.runs_dir)} C={_word(exe)} ; mkdir -p \"$R/schedules\" && "
            f"{{ cd {_word(spec.workdir)} && export {' '.join(exports)} && "
            f"flock -E {SKIP_EXIT} -n {base}.lock\" {c} up {_cmd([spec.inventory, spec.run.script])} "
            f"--runs-dir \"$R\" {_cmd(up_options(spec))} ; rc=$? ; "
            f"[ $rc -ne {SKIP_EXIT} ] || {c} schedule _skipped {spec.name} --runs-dir \"$R\" ; }} "
            f">> {base}.log\" 2>&1 ; exit $rc")


def render_line(spec: ScheduleSpec) -> str:
    """The whole crontab line: expression, command (``%`` escaped for cron), tag."""
    check_name(spec.name)
    command = f"{render_command(spec).replace('%', chr(92) + '%')} # {TAG}{spec.name}"
    size = len(command.encode())
    if size > MAX_COMMAND:
        raise UsageError(f"the crontab entry for {spec.name!r} would be {size} characters long; "
                         f"cron refuses more than {MAX_COMMAND}",
                         "use shorter paths or fewer script arguments (e.g. read them from a config file)")
    return f"{spec.cron} {command}"


# ---- reading lines back ----

@dataclass(frozen=True)
class Entry:
    """A tagged line found in a crontab."""

    name: str
    cron: str
    command: str          # everything after the time fields, as cron hands it on (tag included)
    index: int            # line number (0-based) in the crontab text
    runs_dir: str | None  # from the line's leading `R=`, None if someone edited it away

    @property
    def log_path(self) -> str | None:
        return log_path(self.runs_dir, self.name) if self.runs_dir else None


def cron_command(command: str) -> tuple[str, str]:
    """Split an entry's command the way cron does: (shell command, standard input).

    ``\\%`` is a literal ``%``; the first bare ``%`` ends the command, and the rest, with
    further ``%`` turned into newlines, is the job's standard input.
    """
    out, escaped = [], False
    for i, ch in enumerate(command):
        if escaped:
            if ch == "%":
                out[-1] = "%"
            else:
                out.append(ch)
            escaped = False
            continue
        if ch == "\\":
            escaped = True
            out.append(ch)
            continue
        if ch == "%":
            return "".join(out), command[i + 1:].replace("%", "\n")
        out.append(ch)
    return "".join(out), ""


def parse_line(line: str, index: int = 0) -> Entry | None:
    """The tagged clusterddp entry on ``line``, or None for any other line."""
    if line.lstrip().startswith("#") or _ENV_RE.match(line):  # a comment, or NAME=value
        return None
    tag = _TAG_RE.search(line)
    m = _LINE_RE.match(line)
    if not tag or not m:
        return None
    runs_dir = None
    try:
        words = shlex.split(cron_command(m.group(2))[0], comments=True)
        if words and words[0].startswith("R="):
            runs_dir = words[0][2:] or None
    except ValueError:
        pass
    return Entry(tag.group(1), " ".join(m.group(1).split()), m.group(2), index, runs_dir)


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
        raise UnknownSchedule(name)
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


class UnknownSchedule(UsageError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no schedule {name!r} in the crontab of {current_user().pw_name}",
                         "list schedules with `clusterddp schedule list`")


# ---- effects: the user's crontab, and running an entry now ----

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


@contextmanager
def editing() -> Iterator[None]:
    """Serialise read-modify-write of the crontab among clusterddp processes of this user."""
    import fcntl

    base = Path(os.environ.get("XDG_RUNTIME_DIR") or Path.home() / ".cache") / "clusterddp"
    base.mkdir(parents=True, exist_ok=True)
    fd = os.open(base / "crontab.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def add(spec: ScheduleSpec, replace: bool = False) -> tuple[str, bool]:
    """Write ``spec``'s line into the user's crontab; return the line and whether it replaced one."""
    line = render_line(spec)
    with editing():
        text = read_crontab()
        write_crontab(with_line(text, spec.name, line, replace))
    return line, find(text, spec.name) is not None


def remove(name: str) -> None:
    with editing():
        write_crontab(without_line(read_crontab(), name))


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
