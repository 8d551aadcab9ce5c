"""`packages:` on a `slurm:` inventory: the job's Python environment, from the same lock, with the same id.

The compute nodes are reached through the job only, so the work splits in two:

- before the job, from this machine (:func:`prepare`): the login host runs the node program
  ``envbuild look`` with ``slurm.python`` after ``slurm.setup`` (the compute nodes' Python, as the
  shared folder's image gives it), which says what an environment's id is made of (the lock's
  sha256, the base Python's version, implementation and path, the platform: the id an SSH node with
  that Python gets) and what ``<shared_dir>/envs`` holds. The wheels the lock needs for that Python
  and platform are fetched into this machine's cache (a package with none: exit 2, naming the lock's
  line, before anything is recorded) and the ones the shared wheel store lacks are sent to it
  (``<shared_dir>/envs/wheels``, checked on arrival, as an SSH node's store is).
- inside the job (:func:`clusterddp.backends.slurm.plan.env_lines`): a first ``srun`` step runs
  ``envbuild build`` on every node, which checks that the node's own Python and platform are those
  the id was planned for, then builds the environment from the shared store, or finds it ready: in
  ``<shared_dir>/envs`` (``slurm.envs_dir`` unset: built once, under its lock, the other nodes
  waiting for it) or in ``slurm.envs_dir`` on each node's own disk (built on every node). The job's
  step then runs with the environment's python.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass, replace
from pathlib import Path

from ...envs import lock as lock_module
from ...envs import nodes as env_nodes
from ...envs import wheels as wheels_module
from ...fleet import Fleet
from ...inventory import Host
from ...sizes import human_size
from .login import Login
from .plan import EnvStep
from .section import SlurmSettings

ENVS = env_nodes.ENVS  # <shared_dir>/envs: the shared wheel store, and the environments unless envs_dir is set


@dataclass(frozen=True)
class SlurmEnv:
    """The job's environment as :func:`prepare` found it: its step, and what was sent for it."""

    step: EnvStep
    plan: env_nodes.Plan       # the shared store's side: the wheels, those it lacks
    shared: bool               # built once in <shared_dir>/envs (else on each node, in envs_dir)

    def says(self) -> str:
        where = "in the shared folder" if self.shared else f"on each node in {self.step.root}"
        if self.plan.ready:
            return f"environment {self.step.env_id} ready {where}"
        return (f"environment {self.step.env_id} will be built {where} by the job "
                f"({human_size(self.plan.to_send)} of wheels to send to the shared folder)")


def read_lock(s: SlurmSettings) -> lock_module.Lock | None:
    """The inventory's lock (`slurm.packages`), read now: a lock that is not one is a LockFileError naming
    the file and line (exit 2) before anything is contacted."""
    return lock_module.read(s.packages) if s.packages else None


def _fleet(login: Login, s: SlurmSettings, shared_dir: str) -> tuple[Fleet, Host]:
    """The login host as a one-host fleet whose host runs ``slurm.python`` after ``slurm.setup`` in the shared
    folder; the login's own connection is borrowed (closed by the login, not by this fleet)."""
    t, where = login.collect_host(shared_dir)
    # transport "slurm": not this machine's `up local` (whose envs live in the cache), whatever the login is
    host = replace(where, name=login.name, python=s.python, setup=s.setup, env=(), workdir=shared_dir,
                   transport="slurm")
    return Fleet([host], connect=lambda h: t), host


def prepare(login: Login, s: SlurmSettings, shared_dir: str, lock: lock_module.Lock,
            cache: Path | None = None) -> SlurmEnv:
    """What the job's environment is (its id, from the login host's look) and the wheels the shared store
    lacks (fetched into the cache). HostError when the login host cannot run ``slurm.python``; UsageError
    (exit 2) naming the lock's line for a package with no wheel for that Python and platform."""
    fleet, host = _fleet(login, s, shared_dir)
    facts = env_nodes.look(fleet, [host])[host.name]
    eid = env_nodes.env_id(lock.sha256, facts)
    store = facts["root"]
    shared = s.envs_dir is None
    root = store if shared else s.envs_dir
    assert root is not None
    target = wheels_module.Target(".".join(facts["python"].split(".")[:2]), facts["tag"], facts["platform"])
    ready = shared and eid in facts["envs"]
    wheels = wheels_module.fetch(lock, target, cache, hosts=("the compute nodes",))
    uv = wheels_module.installer(target, cache)
    held = set(facts["wheels"])
    missing = () if ready else tuple(w for w in (*wheels, uv) if w.sha256 not in held)
    plan = env_nodes.Plan(host, lock, eid, store, posixpath.join(root, eid, "bin", "python"), ready, wheels,
                          missing, uv)
    request = {**env_nodes.build_request(plan), "root": root, "store": store,
               "facts": {k: facts[k] for k in ("python", "impl", "exe", "platform")}}
    step = EnvStep(eid, root, plan.python, lock.sha256, json.dumps(request, sort_keys=True))
    return SlurmEnv(step, plan, shared)


def send(login: Login, s: SlurmSettings, shared_dir: str, env: SlurmEnv, cache: Path | None = None) -> int:
    """The wheels the shared store lacks, sent to it through the login host (each checked on arrival; a
    damaged one sent again once); the bytes sent."""
    fleet, _ = _fleet(login, s, shared_dir)
    return env_nodes.push(fleet, env.plan, cache or wheels_module.cache_dir())
