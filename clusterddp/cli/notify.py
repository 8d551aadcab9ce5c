"""`clusterddp notify test INVENTORY`: send a test event to every notification target."""

from __future__ import annotations

import typer

from .common import EXIT_USAGE, INVENTORY, err, handle_errors, option, visible
from .examples import epilog

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Notifications: where a run's end is told (the inventory's notify:, --notify).")


@app.command("test", epilog=epilog("notify test"))
@handle_errors
def test(inventory: str = INVENTORY, notify: list[str] = option("notify")) -> None:
    """Send a test event to every target of INVENTORY's notify: (and each --notify), whatever its `on`;
    say what each answered. Exit 1 when one could not be told, 2 when there is none."""
    from .. import notify as notifier
    from ..backends import load_inventory
    from ..inventory import LOCAL

    inv = load_inventory(inventory)
    targets = notifier.targets_for(() if inventory == LOCAL else inv.notify, notify)
    if not targets:
        err(f"error: {inventory} has no notify: targets and no --notify was given; nothing to test\n"
            "  add notify: [{webhook_file: ~/.config/clusterddp/slack.url}] to the inventory, or pass --notify @FILE")
        raise typer.Exit(EXIT_USAGE)
    event = notifier.test_event(inv.name)
    failed = 0
    for d in notifier.deliver(targets, event):
        if d.ok:
            print(visible(f"told {notifier.label(d.target)}: {d.said}"), flush=True)
        else:
            failed += 1
            err(visible(d.line(event).replace("; the run's outcome is unchanged", "")))
    if failed:
        raise typer.Exit(1)
