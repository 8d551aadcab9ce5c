"""Scheduled runs: a spec file per schedule, and one short line in the user's crontab that fires it.

A schedule is two things:

* its spec, ``<runs-dir>/schedules/NAME.json`` (mode 0600, folder 0700, written atomically): a
  frozen :class:`ScheduleSpec` with a schema version: the cron expression, the launch folder,
  the inventory and script (absolute), the `up` options, the ``-e`` values, the script's
  arguments, this environment's bin folder and executable, the agent socket;
* one crontab line, tagged ``# clusterddp:NAME``, always of this form (one line in the crontab)::

    0 2 * * * { cd /home/ann/proj && PATH=/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
      /venv/bin/clusterddp schedule fire /srv/runs/schedules/nightly.json ; }
      >> /srv/runs/schedules/nightly.log 2>&1 # clusterddp:nightly

Why the values are not on the line (before spec files, the line carried the whole `up` command):
``-e`` values are often secrets, and a crontab line is printed by ``crontab -l`` and copied into
backups and cron's mails; a 0600 file is not. Every value on a line needs two layers of quoting
(the shell's, then cron's ``%``), cannot hold a newline and counts against cron's 998-byte limit;
JSON carries any value as it is. And the shell's lock logic (``flock -E 75 -n`` then
``|| schedule _skipped``) was code nothing could test but a golden string: ``schedule fire`` does
it in Python (:func:`load_spec`, :func:`try_lock`, :func:`start_up`). (The `up` it starts still
takes the values as arguments, as a typed `up` does.)

What stays on the line, and why: absolute paths only, because cron starts in the home folder
with ``PATH=/usr/bin:/bin``; ``cd`` to the launch folder and this environment's bin first on
PATH, so ``fire`` starts exactly where and as the run will (``python -m clusterddp`` finds the
same package; ``fire`` sets both again for `up` from the spec, so firing by hand is the same);
and the redirection into ``NAME.log``, so that even an executable or launch folder that has
gone is reported in the log, not in a cron mail nobody reads. ``%`` in those paths is still
escaped for cron.

Lines written before spec files (the long form) are read back by :func:`legacy_spec` and
rewritten by :func:`migration` (``schedule list``, ``add`` and ``run`` do it).

Pure part: rendering (:func:`render_line`; all quoting for the line happens in :func:`_word`,
once), the spec's JSON (:meth:`ScheduleSpec.to_json`, :func:`spec_from_json`), parsing lines,
and editing crontab text line by line (:func:`with_line`, :func:`without_line`) so every other
line stays byte for byte as it was. (python-crontab re-renders foreign lines: it turned
``'a%b'`` into ``'a %b'`` and commented out lines it could not parse, so it is not used to
write.) Effects (``crontab -l``/``crontab -``, spec files, locks, starting a run) are the
functions at the end of this module.
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import re
import shlex
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from . import envfile
from .errors import ClusterDDPError, LockTimeout, SpecError, UnknownSchedule, UsageError
from .plan import RunSpec, q

NAME_RE = re.compile(r"[A-Za-z0-9._-]+")  # used with fullmatch: "$" would accept a trailing newline
TAG = "clusterddp:"
SKIP_EXIT = 75  # the previous run still holds the lock (EX_TEMPFAIL; `flock -E 75` before spec files)
SPEC_SCHEMA = 1
LOCK_DEADLINE = 60.0  # seconds to wait for the crontab lock; a holder does `crontab -l` and `crontab -`
SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
CRON_PATH = "/usr/bin:/bin"  # what Debian's cron puts on PATH
MAX_COMMAND = 998  # Debian's cron: "command too long" beyond this many bytes after the time fields
MAX_SPEC_BYTES = 1 << 20
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
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # as inventory.ENV_NAME_RE (not imported: fire stays light)


# ---- names and expressions ----

def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name):
        raise UsageError(f"schedule name {name!r}: use letters, digits, '.', '_' or '-'",
                         "it names the crontab tag, the spec, the lock and the log file, e.g. nightly-eval")
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
        for f, rx, what in zip(fields, _FIELD_RES, _FIELD_NAMES, strict=True):  # 5 fields: checked above
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


# ---- the spec ----

@dataclass(frozen=True)
class ScheduleSpec:
    """Everything a schedule says: when, from where, and which `clusterddp up` it runs.

    Paths are absolute: cron starts in the home folder with a bare PATH.
    """

    name: str
    cron: str                        # validated, normalised; the crontab line's copy is the one cron obeys
    launch_dir: str                  # where `schedule add` ran; the run starts here
    runs_dir: str
    executable: tuple[str, ...]      # how to call clusterddp: ("/venv/bin/clusterddp",) or (python, "-m", "clusterddp")
    bin_dir: str                     # the environment's bin folder, first on PATH
    inventory: str                   # absolute path, or "local"
    run: RunSpec                     # script absolute
    hosts: tuple[str, ...] = ()
    agent_socket: str | None = None  # SSH_AUTH_SOCK for the run, if the user named one
    wait: bool = False               # `up --wait`: wait in the GPU lease queue rather than give up (exit 75)

    @property
    def spec_path(self) -> str:
        return spec_path(self.runs_dir, self.name)

    @property
    def lock_path(self) -> str:
        return lock_path(self.runs_dir, self.name)

    @property
    def log_path(self) -> str:
        return log_path(self.runs_dir, self.name)

    def to_json(self) -> dict[str, Any]:
        """The spec file's content (read back by :func:`spec_from_json`)."""
        r = self.run
        return {
            "schema_version": SPEC_SCHEMA, "name": self.name, "cron": self.cron, "launch_dir": self.launch_dir,
            "runs_dir": self.runs_dir, "bin_dir": self.bin_dir, "executable": list(self.executable),
            "inventory": self.inventory, "script": r.script, "script_args": list(r.script_args),
            "env": [[k, v] for k, v in r.env], "run_name": r.name, "hosts": list(self.hosts), "gpus": r.gpus,
            "master_port": r.master_port, "collect": list(r.collect), "max_restarts": r.max_restarts,
            "agent_socket": self.agent_socket, **({"wait": True} if self.wait else {}),
            # optional: written only when set, so a spec without it reads as before
            **({"local_rank_arg": r.local_rank_arg} if r.local_rank_arg else {}),
        }


