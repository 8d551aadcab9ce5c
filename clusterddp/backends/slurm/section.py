"""The Slurm backend's part of an inventory file: the `slurm:` section, declared here and read by the
inventory reader (:class:`clusterddp.inventory.section.Section`), so the shared inventory model never
types a Slurm setting. Its settings (:class:`SlurmSettings`), its rules (the errors they give are
located in the file, exit 2), its fields' help for the JSON Schema and docs/inventory.md, and its
secrets (the env values a dry run hides)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...inventory import LOCAL, Host, Inventory, reserved_env, show
from ...inventory.section import (
    ENV,
    HOST_ENTRY,
    REQUIRED,
    Anything,
    Bool,
    Field,
    Line,
    ListOf,
    Located,
    Maybe,
    Model,
    Number,
    Section,
    Str,
    login_host,
)

KEY = "slurm"  # the section's key in a file, and the backend's name in the registry


@dataclass(frozen=True)
class SlurmSettings:
    """A `slurm:` inventory's cluster: Slurm allocates the hosts; clusterddp submits and follows."""

    login: str | Host               # where sbatch/squeue/scancel run: "local", or a host reached over SSH
    partition: str | None
    nodes: tuple[int, int]          # (min, max) nodes; equal unless an elastic range "MIN:MAX"
    gpus_per_node: int              # processes per node
    request_gpus: bool              # also ask Slurm for that many GPUs per node (--gpus-per-node)
    time: str | None
    account: str | None
    qos: str | None
    constraint: str | None
    sbatch: tuple[str, ...]         # extra #SBATCH options, verbatim
    shared_dir: str                 # seen by this machine and every compute node
    python: str
    setup: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    packages: str | None = None     # `packages:`: the lock file (absolute) the job's environment is built from
    envs_dir: str | None = None     # where environments live: None, <shared_dir>/envs (built once); else node-local


def settings_of(inv: Inventory) -> SlurmSettings:
    """The `slurm:` settings of an inventory the registry gave this backend."""
    s = inv.backend_settings
    assert isinstance(s, SlurmSettings), f"{inv.path} is not a slurm: inventory"
    return s


def secrets(inv: Inventory) -> tuple[tuple[str, str], ...]:
    """The env values of a `slurm:` inventory (``slurm.env``), which a dry run hides."""
    return settings_of(inv).env



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


def _slurm_word(v: str) -> str:
    if not _SLURM_WORD.fullmatch(v):
        raise ValueError("must be a Slurm name: letters, digits and . _ - (constraints also , : | & * ( ) [ ])")
    return v


def _sbatch_option(opt: str) -> str:
    m = _SBATCH_OPTION.fullmatch(opt)
    if not m:
        raise ValueError(f"{show(opt)} is not an sbatch option (it must start with - or --, e.g. \"--mem=16G\")")
    if m.group(1) in SBATCH_RESERVED:
        raise ValueError(f"{m.group(1)}: clusterddp sets it itself; use the `slurm:` field for it "
                         "(nodes, partition, time, account, qos, constraint, gpus_per_node)")
    return opt


def _slurm_time(v: str) -> str:
    if not _SLURM_TIME.fullmatch(v):
        raise ValueError(f"{show(v)} is not a Slurm time limit; use minutes, \"HH:MM:SS\" or \"D-HH:MM:SS\"")
    return v


def _slurm_nodes(v: Any) -> Any:
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


def _absolute(v: str) -> str:
    if not v.startswith("/"):
        raise ValueError(f"{show(v)} must be an absolute folder on each compute node's own disk, "
                         "e.g. /local/scratch/clusterddp-envs (leave it out to build once in shared_dir)")
    return v


def _login(v: Any) -> Any:
    if v != LOCAL and not isinstance(v, dict):
        raise ValueError(f"must be `local` (Slurm's commands run on this machine) or a host entry reached "
                         f"over SSH, e.g. {{name: login1, address: login1.example.org, user: me}}, "
                         f"not {show(str(v))}")
    return v


def _not_on_login(v: Any) -> Any:
    if v is not None:
        raise ValueError("not used for the login host (Slurm's commands run there; jobs run on the compute "
                         "nodes): remove it (slurm.gpus_per_node and slurm.shared_dir say it for the job)")
    return v


# `slurm.login` as a host entry: where sbatch, scontrol and scancel run, reached over SSH. The fields a
# login host has no use for are refused there, and left out of its JSON Schema.
NOT_ON_LOGIN = ("gpus", "workdir", "lease_dir", "packages")
LOGIN_ENTRY = Model("_LoginEntry", {k: (Field(f.rule, f.default, before=_not_on_login) if k in NOT_ON_LOGIN else f)
                                    for k, f in HOST_ENTRY.fields.items()})
# Only `slurm.login`, when it is a host entry: validated by itself, so errors point inside it.
LOGIN_FILE = Model("SlurmLoginFile", {
    "slurm": Field(Model("_LoginOnly", {"login": Field(LOGIN_ENTRY, REQUIRED)}, extra="ignore"), REQUIRED),
}, extra="ignore")

