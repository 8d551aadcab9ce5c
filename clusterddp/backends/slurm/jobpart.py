"""The Slurm backend's part of run.json (:class:`clusterddp.record.BackendPart`: the ``slurm`` object,
and ``"backend": {"name": "slurm", "version": 2}``): where a run handed to Slurm is, written and read
back here only, so the shared record never types a Slurm field. Read as untrusted, like the rest of
run.json: a wrong field is a RecordError naming the file and ``slurm.<field>``.

Versions of the part's shape: 1, the ``slurm`` object of records written before the backend owned its
part (no ``backend`` key: the record reads those as version 1); 2, the same fields, with the nodes'
settings (``node``) kept as what a node needs (python, setup lines, env, the shared folder, its
process count), not as an SSH host entry. Version 1 is migrated on read."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ...errors import RecordError
from ...inventory import Node
from ...record import BackendPart, RunRecord, host_json, part_count, part_env, part_host, part_object, part_reader
from .plan import EnvStep
from .section import KEY, SlurmSettings

VERSION = 2


@dataclass(frozen=True)
class NodeSettings:
    """What every node of a Slurm run runs with (the inventory's `slurm:` python, setup and env, and
    its shared folder): a Slurm node is no SSH host, it is reached through its job only."""

    python: str
    setup: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    shared_dir: str = "~/clusterddp"
    gpus: int | str = 1
    env_id: str | None = None       # `packages:`: the environment the job ran in (python is its python)
    lock_sha256: str | None = None

    @classmethod
    def of(cls, s: SlurmSettings, env: EnvStep | None = None) -> NodeSettings:
        """Every node's settings: ``s``'s, with ``env``'s python and id where the job runs in an environment."""
        return cls(python=env.python if env else s.python, setup=s.setup, env=s.env, shared_dir=s.shared_dir,
                   gpus=s.gpus_per_node, env_id=env.env_id if env else None,
                   lock_sha256=env.lock_sha256 if env else None)

    def node(self, name: str) -> Node:
        """Node ``name``'s settings as a node record holds them (run.json's ``nodes[].settings``): a
        Node, reached through the job only, not an SSH host entry."""
        return Node(name=name, address=name, python=self.python, workdir=self.shared_dir, env=self.env,
                    setup=self.setup, gpus=self.gpus, env_id=self.env_id, lock_sha256=self.lock_sha256)


@dataclass(frozen=True)
class SlurmJob:
    """Where a run handed to Slurm is: its folder in the shared dir, and the job once submitted."""

    run_dir: str                   # <shared_dir>/runs/<run_id> (code, node logs, exit codes)
    job_id: str | None = None      # None until sbatch answered
    partition: str | None = None   # as Slurm reports it once the job is known
    hosts: tuple[str, ...] = ()    # the allocation, once Slurm made it
    nproc: int = 1                 # processes per node
    login: Any = None              # the login Host Slurm's commands ran on over SSH; None: this machine
    node: NodeSettings | None = None  # every node's settings: its nodes, learnt later, get them

    def part(self) -> BackendPart:
        """The job as the record keeps it."""
        login = {"login": host_json(self.login)} if self.login is not None else {}
        node = {"node": {"python": self.node.python, "setup": list(self.node.setup), "env": dict(self.node.env),
                         "shared_dir": self.node.shared_dir, "gpus": self.node.gpus,
                         **{k: v for k in ("env_id", "lock_sha256") if (v := getattr(self.node, k))}}
                } if self.node is not None else {}
        return BackendPart(KEY, VERSION, {"run_dir": self.run_dir, "job_id": self.job_id, "partition": self.partition,
                                          "hosts": list(self.hosts), "nproc": self.nproc, **login, **node})

    @classmethod
    def from_part(cls, part: BackendPart) -> SlurmJob:
        """The job a record's part holds (version 1 or 2); a RecordError located in the file when it is wrong."""
        r = part_reader(part)
        if part.version > VERSION:
            raise RecordError(part.source, "backend.version", f"version {part.version} of the slurm part, newer "
                              f"than this clusterddp reads ({VERSION})", "upgrade clusterddp to read this run")
        data = part.data
        return cls(run_dir=r.get("run_dir", str), job_id=r.get("job_id", str | None),
                   partition=r.get("partition", str | None), hosts=r.get("hosts", tuple[str, ...], default=()),
                   nproc=part_count(r, "nproc"),
                   login=part_host(r, "login") if data.get("login") is not None else None,
                   node=_node(r, part.version) if data.get("node") is not None else None)


def _node(r: Any, version: int) -> NodeSettings:
    if version == 1:  # then an SSH host entry (transport "slurm"): what a node needs of it is kept
        h = part_host(r, "node")
        return NodeSettings(python=h.python, setup=h.setup, env=h.env, shared_dir=h.workdir, gpus=h.gpus)
    n = part_object(r, "node")
    gpus = n.get("gpus", int | str, default=1)
    if gpus != "auto" and (isinstance(gpus, str) or gpus < 1):
        raise RecordError(n.path, n.field("gpus"), f"must be a count or \"auto\", not {gpus!r:.40}")
    return NodeSettings(python=n.get("python", str), setup=n.get("setup", tuple[str, ...], default=()),
                        env=part_env(n, "env"), shared_dir=n.get("shared_dir", str), gpus=gpus,
                        env_id=n.get("env_id", str | None, default=None),
                        lock_sha256=n.get("lock_sha256", str | None, default=None))


def job_of(rec: RunRecord) -> SlurmJob:
    """The Slurm job of a run the registry gave this backend (its part of run.json, read back)."""
    assert rec.backend is not None and rec.backend.name == KEY, f"run {rec.run_id} is not a Slurm run"
    return SlurmJob.from_part(rec.backend)


def with_job(rec: RunRecord, job: SlurmJob) -> RunRecord:
    """``rec`` keeping ``job`` as its Slurm part."""
    return replace(rec, backend=job.part())