def schedules_dir(runs_dir: str) -> str:
    return os.path.join(runs_dir, "schedules")


def spec_path(runs_dir: str, name: str) -> str:
    return os.path.join(runs_dir, "schedules", f"{name}.json")


def lock_path(runs_dir: str, name: str) -> str:
    return os.path.join(runs_dir, "schedules", f"{name}.lock")


def log_path(runs_dir: str, name: str) -> str:
    return os.path.join(runs_dir, "schedules", f"{name}.log")


class _Fields:
    """Typed reads of the spec's fields, each failure located by file and field."""

    def __init__(self, path: str, data: dict[str, Any]) -> None:
        self.path, self.data = path, data

    def fail(self, label: str, problem: str) -> SpecError:
        return SpecError(self.path, label, problem)

    def check(self, label: str, v: Any, absolute: bool = False, optional: bool = False) -> Any:
        """``v`` (the value of ``label``) if it is a string fit for argv: no NUL, absolute if asked."""
        if v is None and optional:
            return None
        if not isinstance(v, str):
            raise self.fail(label, f"expected a string, got {_kind(v)}")
        if "\0" in v:
            raise self.fail(label, "contains a NUL character")
        if absolute and not os.path.isabs(v):
            raise self.fail(label, f"{v!r} is not an absolute path")
        return v

    def text(self, name: str, absolute: bool = False, optional: bool = False) -> Any:
        return self.check(name, self.data[name], absolute, optional)

    def texts(self, name: str) -> tuple[str, ...]:
        v = self.data[name]
        if not isinstance(v, list):
            raise self.fail(name, f"expected a list of strings, got {_kind(v)}")
        return tuple(self.check(f"{name}[{i}]", x) for i, x in enumerate(v))

    def integer(self, name: str, low: int, high: int | None = None, optional: bool = False) -> int | None:
        v = self.data[name]
        if v is None and optional:
            return None
        if type(v) is not int:  # isinstance would let true and false through
            raise self.fail(name, f"expected a whole number, got {_kind(v)}")
        if v < low or (high is not None and v > high):
            raise self.fail(name, f"{v} is out of range ({low}..{'' if high is None else high})")
        return v


