"""`clusterddp leases INVENTORY [--json]`: who holds which GPU slots on each node, and who waits."""

from __future__ import annotations

import json

import typer

from .common import EXIT_FAILED, FANOUT, HOSTS, err, handle_errors, load_inventory, visible


@handle_errors
def leases(
    inventory: str = typer.Argument(..., help="Inventory YAML file."),
    hosts: str | None = HOSTS,
    fanout: int | None = FANOUT,
    as_json: bool = typer.Option(False, "--json", help="One JSON object: every host's leases and queue."),
) -> None:
    """List the GPU slot leases and the queue on every host (read from each node's lease folder)."""
    from ..fleet import Fleet
    from ..leases import read_views
    inv = load_inventory(inventory, hosts, fanout)
    from ..backends import for_inventory, on_hosts
    on_hosts(for_inventory(inv), "leases", inv)
    from ..quarantine import quarantined, stamp
    aside = quarantined(inv.hosts)  # set aside on this machine: no run of ours takes their slots
    with Fleet(inv.hosts, fanout=inv.fanout) as fleet:
        res = read_views(fleet, inv.hosts)
    if as_json:
        doc = {"hosts": [{"host": h, "error": str(v)} if isinstance(v, Exception) else {
            "host": h, "capacity": v.capacity, "free": sorted(v.free), "unreadable": v.garbled,
            "leases": [{"run": x.run, "name": x.name, "user": x.user, "since": x.since, "slots": list(x.slots),
                        "port": x.port, "state": x.state} for x in v.holders],
            "queue": [{"ticket": w.ticket, "run": w.run, "name": w.name, "user": w.user, "since": w.since,
                       "need": w.need, "slots": list(w.slots) if w.slots else None} for w in v.waiting]}
            for h, v in res.items()], "quarantined": {h: e.to_json() for h, e in aside.items()}}
        print(json.dumps(doc, indent=2))
    else:
        rows = [("HOST", "GPUS", "FREE", "RUN", "USER", "SINCE", "SLOTS", "PORT", "STATE")]
        waits = []
        for h, v in res.items():
            if isinstance(v, Exception):
                continue
            free = ",".join(map(str, sorted(v.free))) or "-"
            if not v.holders:
                rows.append((h, str(v.capacity), free, "-", "", "", "", "", ""))
            for x in v.holders:
                run = x.run + (f" ({x.name})" if x.name else "")
                rows.append((h, str(v.capacity), free, run, x.user, x.since, ",".join(map(str, x.slots)),
                             str(x.port or ""), x.state))
            if v.garbled:
                waits.append(f"{h}: {v.garbled} unreadable lease file(s)")
            for i, w in enumerate(v.waiting, 1):
                wants = f"slots {','.join(map(str, w.slots))}" if w.slots else f"{w.need or 'every'} slot(s)"
                waits.append(f"{h}: {i}. {w.who} waits since {w.since} for {wants}")
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            print(visible("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()))
        if waits:
            print("queue:")
            for line in waits:
                print(visible("  " + line))
        for h, entry in aside.items():
            print(visible(f"{h}: quarantined until {stamp(entry.until)}: {entry.why}"))
    for h, e in res.failed.items():
        err(f"{h}: cannot read its leases: {e}")
    if res.failed:
        raise typer.Exit(EXIT_FAILED)
