"""`clusterddp quarantine list|add|release`: the machines this launching machine sets aside."""

from __future__ import annotations

import json

import typer

from .common import handle_errors, load_inventory, visible
from .examples import epilog

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="The hosts set aside after machine-side failures (lost twice in a row), or by hand.")


@app.command("list", epilog=epilog("quarantine list"))
@handle_errors
def list_(as_json: bool = typer.Option(False, "--json", help="Print a JSON list.")) -> None:
    """Every host quarantined now: until when, why, and the run that set it aside."""
    from ..quarantine import Quarantine, stamp
    q = Quarantine()
    entries = sorted(q.entries(), key=lambda e: e.until)
    if as_json:
        print(json.dumps([e.to_json() for e in entries], indent=2))
        return
    if not entries:
        print(f"no host is quarantined ({q.path})")
        return
    for e in entries:
        print(visible(f"{e.host} ({e.machine}) until {stamp(e.until)}: {e.why}"))


@app.command("add", epilog=epilog("quarantine add"))
@handle_errors
def add(
    inventory: str = typer.Argument(..., help="Inventory YAML file that lists the host."),
    host: str = typer.Argument(..., help="The host's name in the inventory."),
    for_: str = typer.Option("2h", "--for", metavar="AGE", help="How long: 30m, 12h, 7d, 2w (at most 100 years)."),
    why: str = typer.Option("set aside by hand", "--why", help="One line saying why."),
) -> None:
    """Set HOST aside by hand: runs and schedules refuse it until the time is up or it is released."""
    import time

    from ..errors import UsageError
    from ..prune import parse_age
    from ..quarantine import MOST_FOR_S, MOST_TEXT, Entry, Quarantine, machine, stamp
    inv = load_inventory(inventory, None, None)
    found = [h for h in inv.hosts if h.name == host]
    if not found:
        raise UsageError(f"{host}: not a host of {inv.path}", f"choose from {', '.join(h.name for h in inv.hosts)}")
    if "\n" in why or len(why) > MOST_TEXT:
        raise UsageError(f"--why: one line of at most {MOST_TEXT} characters", "shorten it")
    seconds = parse_age(for_, "--for")
    if not seconds <= MOST_FOR_S:
        raise UsageError(f"--for {for_[:40]}: longer than 100 years",
                         "give at most 5200w; `clusterddp quarantine release` lets a host back at any time")
    h, now = found[0], time.time()
    e = Entry(machine(h.address, h.port), h.name, now, now + seconds, why, None)
    Quarantine().add([e])
    print(visible(f"{h.name} ({e.machine}) is quarantined until {stamp(e.until)}"))


@app.command("release", epilog=epilog("quarantine release"))
@handle_errors
def release(host: str = typer.Argument(..., help="The host: its inventory name, address, or address:port.")) -> None:
    """Let HOST back before its time is up."""
    from ..errors import UsageError
    from ..quarantine import Quarantine
    q = Quarantine()
    gone = q.release(host)
    if not gone:
        raise UsageError(f"{host}: not quarantined ({q.path})", "`clusterddp quarantine list` shows who is")
    for e in gone:
        print(visible(f"released {e.host} ({e.machine})"))