def _kind(v: Any) -> str:
    return "nothing" if v is None else f"{type(v).__name__} {json.dumps(v)[:40]}"


_SPEC_FIELDS = ("schema_version", "name", "cron", "launch_dir", "runs_dir", "bin_dir", "executable", "inventory",
                "script", "script_args", "env", "run_name", "hosts", "gpus", "master_port", "collect",
                "max_restarts", "agent_socket")
_OPTIONAL_SPEC_FIELDS = ("local_rank_arg", "wait")  # added later: specs written before them lack them


def spec_from_json(data: Any, path: str) -> ScheduleSpec:
    """The spec in ``data``, read from the file ``path``; :class:`SpecError` names the first bad field.

    A spec names what runs as its user, so nothing in it is taken on trust: every field has its
    type and range, the name must match the file's, and the file must lie in its runs folder.
    """
    if not isinstance(data, dict):
        raise SpecError(path, None, f"expected a JSON object, got {_kind(data)}")
    f = _Fields(path, data)
    version = data.get("schema_version")
    if version != SPEC_SCHEMA:
        raise SpecError(path, "schema_version", f"{version!r} is not a version this clusterddp reads "
                        f"({SPEC_SCHEMA})", "a newer clusterddp wrote it: run the schedule with that one, or "
                        "rewrite it with this one (`clusterddp schedule add ... --replace`)")
    for key in data:
        if key not in _SPEC_FIELDS and key not in _OPTIONAL_SPEC_FIELDS:
            raise f.fail(key, "unknown field")
    wait = data.get("wait", False)
    if type(wait) is not bool:
        raise f.fail("wait", f"expected true or false, got {_kind(wait)}")
    for key in _SPEC_FIELDS:
        if key not in data:
            raise f.fail(key, "missing")
    name = f.text("name")
    if not NAME_RE.fullmatch(name):
        raise f.fail("name", f"{name!r} is not a schedule name (letters, digits, '.', '_', '-')")
    if os.path.basename(path) != f"{name}.json":
        raise f.fail("name", f"{name!r} does not match the file name {os.path.basename(path)}")
    runs_dir = f.text("runs_dir", absolute=True)
    here = os.path.dirname(os.path.abspath(path))
    if os.path.normpath(schedules_dir(runs_dir)) != os.path.normpath(here):
        raise f.fail("runs_dir", f"{runs_dir!r}, but the file lies in {here}")
    executable = f.texts("executable")
    if not executable:
        raise f.fail("executable", "empty")
    f.check("executable[0]", executable[0], absolute=True)
    inventory = f.text("inventory")
    if inventory != "local":
        f.text("inventory", absolute=True)
    env = []
    pairs = data["env"]
    if not isinstance(pairs, list):
        raise f.fail("env", f"expected a list of [NAME, VALUE] pairs, got {_kind(pairs)}")
    for i, pair in enumerate(pairs):
        if not (isinstance(pair, list) and len(pair) == 2):
            raise f.fail(f"env[{i}]", f"expected [NAME, VALUE], got {_kind(pair)}")
        k, v = f.check(f"env[{i}][0]", pair[0]), f.check(f"env[{i}][1]", pair[1])
        if not _ENV_NAME_RE.fullmatch(k):
            raise f.fail(f"env[{i}][0]", f"{k!r} is not a variable name")
        env.append((k, v))
    hosts = f.texts("hosts")
    for i, h in enumerate(hosts):
        if not h or "," in h:
            raise f.fail(f"hosts[{i}]", f"{h!r} is not a host name")
    run = RunSpec(script=f.text("script", absolute=True), script_args=f.texts("script_args"),
                  name=f.text("run_name", optional=True), gpus=f.integer("gpus", 1, optional=True),
                  master_port=f.integer("master_port", 1, 65535, optional=True), env=tuple(env),
                  collect=f.texts("collect"), max_restarts=f.integer("max_restarts", 0) or 0,
                  local_rank_arg=_local_rank_arg(f))
    return ScheduleSpec(name=name, cron=f.text("cron"), launch_dir=f.text("launch_dir", absolute=True),
                        runs_dir=runs_dir, executable=executable, bin_dir=f.text("bin_dir", absolute=True),
                        inventory=inventory, run=run, hosts=hosts,
                        agent_socket=f.text("agent_socket", absolute=True, optional=True), wait=wait)


