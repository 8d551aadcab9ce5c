"""The inventory's YAML schema (pydantic), private to :mod:`clusterddp.inventory`.

Kept apart so that importing the inventory module (for `up local`, `--help`, a run record)
does not import pydantic; :func:`clusterddp.inventory.parse` loads it when a file is read.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from .model import (
    ENV_NAME_RE,
    HOST_NAME_RE,
    LOCAL,
    MAX_GPUS,
    NOTIFY_EVENTS,
    control_problem,
    glob_problem,
    notify_command_problem,
    show,
    webhook_problem,
)


def _one_line(v: str) -> str:
    """One-line text (setup lines and env values may hold control characters; the rest may not)."""
    problem = control_problem(v)
    if problem:
        raise ValueError(problem)
    return v


def _glob(v: str) -> str:
    problem = glob_problem(v)
    if problem:
        raise ValueError(problem)
    return v


Line = Annotated[str, AfterValidator(_one_line)]
Glob = Annotated[str, AfterValidator(_glob)]


def _progress_regex(v: str) -> str:
    """`progress_regex:` as `--progress-regex` takes it: a regular expression, at most one group."""
    try:
        rx = re.compile(v)
    except re.error as e:
        raise ValueError(f"not a regular expression ({e}); e.g. 'step (\\d+)'") from None
    if rx.groups > 1:
        raise ValueError(f"{rx.groups} groups; give at most one, around the step number (use (?:...) for the others)")
    return v


def _stall_timeout(v: Any) -> Any:
    if v is not None and not isinstance(v, bool) and v < 1:
        raise ValueError("must be at least 1 second (leave it out for no stall watchdog)")
    return _seconds(v, 7 * 86400)


_AGE = re.compile(r"(?:\s*[0-9]{1,9}\s*[smhd])+\s*", re.ASCII)
_AGE_PART = re.compile(r"([0-9]{1,9})\s*([smhd])", re.ASCII)
QUARANTINE_MOST_S = 30 * 86400.0


def quarantine_seconds(v: Any) -> float:
    """`quarantine:` as seconds: an age (``2h``, ``90m``, ``1d``, ``1h30m``) or a number of seconds, from a
    minute to 30 days. Raises ValueError saying what it takes."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ValueError("must be an age such as 2h, 90m or 1d (or a number of seconds)")
    if isinstance(v, str):
        if not _AGE.fullmatch(v):
            raise ValueError(f"{v[:40]!r} is not an age: give one such as 2h, 90m or 1d")
        v = sum(int(n) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[u] for n, u in _AGE_PART.findall(v))
    if not math.isfinite(v) or not 60 <= v <= QUARANTINE_MOST_S:
        raise ValueError("must be from 1m to 30d")
    return float(v)


Quarantine = Annotated[Any, AfterValidator(lambda v: None if v is None else quarantine_seconds(v))]
ProgressRegex = Annotated[str, AfterValidator(_one_line), AfterValidator(_progress_regex)]
StallTimeout = Annotated[float | int | None, AfterValidator(_stall_timeout)]


def _seconds(v: Any, most: float) -> Any:
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"must be a number of seconds, not {v}")
    if v > most:
        raise ValueError(f"must be at most {most:g} seconds")
    return v


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    user: Line | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    identity_file: Line | None = None
    known_hosts: Line | None = None
    host_key_policy: Literal["strict", "accept-new"] | None = None
    gpus: int | str | list[Any] | None = None  # a list is checked by _gpus
    python: Line | None = None
    workdir: Line | None = None
    env: dict[str, Any] | None = None
    setup: list[str] | None = None
    connect_timeout: float | int | None = Field(default=None, gt=0)
    keepalive: float | int | None = Field(default=None, ge=0)
    lease_dir: Line | None = None

    @field_validator("connect_timeout")
    @classmethod
    def _connect_timeout(cls, v: Any) -> Any:
        return _seconds(v, 3600)

    @field_validator("keepalive")
    @classmethod
    def _keepalive(cls, v: Any) -> Any:
        return _seconds(v, 3600)

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: Any) -> Any:
        if v is None or v == "auto":
            return v
        if isinstance(v, list):  # a fixed choice of GPUs (slots), e.g. [0, 1]
            if not v or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < MAX_GPUS for i in v):
                raise ValueError("a list of GPUs must hold GPU indices 0..1023, e.g. [0, 1]")
            if len(set(v)) != len(v):
                raise ValueError("lists a GPU twice")
            return v
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError("must be a whole number of processes (>= 1) or 'auto'")
        if v < 1:
            raise ValueError("must be >= 1 (processes per node) or 'auto'")
        if v > MAX_GPUS:
            raise ValueError(f"must be at most {MAX_GPUS} (processes per node), as --gpus, or 'auto'")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, Any] | None) -> dict[str, str] | None:
        return _env_values(v)