_WORD = Maybe(Str(_slurm_word, shape={"pattern": f"^(?:{_SLURM_WORD.pattern})$"}))
SLURM_ENTRY = Model("_SlurmEntry", {
    "login": Field(Anything(_login, schema={"anyOf": [{"const": LOCAL}, {"$ref": "#/$defs/_LoginEntry"}]}), LOCAL),
    "partition": Field(_WORD),
    "nodes": Field(Anything(_slurm_nodes, schema={"anyOf": [{"type": "integer", "minimum": 1},
                                                            {"type": "string", "pattern": r"^\d{1,5}:\d{1,5}$"}]}), 1),
    "gpus_per_node": Field(Number(whole=True, ge=1, le=1024), 1),
    "request_gpus": Field(Bool(), True),
    "time": Field(Maybe(Line(_slurm_time, shape={"pattern": f"^(?:{_SLURM_TIME.pattern})$"}))),
    "account": Field(_WORD),
    "qos": Field(_WORD),
    "constraint": Field(_WORD),
    "sbatch": Field(ListOf(Line(_sbatch_option, shape={
        "pattern": f"^(?:{_SBATCH_OPTION.pattern})$",
        "not": {"pattern": "^(?:" + "|".join(sorted(SBATCH_RESERVED)) + ")(?:[= ]|$)"}})), []),
    "shared_dir": Field(Line(), "~/clusterddp"),
    "python": Field(Line(), "python3"),
    "setup": Field(ListOf(Str()), []),
    "env": Field(ENV, {}),
    "packages": Field(Maybe(Line())),  # a lock file, relative to the inventory's folder (docs/environments.md)
    "envs_dir": Field(Maybe(Line(_absolute, shape={"pattern": "^/"}))),
})



def _read(entry: Any, at: Located) -> SlurmSettings:
    """The validated `slurm:` block as the backend's settings; a reserved env name, or a login host
    entry that is wrong, is an InventoryError located in the file."""
    for k in entry.env:
        why = reserved_env(k)
        if why:
            raise at.error("a reserved name", ("slurm", "env", k), hint=why)
    lo, _, hi = str(entry.nodes).partition(":")
    login: str | Host = LOCAL
    if entry.login != LOCAL:  # a host entry, read as strictly as a hosts[] entry: its errors point inside it
        h = at.validate(LOGIN_FILE, at.data).slurm.login
        login = login_host(h, at.where(("slurm", "login", "identity_file")))
    return SlurmSettings(
        login=login, partition=entry.partition, nodes=(int(lo), int(hi or lo)), gpus_per_node=entry.gpus_per_node,
        request_gpus=entry.request_gpus, time=entry.time, account=entry.account, qos=entry.qos,
        constraint=entry.constraint, sbatch=tuple(entry.sbatch), shared_dir=entry.shared_dir, python=entry.python,
        setup=tuple(entry.setup), env=tuple(entry.env.items()),
        packages=None if entry.packages is None else str((Path(at.path).parent / Path(entry.packages).expanduser())
                                                          .absolute()),
        envs_dir=entry.envs_dir)


def _trim(defs: dict[str, Any]) -> None:
    login = defs["_LoginEntry"]["properties"]  # refused on a login host: an editor should not offer them
    for key in NOT_ON_LOGIN:
        del login[key]


# Hover help (JSON Schema) and docs/inventory.md's text, by field name (a name the inventory already
# describes, such as python, setup or env, means the same here).
DESCRIPTIONS = {
    "slurm": "This inventory is a Slurm cluster: the run is handed to sbatch instead of listing hosts",
    "login": "Where sbatch, scontrol and scancel run: `local` (this machine), or a host entry reached over SSH",
    "partition": "The Slurm partition (default: the cluster's default partition)",
    "nodes": "Nodes to allocate: a count, or \"MIN:MAX\" for an elastic range (torchrun --nnodes MIN:MAX)",
    "gpus_per_node": "Processes per node (torchrun --nproc-per-node); --gpus overrides",
    "request_gpus": "Also ask Slurm for that many GPUs per node (--gpus-per-node); false on CPU nodes",
    "time": "Time limit: minutes, \"HH:MM:SS\" or \"D-HH:MM:SS\" (default: the partition's)",
    "account": "Slurm account to charge (sbatch --account)",
    "qos": "Slurm quality of service (sbatch --qos)",
    "constraint": "Node features required (sbatch --constraint)",
    "sbatch": "Extra #SBATCH options, verbatim; each must be an option clusterddp does not set itself",
    "shared_dir": "A folder the login host and every compute node see: runs live in <shared_dir>/runs/<run_id>/",
    "envs_dir": "With packages: an absolute folder on each compute node's own disk where the job's environment is "
                "built on every node (default: built once in <shared_dir>/envs, which every node uses)",
}

SECTION = Section(
    key=KEY, entry=SLURM_ENTRY, read=_read, allocates="Slurm allocates the hosts", descriptions=DESCRIPTIONS,
    blocks=(LOGIN_ENTRY,), trim=_trim,
    docs=(("`slurm`", ("_SlurmEntry",), "slurm."), ("`slurm.login`", ("_LoginEntry",), "slurm.login.")))