def _local_rank_arg(f: _Fields) -> str | None:
    """The optional ``local_rank_arg`` field: absent or null, ``--local_rank`` or ``--local-rank``."""
    if f.data.get("local_rank_arg") is None:
        return None
    flag = f.text("local_rank_arg")
    if flag not in ("--local_rank", "--local-rank"):
        raise f.fail("local_rank_arg", f"{flag!r} is not --local_rank or --local-rank")
    return flag


def search_path(bin_dir: str) -> str:
    return ":".join(dict.fromkeys((bin_dir, *SYSTEM_PATH)))


def up_options(spec: ScheduleSpec, env_file: str | None = None) -> list[str]:
    """What follows ``up INVENTORY SCRIPT --runs-dir RUNS`` when the schedule fires.

    The env's values never go on the command line (every user sees it in ``ps``): ``up`` reads
    them from ``env_file`` (``-e @FILE``), which :func:`start_up` fills with :func:`clusterddp.envfile.render`."""
    r = spec.run
    if r.env and env_file is None:
        raise ValueError("a schedule with env values needs the file that carries them")
    argv = ["--schedule", spec.name]
    if r.name:
        argv += ["--name", r.name]
    if spec.hosts:
        argv += ["--hosts", ",".join(spec.hosts)]
    if r.gpus is not None:
        argv += ["--gpus", str(r.gpus)]
    if r.master_port is not None:
        argv += ["--master-port", str(r.master_port)]
    if r.env:
        argv += ["-e", f"@{env_file}"]
    for g in r.collect:
        argv += ["--collect", g]
    if r.max_restarts:
        argv += ["--max-restarts", str(r.max_restarts)]
    if r.local_rank_arg:
        argv += [f"--local-rank-arg={r.local_rank_arg}"]
    if spec.wait:
        argv += ["--wait"]
    if r.script_args:
        argv += ["--", *r.script_args]
    return argv


def up_argv(spec: ScheduleSpec, env_file: str | None = None) -> list[str]:
    """The `clusterddp up` command line the schedule runs."""
    return [*spec.executable, "up", spec.inventory, spec.run.script, "--runs-dir", spec.runs_dir,
            *up_options(spec, env_file)]


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


# ---- reading lines back ----

@dataclass(frozen=True)
class Entry:
    """A tagged line found in a crontab."""

    name: str
    cron: str
    command: str                  # everything after the time fields, as cron hands it on (tag included)
    index: int                    # line number (0-based) in the crontab text
    runs_dir: str | None          # from the spec path, or a long-form line's `R=`; None if not ours
    spec_path: str | None = None  # the file `schedule fire` reads; None for a long-form or foreign line
    words: tuple[tuple[str, str], ...] = field(default=(), repr=False, compare=False)  # (raw, word) pairs

    @property
    def log_path(self) -> str | None:
        return log_path(self.runs_dir, self.name) if self.runs_dir else None


def cron_command(command: str) -> tuple[str, str]:
    """Split an entry's command the way cron does: (shell command, standard input).

    ``\\%`` is a literal ``%``; the first bare ``%`` ends the command, and the rest, with
    further ``%`` turned into newlines, is the job's standard input.
    """
    out: list[str] = []
    escaped = False
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
    runs_dir = None
    if spec:
        runs_dir = os.path.dirname(os.path.dirname(spec))
    elif words and words[0][1].startswith("R="):
        runs_dir = words[0][1][2:] or None
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


