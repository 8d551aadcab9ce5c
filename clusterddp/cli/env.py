"""`clusterddp env build|list`: the nodes' `packages:` environments (docs/environments.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from .common import RUNS_DIR, err, handle_errors, load_inventory, visible
from .examples import epilog

if TYPE_CHECKING:
    from ..envs.lock import Lock
    from ..inventory import Inventory

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="The Python environments built on the nodes from a lock file (packages:).")


def _locked(inventory: str, packages: str | None, hosts: str | None) -> tuple[Inventory, dict[str, Lock]]:
    from ..envs import nodes as env_nodes
    from ..errors import UsageError
    inv = env_nodes.with_packages(load_inventory(inventory, hosts), packages)
    if inv.backend != "ssh":  # a Slurm job's nodes are reached through a job only: its first step builds
        raise UsageError(f"{inv.path}: `env` works on an inventory that lists its hosts, not a `{inv.backend}:` one",
                         "`clusterddp up` builds the environment in the job's first step (docs/environments.md)")
    by_host = env_nodes.locks(inv)
    if not by_host:
        raise UsageError(f"{inv.path}: no host has packages:", "add `packages: requirements.txt` to its defaults "
                         "or hosts, or give --packages FILE")
    return inv, by_host


@app.command("build", epilog=epilog("env build"))
@handle_errors
def build(
    inventory: str = typer.Argument(..., help="Inventory YAML file."),
    packages: str | None = typer.Option(None, "--packages", metavar="FILE",
                                        help="The lock file, over the inventory's packages:."),
    hosts: str | None = typer.Option(None, "--hosts", help="Only these hosts: a,b,c."),
) -> None:
    """Build every host's environment now (what `up` does before its job): wheels fetched here once, each
    node sent only those it lacks, built in parallel; a ready one is left as it is."""
    from ..envs import nodes as env_nodes
    from ..fleet import Fleet
    inv, by_host = _locked(inventory, packages, hosts)
    with Fleet(inv.hosts, fanout=inv.fanout) as fleet:
        plans = env_nodes.survey(fleet, inv.hosts, by_host)
        for p in plans.values():
            if not p.ready:
                err(visible(f"[clusterddp] {p.host.name}: {p.says()}"))
        made = env_nodes.ready(fleet, plans, on_wait=lambda s: err(visible(f"[clusterddp] {s}")))
    for m in made.values():
        state = "built" if m.built else "ready"
        print(visible(f"{m.host}: environment {m.env_id} {state}: {m.python} (sent {m.sent} bytes)"))
    print(visible(env_nodes.summary(made)))


@app.command("list", epilog=epilog("env list"))
@handle_errors
def list_(
    inventory: str = typer.Argument(..., help="Inventory YAML file."),
    hosts: str | None = typer.Option(None, "--hosts", help="Only these hosts: a,b,c."),
) -> None:
    """What each host holds: its environments (id, size) and its wheel store's size."""
    from ..envs import nodes as env_nodes
    from ..fleet import Fleet
    from ..sizes import human_size
    inv = load_inventory(inventory, hosts)
    with Fleet(inv.hosts, fanout=inv.fanout) as fleet:
        held = env_nodes.holdings(fleet, inv.hosts)
    for host, h in held.items():
        if isinstance(h, Exception):
            err(visible(f"{host}: {h}"))
            continue
        envs = ", ".join(f"{i} ({human_size(n)})" for i, n in h["sizes"].items()) or "none"
        print(visible(f"{host}: {h['root']}: environments {envs}; wheel store {human_size(h['store'])}"))


@app.command("prune", epilog=epilog("env prune"))
@handle_errors
def prune_(
    inventory: str = typer.Argument(..., help="Inventory YAML file."),
    runs_dir: str = RUNS_DIR,
    hosts: str | None = typer.Option(None, "--hosts", help="Only these hosts: a,b,c."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would be removed; remove nothing."),
) -> None:
    """Remove the environments on each host that no run recorded in --runs-dir used and that the inventory's
    lock does not give now; never one a process runs from, or one being built. Then the wheels of each host's
    wheel store that no environment left there was built from (never while a build runs there)."""
    from ..envs import nodes as env_nodes
    from ..fleet import Fleet
    from ..sizes import human_size
    from ..store import RunStore
    inv = load_inventory(inventory, hosts)
    keep = env_nodes.recorded(RunStore(runs_dir, read_only=True))
    with Fleet(inv.hosts, fanout=inv.fanout) as fleet:
        now, wheels = env_nodes.kept_now(fleet, inv.hosts, env_nodes.locks(inv))
        done = env_nodes.prune(fleet, inv.hosts, keep | now, dry_run, wheels)
    word = "would remove" if dry_run else "removed"
    failed = False
    for host, d in done.items():
        if isinstance(d, Exception):
            err(visible(f"{host}: {d}"))
            failed = True
            continue
        for env_id, size in d["removed"]:
            print(visible(f"{host}: {word} environment {env_id} ({human_size(size)})"))
        for env_id, why in d["kept"]:
            print(visible(f"{host}: kept environment {env_id} ({why})"))
        if not d["removed"] and not d["kept"]:
            print(visible(f"{host}: no environment"))
        store = d["store"]
        if store.get("busy"):
            print(visible(f"{host}: wheel store left as it is (a build or a transfer runs there now)"))
        elif store.get("unknown"):
            print(visible(f"{host}: wheel store left as it is (environment {store['unknown']} was built by an older "
                          "clusterddp and does not list its wheels)"))
        elif store["removed"]:
            total = human_size(sum(n for _, n in store["removed"]))
            print(visible(f"{host}: {word} {len(store['removed'])} wheel(s) from the wheel store ({total}): "
                          + ", ".join(f for f, _ in store["removed"][:5]) + (" ..." if len(store["removed"]) > 5
                                                                            else "")))
    if failed:
        raise typer.Exit(1)
