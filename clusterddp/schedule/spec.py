"""A schedule's spec: ``<runs-dir>/schedules/NAME.json``, what a schedule runs, read back as untrusted.

The frozen :class:`ScheduleSpec` with a schema version (:meth:`ScheduleSpec.to_json`,
:func:`spec_from_json`), its file (0600 in a 0700 folder, written atomically: :func:`save_spec`;
read back refusing anything another user could have written: :func:`load_spec`), and the
`clusterddp up` command line it stands for (:func:`up_argv`).
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from typing import Any

from .. import jsonread, launch
from ..errors import ClusterDDPError, FileRefused, SpecError, UsageError
from ..files import make_folders, read_bounded, write_private
from ..runspec import RunSpec

NAME_RE = re.compile(r"[A-Za-z0-9._-]+")  # used with fullmatch: "$" would accept a trailing newline
SPEC_SCHEMA = 1
SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
MAX_SPEC_BYTES = 1 << 20
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # as inventory.ENV_NAME_RE (not imported: fire stays light)


def is_name(name: str) -> bool:
    """Whether ``name`` may name a schedule: letters, digits, '.', '_', '-', and not ``.`` or ``..``
    (it names files: NAME.json, NAME.lock, NAME.log)."""
    return bool(NAME_RE.fullmatch(name)) and name not in (".", "..")


def check_name(name: str) -> str:
    if not is_name(name):
        raise UsageError(f"schedule name {name!r}: use letters, digits, '.', '_' or '-'",
                         "it names the crontab tag, the spec, the lock and the log file, e.g. nightly-eval")
    return name


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
    up: tuple[tuple[str, Any], ...] = ()  # every other `up` option set (launch.RECORDED): (name, value), in order

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
            **({"up": {k: list(v) if isinstance(v, tuple) else v for k, v in self.up}} if self.up else {}),
        }


def schedules_dir(runs_dir: str) -> str:
    return os.path.join(runs_dir, "schedules")


def spec_path(runs_dir: str, name: str) -> str:
    return os.path.join(runs_dir, "schedules", f"{name}.json")


def lock_path(runs_dir: str, name: str) -> str:
    return os.path.join(runs_dir, "schedules", f"{name}.lock")


def log_path(runs_dir: str, name: str) -> str:
    return os.path.join(runs_dir, "schedules", f"{name}.log")


def _kind(v: Any) -> str:
    return "nothing" if v is None else f"{type(v).__name__} {json.dumps(v)[:40]}"


class _SpecStyle(jsonread.Style):
    """A spec's words (as they were before :mod:`clusterddp.jsonread`): ``expected a string, got int 3``."""

    def kind(self, value: Any) -> str:
        return _kind(value)

    def wrong(self, tp: Any, value: Any) -> str:
        return f"expected {self.describe(tp)}, got {_kind(value)}"

    def not_object(self, value: Any) -> str:
        return f"expected a JSON object, got {_kind(value)}"

    def unsafe(self, char: str, at: int) -> str:
        return "contains a NUL character"


# Only NUL: lone surrogates stand for argv's non-UTF-8 bytes, which a spec keeps (JSON's \\u escapes)
_STYLE = _SpecStyle(missing="missing", names={int: "a whole number"}, unsafe_chars=re.compile("\x00"))


class _Fields(jsonread.Fields):
    """Typed reads of the spec's fields (:class:`clusterddp.jsonread.Fields`), each failure located by
    file and field."""

    def __init__(self, path: str, data: Any) -> None:
        self.path = path
        super().__init__(data, "", lambda field, problem: SpecError(path, field, problem), _STYLE)

    def check(self, label: str, v: Any, absolute: bool = False, optional: bool = False) -> Any:
        """``v`` (the value of ``label``) if it is a string fit for argv: no NUL, absolute if asked."""
        v = self.typed(label, v, str | None if optional else str)
        if absolute and v is not None and not os.path.isabs(v):
            raise self.fail(label, f"{v!r} is not an absolute path")
        return v

    def text(self, name: str, absolute: bool = False, optional: bool = False) -> Any:
        return self.check(name, self.data[name], absolute, optional)

    def texts(self, name: str) -> tuple[str, ...]:
        v = self.data[name]
        if not isinstance(v, list):
            raise self.fail(name, self.style.wrong(tuple[str, ...], v))
        return tuple(self.check(f"{name}[{i}]", x) for i, x in enumerate(v))

    def integer(self, name: str, low: int, high: int | None = None, optional: bool = False) -> int | None:
        v = self.get(name, int | None if optional else int)
        if v is not None and (v < low or (high is not None and v > high)):
            raise self.fail(name, f"{v} is out of range ({low}..{'' if high is None else high})")
        return v


_SPEC_FIELDS = ("schema_version", "name", "cron", "launch_dir", "runs_dir", "bin_dir", "executable", "inventory",
                "script", "script_args", "env", "run_name", "hosts", "gpus", "master_port", "collect",
                "max_restarts", "agent_socket")
_OPTIONAL_SPEC_FIELDS = ("local_rank_arg", "wait", "up")  # added later: specs written before them lack them