def legacy_spec(entry: Entry) -> ScheduleSpec | None:
    """The spec of a line in the long form written before spec files, or None for any other line.

    That form ran (one line; the runs folder and the executable named once as ``$R``/``$C``)::

        R=RUNS C=EXE ; mkdir -p "$R/schedules" && { cd DIR && export PATH=P [SSH_AUTH_SOCK=S] &&
          flock -E 75 -n "$R/schedules/N.lock" "$C" [-m clusterddp] up INV SCRIPT --runs-dir "$R" OPTIONS
          ; rc=$? ; [ $rc -ne 75 ] || "$C" [-m clusterddp] schedule _skipped N --runs-dir "$R" ; }
          >> "$R/schedules/N.log" 2>&1 ; exit $rc # clusterddp:N

    Only that exact skeleton is read (each operator compared as written, so a quoted ``';'`` in
    a value is a value); anything else, such as a line edited by hand, is left alone.
    """
    name, w = entry.name, _Words(entry.words)
    try:
        runs_dir = w.assign("R")
        exe = w.assign("C")
        w.raw(";", "mkdir", "-p", '"$R/schedules"', "&&", "{", "cd")
        launch_dir = w.word()
        w.raw("&&", "export")
        path = w.assign("PATH")
        sock = w.assign("SSH_AUTH_SOCK") if (w.peek() or "").startswith("SSH_AUTH_SOCK=") else None
        w.raw("&&", "flock", "-E", "75", "-n", f'"$R/schedules/{name}.lock"', '"$C"')
        pre_at = w.i
        pre = w.until("up")
        pre_raw = [raw for raw, _ in entry.words[pre_at:w.i]]
        w.raw("up")
        inventory, script = w.word(), w.word()
        w.raw("--runs-dir", '"$R"')
        options = w.until(";")
        w.raw(";", "rc=$?", ";", "[", "$rc", "-ne", "75", "]", "||", '"$C"', *pre_raw, "schedule", "_skipped",
              name, "--runs-dir", '"$R"', ";", "}", ">>", f'"$R/schedules/{name}.log"', "2>&1", ";", "exit", "$rc")
        w.end()
        bin_dir = path.split(":")[0]
        if path != search_path(bin_dir):
            return None
        opts = _legacy_options(options, name)
    except (_Words.Mismatch, ValueError, IndexError):
        return None
    run = RunSpec(script=script, script_args=opts["args"], name=opts.get("--name"),
                  gpus=int(opts["--gpus"]) if "--gpus" in opts else None,
                  master_port=int(opts["--master-port"]) if "--master-port" in opts else None,
                  env=opts["-e"], collect=opts["--collect"], max_restarts=int(opts.get("--max-restarts", 0)))
    return ScheduleSpec(name=name, cron=entry.cron, launch_dir=launch_dir, runs_dir=runs_dir,
                        executable=(exe, *pre), bin_dir=bin_dir, inventory=inventory, run=run,
                        hosts=tuple(opts["--hosts"].split(",")) if "--hosts" in opts else (), agent_socket=sock)


def _legacy_options(words: list[str], name: str) -> dict[str, Any]:
    """The `up` options of a long-form line, as :func:`up_options` wrote them."""
    if words[:2] != ["--schedule", name]:
        raise ValueError("not our options")
    out: dict[str, Any] = {"-e": (), "--collect": (), "args": ()}
    i = 2
    while i < len(words):
        flag = words[i]
        if flag == "--":
            out["args"] = tuple(words[i + 1:])
            break
        value = words[i + 1]
        if flag == "-e":
            k, sep, v = value.partition("=")
            if not sep or not _ENV_NAME_RE.fullmatch(k):
                raise ValueError(value)
            out["-e"] += ((k, v),)
        elif flag == "--collect":
            out["--collect"] += (value,)
        elif flag in ("--name", "--hosts", "--gpus", "--master-port", "--max-restarts") and flag not in out:
            out[flag] = value
        else:
            raise ValueError(flag)
        i += 2
    return out


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


@dataclass(frozen=True)
class Migration:
    """What rewriting a crontab's long-form lines does: the new text, the specs to write first,
    and the tagged lines left as they are (neither form: edited by hand, or too long to rewrite)."""

    text: str
    specs: tuple[ScheduleSpec, ...]
    left: tuple[str, ...]


def migration(text: str, skip: str | None = None) -> Migration:
    """Plan the rewrite of every long-form line of ``text`` (but ``skip``) to today's form."""
    specs, left, seen = [], [], {skip}
    for e in entries(text):
        if e.spec_path or e.name in seen:  # a name twice: with_line below keeps only the first line
            continue
        seen.add(e.name)
        spec = legacy_spec(e)
        try:
            line = render_line(spec) if spec else None
        except UsageError:
            line = None
        if spec is None or line is None:
            left.append(e.name)
            continue
        text = with_line(text, e.name, line, replace=True)
        specs.append(spec)
    return Migration(text, tuple(specs), tuple(left))


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


