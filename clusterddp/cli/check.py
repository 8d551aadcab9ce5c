"""`clusterddp check INVENTORY [--json]`: will these hosts run a DDP job together?"""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Any

import typer

from ..errors import UsageError
from .common import (
    EXCLUDE,
    EXIT_FAILED,
    FANOUT,
    HOSTS,
    RUNS_DIR,
    err,
    handle_errors,
    is_tty,
    load_inventory,
    visible,
)

if TYPE_CHECKING:
    from ..check import Report
    from ..inventory import Inventory


_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red"}


@handle_errors
def check(
    inventory: str = typer.Argument(..., help="Inventory YAML file."),
    hosts: str | None = HOSTS,
    exclude: str | None = EXCLUDE,
    fanout: int | None = FANOUT,
    master_port: int | None = typer.Option(None, "--master-port", min=1, max=65535,
                                           help="Check this master port instead of the inventory's."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    collective: bool = typer.Option(False, "--collective", help="Instead: run all_reduce over every host at once "
                                    "(gloo, or NCCL on GPUs); figures per host, who never joined, who is slow."),
    join_timeout: float = typer.Option(20.0, "--join-timeout", min=1, max=3600, help="--collective: seconds a host "
                                       "may take to join once the master is ready."),
    diff: bool = typer.Option(False, "--diff", help="Instead: what differs from the master on each host: python, "
                              "torch, CUDA, NCCL, driver, packages, the last run's script folder."),
    runs_dir: str = RUNS_DIR,
) -> None:
    """Check that every host is ready for a DDP job, in parallel.

    SSH and host key; python, torch, CUDA and NCCL identical on every node; GPUs against `gpus`; the interface that routes to the master; the master port free; free disk in workdir; clock skew; whether workdir is one folder shared with other hosts (it then creates workdir and a marker file there); whether each run ships clusterddp.train to the node; with notify: webhooks, whether the master (node 0, which tells a detached run's end) can open a connection to each receiver (a warning when not).

    Exit 0 when every host passes, 1 when anything fails; each failure names the host and the fix.
    """  # noqa: E501 - Typer's help keeps the docstring's line breaks, so a paragraph is one line
    from .. import backends

    inv = load_inventory(inventory, hosts, fanout, exclude)
    backend = backends.for_inventory(inv)
    started = time.monotonic()
    if collective and diff:
        raise UsageError("--collective and --diff are two different checks", "run them one at a time")
    asked = "collective" if collective else "diff" if diff else None
    if asked and asked not in backend.checks:
        raise UsageError(f"--{asked}: not available for a `{backend.name}:` inventory",
                         "run it on an inventory that lists the hosts")
    if diff:
        from ..envdiff import run_diff
        from .envdiff import show as show_diff
        ok = show_diff(run_diff(inv, runs_dir, backends.inventory_keys()), time.monotonic() - started, as_json)
        raise typer.Exit(0 if ok else EXIT_FAILED)
    if collective:
        from ..collective import run_collective
        from .collective import show
        ok = show(run_collective(inv, master_port=master_port, join_s=join_timeout), time.monotonic() - started,
                  as_json)
        raise typer.Exit(0 if ok else EXIT_FAILED)
    report, envs = _checked(inv, backend, master_port, as_json)
    reach = notify_reach(inv) if backend.detached_notify and inv.notify else []
    took = time.monotonic() - started
    from ..quarantine import quarantined, stamp
    aside = quarantined(inv.hosts)  # set aside on this machine: `up` refuses them, whatever the nodes say
    if as_json:
        print(json.dumps({**report.to_dict(), "seconds": round(took, 2), "environments": envs,
                          "quarantined": {h: e.to_json() for h, e in aside.items()},
                          "notify": [{"host": h, **f.__dict__} for h, f in reach]}, indent=2))
        raise typer.Exit(0 if report.ok and not aside else EXIT_FAILED)
    ok = print_report(report, took)
    for h, f in reach:
        if f.status == "ok":
            print(visible(f"ok   {h} notify: reaches {f.value}"))
        else:
            print(visible(f"warn {h} notify: {f.problem}"))
            if f.fix:
                print(visible(f"     fix: {f.fix}"))
    for h, e in aside.items():
        print(visible(f"FAIL {h} quarantined: set aside until {stamp(e.until)}: {e.why}"))
        print(visible(f"     fix: `clusterddp quarantine release {h}` once the machine is mended, or --exclude {h}"))
    if not ok or aside:
        raise typer.Exit(EXIT_FAILED)


def _checked(inv: Inventory, backend: Any, master_port: int | None, quiet: bool) -> tuple[Report, dict]:
    """The checks. With `packages:` on SSH hosts, each host's environment is looked at in the same command as
    its probe (which then checks a ready environment's python; one not built yet, the base python) and said,
    before the checks: ready, will be built (the bytes to send), or cannot be built (why); nothing is built.
    A lock that is not one exits 2 before any check; a package with no wheel for a host, once every host is
    said. The JSON report's ``environments``."""
    from ..envs import nodes as env_nodes
    from ..errors import HostError
    by_host = env_nodes.locks(inv)
    if not by_host or backend.name != "ssh":
        inv, envs = _environments(inv, quiet)
        return backend.check(inv, master_port=master_port), envs
    from ..check import run_checks
    outs: dict[str, bytes] = {}
    report = run_checks(inv, full=True, master_port=master_port, on_stdout=outs.__setitem__,
                        env_looks={h.name: env_nodes.look_args(h, by_host[h.name]) for h in inv.hosts
                                   if h.name in by_host})
    hosts = [h for h in inv.hosts if h.name in by_host]
    facts, said, envs = {}, {}, {}
    for h in hosts:
        try:
            facts[h.name] = env_nodes.looked(h.name, outs.get(h.name, b""))
        except HostError as e:  # the checks say why it did not answer
            said[h.name] = f"environment not looked at: {str(e).splitlines()[0]}"
            envs[h.name] = {"state": "unknown", "error": str(e)}
    refused = None
    for name, p in env_nodes.plans_each([h for h in hosts if h.name in facts], facts, by_host).items():
        if isinstance(p, Exception):
            refused = refused or p
            eid = env_nodes.env_id(by_host[name].sha256, facts[name])
            said[name] = f"environment {eid} cannot be built: {str(p).splitlines()[0]}"
            envs[name] = {"env_id": eid, "state": "cannot be built", "error": str(p)}
        else:
            said[name] = p.says()
            envs[name] = {"env_id": p.env_id, "ready": p.ready, "to_send": p.to_send,
                          "state": "ready" if p.ready else "will be built"}
    if not quiet or refused:
        for h in hosts:
            line = visible(f"env  {h.name} {said[h.name]}")
            if quiet:  # --json: stdout is the report's
                err(line)
            else:
                print(line)
    if refused is not None:
        raise refused
    return report, envs


def _environments(inv: Inventory, quiet: bool) -> tuple[Inventory, dict]:
    """With `packages:`: each host's environment, said (ready, or will be built and the bytes it lacks) before
    the checks, which then look at a ready one's python; a lock that is not one, or a package with no wheel
    for a host, is refused (exit 2). The JSON report's ``environments``."""
    from ..envs import nodes as env_nodes
    from ..fleet import Fleet
    by_host = env_nodes.locks(inv)
    if not by_host:
        return inv, {}
    with Fleet(inv.hosts, fanout=inv.fanout) as fleet:
        plans = env_nodes.survey(fleet, inv.hosts, by_host)
    out = {h: {"env_id": p.env_id, "ready": p.ready, "to_send": p.to_send} for h, p in plans.items()}
    if not quiet:
        for h, p in plans.items():
            print(visible(f"env  {h} {p.says()}"))
    ready = {h: env_nodes.Made(h, p.env_id, p.python, p.lock.sha256, 0, False) for h, p in plans.items() if p.ready}
    return env_nodes.apply(inv, ready), out


def notify_reach(inv: Inventory) -> list:
    """Whether node 0 reaches each webhook of the inventory's notify: (node 0 tells a detached run's end):
    (host, Finding) each; a target that cannot be read is a warning here (`up` refuses it, exit 2)."""
    from .. import notify
    from ..check import WARN, Finding, receiver_reach
    from ..errors import ClusterDDPError
    try:
        targets = notify.targets_for(inv.notify, ())
    except ClusterDDPError as e:
        return [(inv.master.host, Finding("notify", WARN, "?", e.message, e.hint))]
    return receiver_reach(inv, notify.receivers(targets))


def print_report(report: Report, took: float) -> bool:
    """The report as a table, then each problem and its fix as plain lines, then the verdict;
    True when every host passed. Values and problems quote nodes (versions, errors): escaped."""
    from rich.console import Console
    from rich.table import Table

    from ..check import FAIL, WARN

    console = Console(highlight=False, soft_wrap=False, width=None if is_tty() else 200)
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    table.add_column("host")
    for c in report.checks:
        table.add_column(c)
    table.add_column("verdict")
    for h in report.hosts:
        cells = []
        for c in report.checks:
            f = h.get(c)
            cells.append("[dim]-[/dim]" if f is None else f"[{_STYLE[f.status]}]{_escape(f.value)}[/]")
        verdict = {"ok": "PASS", "warn": "PASS (warn)", "fail": "FAIL"}[h.status]
        table.add_row(h.host, *cells, f"[{_STYLE[h.status]}]{verdict}[/]")
    console.print(table)
    # Problems as plain lines (never wrapped or cut by the table): host, what, and the fix.
    for status, word in ((FAIL, "FAIL"), (WARN, "warn")):
        for host, f in report.problems(status):
            print(f"{word} {host} {f.check}: {visible(f.problem or '')}")
            if f.fix:
                print(f"     fix: {visible(f.fix)}")
    for h in report.hosts:  # what clusterddp will do about a setup that needs no fixing
        for f in h.findings:
            if f.note:
                print(f"note {h.host} {f.check}: {visible(f.note)}")
    n = len(report.hosts)
    bad = [h.host for h in report.hosts if h.status == FAIL]
    warned = len(report.problems(WARN))
    note = f" ({warned} warning{'s' * (warned != 1)})" if warned else ""
    if bad:
        print(f"FAIL: {len(bad)} of {n} host(s) not ready: {', '.join(bad)}{note} [{took:.1f}s]")
    else:
        print(f"PASS: all {n} host(s) ready{note} [{took:.1f}s]")
    sys.stdout.flush()
    return not bad


def _escape(text: str) -> str:
    from rich.markup import escape
    return escape(visible(text))