def _env_values(v: dict[str, Any] | None) -> dict[str, str] | None:
    if v is None:
        return v
    out = {}
    for k, val in v.items():
        if not isinstance(k, str) or not ENV_NAME_RE.fullmatch(k):
            raise ValueError(f"{show(str(k))} is not a valid environment variable name "
                             "(letters, digits and _, not starting with a digit)")
        if isinstance(val, (list, dict)) or val is None:
            raise ValueError(f"{k}: value must be a string or a whole number, not "
                             f"{'empty' if val is None else 'a list' if isinstance(val, list) else 'a mapping'}")
        if isinstance(val, bool) or not isinstance(val, (str, int)):
            raise ValueError(f"{k}: value must be a string or a whole number; quote it, e.g. {k}: \"{val}\"")
        out[k] = str(val)
    return out


class _HostEntry(_Settings):
    name: str
    address: Line | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not HOST_NAME_RE.fullmatch(v) or v == LOCAL:
            raise ValueError("must be 1 to 128 letters, digits, '.', '_' or '-' (it names a log file), "
                             "and not 'local'")
        return v


class _MasterEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    host: Line | None = None
    addr: Line | None = None
    port: int | None = Field(default=None, ge=1, le=65535)  # None: chosen free on the master, from 29500


def _checked(problem: Any) -> Any:
    def check(v: str) -> str:
        said = problem(v)
        if said:
            raise ValueError(said)
        return v
    return AfterValidator(check)


class _NotifyEntry(BaseModel):
    """One `notify:` target: exactly one of webhook, webhook_file, command."""

    model_config = ConfigDict(extra="forbid", strict=True)
    webhook: Annotated[str, _checked(webhook_problem)] | None = None
    webhook_file: Line | None = None
    command: Annotated[str, _checked(notify_command_problem)] | None = None
    on: list[str] | None = None
    timeout: float | int = Field(default=10, gt=0, le=120)

    @field_validator("on")
    @classmethod
    def _on(cls, v: list[str] | None) -> list[str] | None:
        for e in v or ():
            if e not in NOTIFY_EVENTS:
                raise ValueError(f"{show(e)} is not an event; choose from {', '.join(NOTIFY_EVENTS)}")
        if v is not None and not v:
            raise ValueError(f"lists no event; leave `on` out for every one ({', '.join(NOTIFY_EVENTS)})")
        return v

    @field_validator("timeout")
    @classmethod
    def _timeout(cls, v: Any) -> Any:
        return _seconds(v, 120)

    @model_validator(mode="after")
    def _one(self) -> _NotifyEntry:
        given = [k for k in ("webhook", "webhook_file", "command") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give one of webhook (a URL), webhook_file (a file holding one) or command"
                             + (f", not {' and '.join(given)}" if given else ""))
        return self


class InventoryFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: Line | None = None
    defaults: _Settings = _Settings()
    master: _MasterEntry = _MasterEntry()
    collect: list[Glob] = []
    fanout: int | None = Field(default=None, ge=1, le=1024)
    keep_runs: int | None = Field(default=None, ge=1)
    stall_timeout: StallTimeout = None
    progress_regex: ProgressRegex | None = None
    notify: list[_NotifyEntry] = []
    quarantine: Quarantine = None
    retry_job_failures: bool = False
    hosts: list[_HostEntry] = Field(min_length=1)
    spares: list[_HostEntry] = []  # host entries used only to replace a host lost during a run
    restarts: int | None = Field(default=None, ge=0, le=1000)  # new attempts after a machine's failure


# ---- `slurm:` inventories: Slurm allocates the hosts, so there is no `hosts:` list ----

