"""`clusterddp exec INVENTORY [--hosts a,b] -- COMMAND...`: one command on every host, like pdsh."""

from __future__ import annotations

import secrets

import typer

from .common import (
    EXCLUDE,
    EXIT_FAILED,
    FANOUT,
    HOSTS,
    RAW,
    err,
    exit_quickly_when_done,
    handle_errors,
    load_inventory,
)

INTERRUPT_GRACE_S = 2.0  # after Ctrl-C: SIGTERM, then SIGKILL this much later


@handle_errors
def exec_(
    inventory: str = typer.Argument(..., help="Inventory YAML file."),
    command: list[str] | None = typer.Argument(None, help="The command, after `--`.", show_default=False),
    hosts: str | None = HOSTS,
    exclude: str | None = EXCLUDE,
    fanout: int | None = FANOUT,
    raw: bool = RAW,
    timeout: float | None = typer.Option(
        None, "--timeout", metavar="SECONDS", show_default=False,
        help="Per-host time limit: a host still running the command then is reported as timed out, the node "
             "ends the command (coreutils' timeout) and its connection is closed; the others keep their results. "
             "Default: none (exec also runs long installs)."),
) -> None:
    """Run COMMAND on every host in parallel; each output line is prefixed by its host.

    Like ssh and pdsh, the words are joined with spaces and run by the host's shell, after its setup lines and with its env.
    The env travels on the command's stdin (never on a command line), so COMMAND's stdin is empty.

    Quote what the remote shell must see whole: clusterddp exec inv.yaml -- 'du -sh ~/clusterddp/runs/*'

    Exit 0 only when every host exited 0; failed and unreachable hosts are listed at the end.
    """  # noqa: E501 - Typer's help keeps the docstring's line breaks, so a paragraph is one line
    from ..errors import UsageError
    from ..exec_ import EXEC_TIMED_OUT, exec_command

    exit_quickly_when_done()
    if not command:
        raise UsageError("no command given", "put it after `--`, e.g. clusterddp exec inv.yaml -- nvidia-smi")
    if timeout is not None and not 0 < timeout < float("inf"):
        raise UsageError(f"--timeout must be a positive number of seconds, got {timeout:g}",
                         "e.g. --timeout 30, or leave it out for no limit")
    inv = load_inventory(inventory, hosts, fanout, exclude)
    from ..backends import for_inventory, on_hosts
    on_hosts(for_inventory(inv), "exec", inv)
    from ..fleet import Fleet
    from .common import PrefixPrinter

    printer = PrefixPrinter([h.name for h in inv.hosts], raw=raw)
    marker = f"exec/{secrets.token_hex(8)}"
    try:
        with Fleet(inv.hosts, fanout=inv.fanout) as fleet:
            try:
                results = fleet.run(lambda h: exec_command(h, command, timeout, marker), on_output=printer,
                                    limit=timeout, timed_out_code=EXEC_TIMED_OUT)
            except KeyboardInterrupt:  # the command has no terminal: it would outlive its connection
                from ..nodeops import end_marked
                ended = end_marked(fleet, marker, INTERRUPT_GRACE_S)
                err(f"exec: interrupted; the command was ended on {len(ended.succeeded)} host(s)"
                    + "".join(f"\n  {h}: could not end it: {e}" for h, e in ended.failed.items()))
                raise
    finally:
        printer.flush()
    failed = [r for r in results if not r.ok]
    if failed:
        err(f"exec: {len(failed)} of {len(results)} host(s) failed:")
        for r in failed:
            err(f"  {r.error}".replace("\n", "\n  ") if r.error else f"  {r.host}: exit {r.exit_code}")
        raise typer.Exit(EXIT_FAILED)
