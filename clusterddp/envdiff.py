"""`check --diff`: what differs between each host's environment and the master's.

Each host runs the node program :mod:`clusterddp.node.envinfo` once (:func:`envinfo_command`):
python, torch, CUDA, NCCL, the NVIDIA driver, the installed distributions of the inventory's
python (what ``pip freeze`` lists), and, where a previous run of this inventory (the newest in
the runs folder) left the script's folder on the node, a hash of the files that run uploaded.
:func:`compare` (pure) keeps only the differences from the master, per host.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from .errors import ClusterDDPError
from .fleet import Fleet, HostResult
from .inventory import Host, Inventory
from .node import envinfo as node_envinfo
from .node import reply as node_reply
from .node.envinfo import EnvInfoError, parse_reply
from .nodescript import NodeCommand, env_stdin, preamble, python_command, q, qpath
from .record import RunRecord
from .store import RunStore

FIELDS = (("python", "python"), ("torch", "torch"), ("cuda", "CUDA"), ("nccl", "NCCL"), ("driver", "driver"))
TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Difference:
    host: str
    what: str             # "python", "torch", "CUDA", "NCCL", "driver", "package NAME", "script folder"
    master: str           # the master's value ("-": not there)
    value: str            # this host's


@dataclass(frozen=True)
class DiffReport:
    master: str
    hosts: tuple[str, ...]
    differences: tuple[Difference, ...]
    errors: dict[str, str] = field(default_factory=dict)   # host -> why it could not be compared
    run_id: str | None = None                              # the run whose script folder was hashed
    packages: int = 0                                      # distributions on the master
    note: str | None = None                                # why no script folder was compared

    @property
    def ok(self) -> bool:
        return not self.differences and not self.errors

    def to_dict(self) -> dict:
        return {"ok": self.ok, "master": self.master, "hosts": list(self.hosts), "run_id": self.run_id,
                "packages": self.packages, "note": self.note, "errors": self.errors,
                "differences": [d.__dict__ for d in self.differences]}


def _script(v: dict | None) -> str:
    if v is None:
        return "no copy"
    return v["sha256"][:12] + (f" ({v['missing']} of {v['files']} files missing)" if v["missing"] else "")


def compare(master: str, facts: dict[str, dict], errors: dict[str, str], *, run_hosts: tuple[str, ...] = (),
            run_id: str | None = None, note: str | None = None) -> DiffReport:
    """Each host's facts against the master's (or, when the master did not answer, the first host
    that did); only what differs. ``run_hosts``: the hosts of the run whose script folder was hashed."""
    hosts = tuple(facts) + tuple(h for h in errors if h not in facts)
    ref_host = master if master in facts else next(iter(facts), master)
    if ref_host != master and master in errors:
        note = (note + "; " if note else "") + f"the master {master} did not answer: compared with {ref_host}"
    ref = facts.get(ref_host, {})
    diffs = []
    for host, f in facts.items():
        if host == ref_host:
            continue
        for key, label in FIELDS:
            if f.get(key) != ref.get(key):
                diffs.append(Difference(host, label, ref.get(key) or "-", f.get(key) or "-"))
        mine, theirs = f.get("packages"), ref.get("packages")
        if mine is None or theirs is None:
            if mine != theirs:
                diffs.append(Difference(host, "packages", "unknown" if theirs is None else f"{len(theirs)}",
                                        "unknown" if mine is None else f"{len(mine)}"))
        else:
            for name in sorted(set(mine) | set(theirs)):
                if mine.get(name) != theirs.get(name):
                    diffs.append(Difference(host, f"package {name}", theirs.get(name, "-"), mine.get(name, "-")))
        if run_id and host in run_hosts and ref_host in run_hosts and f.get("script") != ref.get("script"):
            diffs.append(Difference(host, "script folder", _script(ref.get("script")), _script(f.get("script"))))
    return DiffReport(ref_host, hosts, tuple(diffs), dict(errors), run_id,
                      len(ref.get("packages") or {}), note)


def previous_run(store: RunStore, inventory: Inventory) -> RunRecord | None:
    """The newest run of this inventory file in ``store`` (not a local one), or None."""
    if not store.root.is_dir():
        return None
    path = str(Path(inventory.path).resolve())
    for row in store.list():
        if row.get("inventory") == path:
            try:
                rec = store.load(row["run_id"])
            except ClusterDDPError:  # a damaged record: the next older run may do
                continue
            if not rec.local:
                return rec
    return None


def run_diff(inventory: Inventory, runs_dir: str, inventory_keys: tuple[str, ...]) -> DiffReport:
    """Ask every host, in parallel, and compare (``inventory_keys``: every backend's, for the upload's
    rule that leaves another inventory out: :func:`clusterddp.backends.inventory_keys`)."""
    from .upload import scan_source, secret_files
    store = RunStore(runs_dir, read_only=True)
    rec = previous_run(store, inventory)
    files: list[str] = []
    note = None
    run_dirs: dict[str, str] = {}
    if rec is None:
        note = f"no script folder: no previous run of {inventory.path} in {store.root}"
    else:
        source = (Path(rec.launch_dir) / rec.script).parent
        try:
            # what that run uploaded: never the inventory or the secrets it names (their -e @FILEs are not
            # recorded: such a file is listed missing on every node alike)
            files = [rel for rel, _ in scan_source(source, store.root, secret_files(inventory),
                                                       inventory_keys=inventory_keys).entries
                     if not rel.endswith("/")]
            run_dirs = {n.host: n.run_dir for n in rec.nodes}
        except OSError as e:
            note = f"the script's folder of run {rec.run_id} ({source}) cannot be read here: {e}"
            rec = None

    def command(h) -> NodeCommand:
        return envinfo_command(h, run_dirs.get(h.name), files)
    with Fleet(inventory.hosts, fanout=inventory.fanout) as fleet:
        results = fleet.run(command, timeout=TIMEOUT_S)
    facts, errors = facts_of(results)
    return compare(inventory.master.host, facts, errors, run_hosts=tuple(run_dirs),
                   run_id=rec.run_id if rec else None, note=note)


def facts_of(results: list[HostResult]) -> tuple[dict[str, dict], dict[str, str]]:
    """Each host's checked reply, every text in it one line (a version or package name a node sent
    must not print a table row of its own), or why there is none."""
    facts: dict[str, dict] = {}
    errors: dict[str, str] = {}
    for r in results:
        if r.error is not None:
            e = r.error
            errors[r.host] = node_reply.one_line(e.detail)
            continue
        assert r.result is not None
        try:
            facts[r.host] = cast(dict, node_reply.one_line_each(
                parse_reply(r.result.stdout, r.result.stderr, r.result.exit_code)))
        except EnvInfoError as e:
            errors[r.host] = node_reply.one_line(str(e))
    return facts, errors


# ---- the node side (moved from plan.py) ----

def envinfo_command(host: Host, run_dir: str | None = None, files: Iterable[str] = ()) -> NodeCommand:
    """The node side of ``check --diff`` (``clusterddp/node/envinfo.py``): after the host's setup
    lines and env (on stdin), its python with site-packages reports versions, packages and, when
    ``run_dir`` (a previous run's folder there) is given, a hash of ``files`` below it."""
    lines = preamble(host, host.env, stdout_to=">&2", env_on_stdin=True,
                      on_fail=lambda line: f"echo {q('[clusterddp] setup failed: ' + line)} >&2; exit 98")
    args = [qpath(run_dir), q(node_envinfo.files_arg(list(files)))] if run_dir else []
    lines.append("exec " + python_command(host.python, "envinfo", args, site=True))
    return NodeCommand("\n".join(lines), env_stdin(host.env))