# ---- effects: locks ----

def lock_holder(path: str) -> tuple[int, str] | None:
    """Who holds the lock file ``path``, from the pid its holder wrote into it (see :func:`lock_within`):
    the pid and "pid N (its command line)", or None if that is unknown or the process is gone."""
    try:
        pid = int(Path(path).read_text().split()[0])
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except (OSError, ValueError, IndexError):
        return None
    return pid, f"pid {pid} ({cmd[:120]})"


def _open_lock(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def _mark_held(fd: int) -> None:
    """Write our pid into a lock file we hold, for :func:`lock_holder`."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


def lock_within(fd: int, path: str, deadline: float, what: str) -> None:
    """Take the exclusive lock on ``fd`` (the file ``path``), waiting at most ``deadline`` seconds.

    ``fcntl.flock`` without LOCK_NB would wait forever behind a hung holder; this polls instead,
    and past the deadline raises :class:`LockTimeout` naming the file and its holder.
    """
    import fcntl

    end = time.monotonic() + deadline
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _mark_held(fd)
            return
        except BlockingIOError:
            if time.monotonic() >= end:
                holder = lock_holder(path)
                raise LockTimeout(f"{what}: {path} is still locked after {deadline:g}s, "
                                  f"by {holder[1] if holder else 'a process that did not say'}",
                                  "wait for it to finish; if it hangs, end it"
                                  f"{f' (kill {holder[0]})' if holder else ''} and try again") from None
        time.sleep(0.05)


def try_lock(spec: ScheduleSpec) -> int | None:
    """The schedule's lock, taken without waiting: its file descriptor, or None when the
    previous run still holds it. Pass the descriptor on to the run (:func:`start_up`): the lock
    lasts as long as the run does, even if the process that took it dies first."""
    import fcntl

    try:
        fd = _open_lock(spec.lock_path)
    except OSError as e:
        raise ClusterDDPError(f"schedule {spec.name}: cannot open its lock {spec.lock_path}: {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    _mark_held(fd)
    return fd


@contextmanager
def editing(deadline: float = LOCK_DEADLINE) -> Iterator[None]:
    """Serialise read-modify-write of the crontab (and the specs it names) among clusterddp
    processes of this user, waiting at most ``deadline`` seconds for another one."""
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or Path.home() / ".cache") / "clusterddp"
    base.mkdir(parents=True, exist_ok=True)
    path = str(base / "crontab.lock")
    fd = _open_lock(path)
    try:
        lock_within(fd, path, deadline, "another clusterddp is editing your crontab")
        yield
    finally:
        os.close(fd)


# ---- effects: spec files ----

def load_spec(path: str) -> ScheduleSpec:
    """Read and check the spec file ``path`` (:class:`SpecError` on anything wrong with it).

    The file must be a plain file of this user that no one else may write: it says what runs as them.
    """
    try:  # O_NONBLOCK: a FIFO put in its place must not hang the run
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise SpecError(path, None, "no such file", "the schedule's spec is gone: add the schedule again, "
                        "or remove it (clusterddp schedule remove NAME)") from None
    except OSError as e:
        raise SpecError(path, None, "is a symbolic link; a spec is a plain file" if e.errno == errno.ELOOP
                        else f"cannot open it: {e.strerror}") from None
    st = os.fstat(fd)
    problem = ("not a plain file" if not stat.S_ISREG(st.st_mode)
               else f"owned by uid {st.st_uid}, not by you (uid {os.getuid()}); it names what runs as you"
               if st.st_uid != os.getuid()
               else f"mode {stat.S_IMODE(st.st_mode):04o}: others may write it, and it names what runs as you"
               if st.st_mode & 0o022 else None)
    if problem:
        os.close(fd)
        raise SpecError(path, None, problem, "check who changed it; `clusterddp schedule add ... --replace` "
                        "writes it anew (mode 0600)")
    with os.fdopen(fd, "rb") as f:
        raw = f.read(MAX_SPEC_BYTES + 1)
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError(path, None, f"larger than {MAX_SPEC_BYTES} bytes")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise SpecError(path, None, f"not valid JSON ({e})") from None
    return spec_from_json(data, path)


def save_spec(spec: ScheduleSpec) -> None:
    """Write ``spec`` to its file, mode 0600 in a 0700 folder, atomically (a temporary file
    renamed over it), so cron never reads half a spec."""
    folder = schedules_dir(spec.runs_dir)
    # JSON's \\u escapes keep any str, even the lone surrogates that stand for non-UTF-8 bytes of argv.
    data = (json.dumps(spec.to_json(), indent=2, ensure_ascii=True) + "\n").encode()
    tmp = None
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        os.chmod(folder, 0o700)  # older versions made it with the umask; it holds the specs and logs
        fd, tmp = tempfile.mkstemp(prefix=f".{spec.name}.", suffix=".tmp", dir=folder)  # mode 0600
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, spec.spec_path)
        tmp = None
    except OSError as e:
        raise ClusterDDPError(f"cannot write the spec of schedule {spec.name!r} to {spec.spec_path}: {e.strerror}",
                              "check that you may write the runs folder (--runs-dir)") from None
    finally:
        if tmp:
            os.unlink(tmp)


def _restore(path: str, data: bytes | None) -> None:
    """Put a file back as it was (``None``: it did not exist)."""
    if data is None:
        Path(path).unlink(missing_ok=True)
    else:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path))
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)


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

    text: str                                # the crontab after the edit
    migrated: tuple[ScheduleSpec, ...] = ()  # long-form lines rewritten, their specs written
    left: tuple[str, ...] = ()               # tagged lines in neither form, left as they are
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


def migrate() -> Edit:
    """Rewrite the long-form lines of the user's crontab to today's form (their specs first)."""
    with editing():
        text = read_crontab()
        plan = migration(text)
        if plan.specs:
            _commit(text, plan.text, list(plan.specs))
    return Edit(plan.text, plan.specs, plan.left)


def add(spec: ScheduleSpec, replace: bool = False) -> Edit:
    """Write ``spec``'s file and line (migrating long-form lines on the way)."""
    line = render_line(spec)
    with editing():
        text = read_crontab()
        plan = migration(text, skip=spec.name)
        old = find(text, spec.name)
        new = with_line(plan.text, spec.name, line, replace)  # refuses before anything is written
        _commit(text, new, [*plan.specs, spec])
    if old and old.spec_path and old.spec_path != spec.spec_path:  # replaced by one in another runs folder
        Path(old.spec_path).unlink(missing_ok=True)
    return Edit(new, plan.specs, plan.left, replaced=old is not None)


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


def start_up(spec: ScheduleSpec, lock_fd: int) -> subprocess.Popen:
    """Start the schedule's `clusterddp up` as the long-form line did: in the launch folder, with
    this environment's bin first on PATH and the agent socket, output to ours, holding the lock."""
    env = {**os.environ, "PATH": search_path(spec.bin_dir)}
    if spec.agent_socket:
        env["SSH_AUTH_SOCK"] = spec.agent_socket
    fds = [lock_fd]
    env_file = None
    if spec.run.env:  # the values go through a memory-only file this process hands on, never argv
        fd = os.memfd_create(f"clusterddp-{spec.name}-env", 0)  # not CLOEXEC: only up gets it (pass_fds)
        os.write(fd, envfile.render(spec.run.env))
        fds.append(fd)
        env_file = f"/dev/fd/{fd}"
    argv = up_argv(spec, env_file)
    try:
        return subprocess.Popen(argv, cwd=spec.launch_dir, env=env, pass_fds=tuple(fds))
    except OSError as e:
        where = f"launch_dir {spec.launch_dir}" if not os.path.isdir(spec.launch_dir) else argv[0]
        raise ClusterDDPError(f"schedule {spec.name}: cannot start `clusterddp up`: {where}: {e.strerror}",
                              f"its spec is {spec.spec_path}; add the schedule again from a folder that "
                              "exists, with this environment's clusterddp") from None
    finally:
        for fd in fds[1:]:
            os.close(fd)


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