# Slurm's --time formats: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (or UNLIMITED).
_SLURM_TIME = re.compile(r"\d+|\d+:\d{2}|\d+:\d{2}:\d{2}|\d+-\d+|\d+-\d+:\d{2}|\d+-\d+:\d{2}:\d{2}|UNLIMITED|INFINITE")
_SBATCH_OPTION = re.compile(r"(--[A-Za-z][A-Za-z0-9-]*|-[A-Za-z])(?:[= ].*)?", re.S)
# What the batch script sets itself: given twice, Slurm would silently take one of them.
SBATCH_RESERVED = frozenset({
    "--nodes", "-N", "--ntasks-per-node", "--ntasks", "-n", "--output", "-o", "--error", "-e", "--job-name", "-J",
    "--partition", "-p", "--time", "-t", "--account", "-A", "--qos", "-q", "--constraint", "-C", "--gpus-per-node",
    "--chdir", "-D", "--parsable", "--requeue", "--no-requeue", "--wrap", "--array", "-a", "--export",
})
_SLURM_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._,:|&*()\[\]-]*")  # partition, account, qos, constraint


def _slurm_word(v: str | None) -> str | None:
    if v is not None and not _SLURM_WORD.fullmatch(v):
        raise ValueError("must be a Slurm name: letters, digits and . _ - (constraints also , : | & * ( ) [ ])")
    return v


SlurmWord = Annotated[str, AfterValidator(_slurm_word)]


def _sbatch_option(opt: str) -> str:
    m = _SBATCH_OPTION.fullmatch(opt)
    if not m:
        raise ValueError(f"{show(opt)} is not an sbatch option (it must start with - or --, e.g. \"--mem=16G\")")
    if m.group(1) in SBATCH_RESERVED:
        raise ValueError(f"{m.group(1)}: clusterddp sets it itself; use the `slurm:` field for it "
                         "(nodes, partition, time, account, qos, constraint, gpus_per_node)")
    return opt


SbatchOption = Annotated[str, AfterValidator(_one_line), AfterValidator(_sbatch_option)]


class _LoginEntry(_HostEntry):
    """`slurm.login` as a host entry: where sbatch, scontrol and scancel run, reached over SSH."""

    @field_validator("gpus", "workdir", "lease_dir", mode="before")
    @classmethod
    def _unused(cls, v: Any) -> Any:
        if v is not None:
            raise ValueError("not used for the login host (Slurm's commands run there; jobs run on the compute "
                             "nodes): remove it (slurm.gpus_per_node and slurm.shared_dir say it for the job)")
        return v


class _LoginOnly(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    login: _LoginEntry


class SlurmLoginFile(BaseModel):
    """Only `slurm.login`, when it is a host entry: validated by itself, so errors point inside it."""

    model_config = ConfigDict(extra="ignore", strict=True)
    slurm: _LoginOnly


class _SlurmEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    login: Any = LOCAL  # `local` or a host entry (a mapping: checked by SlurmLoginFile)
    partition: SlurmWord | None = None
    nodes: Any = 1  # a count or "MIN:MAX"; checked below, so a wrong type gets one clear message
    gpus_per_node: int = Field(default=1, ge=1, le=1024)
    request_gpus: bool = True
    time: Line | None = None
    account: SlurmWord | None = None
    qos: SlurmWord | None = None
    constraint: SlurmWord | None = None
    sbatch: list[SbatchOption] = []
    shared_dir: Line = "~/clusterddp"
    python: Line = "python3"
    setup: list[str] = []
    env: dict[str, Any] = {}

    @field_validator("login", mode="before")
    @classmethod
    def _login(cls, v: Any) -> Any:
        if v != LOCAL and not isinstance(v, dict):
            raise ValueError(f"must be `local` (Slurm's commands run on this machine) or a host entry reached "
                             f"over SSH, e.g. {{name: login1, address: login1.example.org, user: me}}, "
                             f"not {show(str(v))}")
        return v

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError("must be a number of nodes or a range \"MIN:MAX\"")
        if isinstance(v, int):
            if v < 1:
                raise ValueError("must be >= 1")
            return v
        m = re.fullmatch(r"(\d{1,5}):(\d{1,5})", v) if isinstance(v, str) else None
        if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
            raise ValueError("must be a number of nodes or a range \"MIN:MAX\" with 1 <= MIN <= MAX, e.g. \"2:4\"")
        return v

    @field_validator("time")
    @classmethod
    def _time(cls, v: str | None) -> str | None:
        if v is not None and not _SLURM_TIME.fullmatch(v):
            raise ValueError(f"{show(v)} is not a Slurm time limit; use minutes, \"HH:MM:SS\" or \"D-HH:MM:SS\"")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, Any]) -> dict[str, str]:
        return _env_values(v) or {}


class SlurmInventoryFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: Line | None = None
    collect: list[Glob] = []
    stall_timeout: StallTimeout = None
    progress_regex: ProgressRegex | None = None
    notify: list[_NotifyEntry] = []
    slurm: _SlurmEntry