def spec_from_json(data: Any, path: str) -> ScheduleSpec:
    """The spec in ``data``, read from the file ``path``; :class:`SpecError` names the first bad field.

    A spec names what runs as its user, so nothing in it is taken on trust: every field has its
    type and range, the name must match the file's, and the file must lie in its runs folder.
    """
    f = _Fields(path, data)  # a SpecError unless data is an object
    version = data.get("schema_version")
    if version != SPEC_SCHEMA:
        raise SpecError(path, "schema_version", f"{version!r} is not a version this clusterddp reads "
                        f"({SPEC_SCHEMA})", "a newer clusterddp wrote it: run the schedule with that one, or "
                        "rewrite it with this one (`clusterddp schedule add ... --replace`)")
    for key in data:
        if key not in _SPEC_FIELDS and key not in _OPTIONAL_SPEC_FIELDS:
            raise f.fail(key, "unknown field")
    wait = f.get("wait", bool, default=False)
    for key in _SPEC_FIELDS:
        if key not in data:
            raise f.fail(key, "missing")
    name = f.text("name")
    if not is_name(name):
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
                        agent_socket=f.text("agent_socket", absolute=True, optional=True), wait=wait,
                        up=_up_options(f))


def _up_options(f: _Fields) -> tuple[tuple[str, Any], ...]:
    """The optional ``up`` object: `up` options by name (:data:`clusterddp.launch.RECORDED`), each checked."""
    given = f.data.get("up", {})
    if not isinstance(given, dict):
        raise f.fail("up", f"expected an object of `up` options, got {_kind(given)}")
    out = []
    for name, v in given.items():
        o = launch.BY_NAME.get(name)
        if o is None or o.recorded != launch.UP:
            raise f.fail(f"up.{name}" if isinstance(name, str) and name.isidentifier() else "up",
                         f"{name!r} is not an `up` option a schedule records")
        problem = o.check(v)
        if problem:
            raise f.fail(f"up.{name}", f"{problem}, got {_kind(v)}")
        out.append((name, tuple(v) if isinstance(v, list) else v))
    return tuple(out)


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
    for name, v in spec.up:
        argv += launch.BY_NAME[name].argv(v)
    if r.script_args:
        argv += ["--", *r.script_args]
    return argv


def up_argv(spec: ScheduleSpec, env_file: str | None = None) -> list[str]:
    """The `clusterddp up` command line the schedule runs."""
    return [*spec.executable, "up", spec.inventory, spec.run.script, "--runs-dir", spec.runs_dir,
            *up_options(spec, env_file)]


def load_spec(path: str) -> ScheduleSpec:
    """Read and check the spec file ``path`` (:class:`SpecError` on anything wrong with it).

    The file must be a plain file of this user that no one else may write: it says what runs as them.
    """
    try:  # non-blocking, regular files only, bounded: a FIFO put in its place must not hang the run
        raw, st = read_bounded(path, MAX_SPEC_BYTES, nofollow=True)
    except FileRefused as e:
        if e.reason == "missing":
            raise SpecError(path, None, "no such file", "the schedule's spec is gone: add the schedule again, "
                            "or remove it (clusterddp schedule remove NAME)") from None
        problem = {"symlink": "is a symbolic link; a spec is a plain file", "not_regular": "not a plain file",
                   "too_large": f"larger than {MAX_SPEC_BYTES} bytes"}.get(e.reason, e.problem)
        raise SpecError(path, None, problem, None if e.reason == "too_large" else
                        "check who changed it; `clusterddp schedule add ... --replace` writes it anew (mode 0600)"
                        ) from None
    unsafe = (f"owned by uid {st.st_uid}, not by you (uid {os.getuid()}); it names what runs as you"
              if st.st_uid != os.getuid()
              else f"mode {stat.S_IMODE(st.st_mode):04o}: others may write it, and it names what runs as you"
              if st.st_mode & 0o022 else None)
    if unsafe:
        raise SpecError(path, None, unsafe, "check who changed it; `clusterddp schedule add ... --replace` "
                        "writes it anew (mode 0600)")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise SpecError(path, None, f"not valid JSON ({e})") from None
    except RecursionError:  # nesting deeper than Python's parser recurses
        raise SpecError(path, None, "not a schedule spec: nested too deeply") from None
    return spec_from_json(data, path)


def save_spec(spec: ScheduleSpec) -> None:
    """Write ``spec`` to its file, mode 0600 in a 0700 folder, atomically (a temporary file
    renamed over it), so cron never reads half a spec."""
    folder = schedules_dir(spec.runs_dir)
    # JSON's \\u escapes keep any str, even the lone surrogates that stand for non-UTF-8 bytes of argv.
    data = (json.dumps(spec.to_json(), indent=2, ensure_ascii=True) + "\n").encode()
    try:
        make_folders(folder)  # the runs folder too, and any above it that it makes: 0700, as the store makes them
        os.chmod(folder, 0o700)  # older versions made it with the umask; it holds the specs and logs
        write_private(spec.spec_path, data)
    except OSError as e:
        raise ClusterDDPError(f"cannot write the spec of schedule {spec.name!r} to {spec.spec_path}: {e.strerror}",
                              "check that you may write the runs folder (--runs-dir)") from None
