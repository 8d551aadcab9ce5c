"""The `clusterddp` command. Each verb lives in its own module; heavy imports happen inside them."""

from __future__ import annotations

import typer

from . import collect as collect_cmd
from . import metrics as metrics_cmd
from . import notify as notify_cmd
from . import prune as prune_cmd
from . import quarantine as quarantine_cmd
from . import runs as runs_cmd
from . import schedule as schedule_cmd
from . import schema as schema_cmd
from . import up as up_cmd
from .check import check as check_cmd
from .examples import epilog
from .exec_ import exec_ as exec_cmd
from .leases import leases as leases_cmd
from .script_args import ScriptCommand
from .stacks import stacks as stacks_cmd
from .top import top as top_cmd

# add_completion: --install-completion/--show-completion; typer imports its completion code anyway, so
# --help is no slower with them (measured).
app = typer.Typer(no_args_is_help=True, add_completion=True, pretty_exceptions_enable=False,
                  help="Start PyTorch DDP training on several machines over SSH, from one command.")
app.command("up", cls=ScriptCommand, context_settings={"help_option_names": ["-h", "--help"]},
            epilog=epilog("up"))(up_cmd.up)
for _verb in ("runs", "status", "logs", "stop"):
    app.command(_verb, epilog=epilog(_verb))(getattr(runs_cmd, _verb))
app.command("collect", epilog=epilog("collect"))(collect_cmd.collect)
app.add_typer(schedule_cmd.app, name="schedule")
app.add_typer(notify_cmd.app, name="notify")
app.add_typer(quarantine_cmd.app, name="quarantine")
app.command("check", epilog=epilog("check"))(check_cmd)
app.command("exec", epilog=epilog("exec"))(exec_cmd)
app.command("prune", epilog=epilog("prune"))(prune_cmd.prune)
app.command("schema", epilog=epilog("schema"))(schema_cmd.schema)
app.command("top", epilog=epilog("top"))(top_cmd)
app.command("leases", epilog=epilog("leases"))(leases_cmd)
app.command("stacks", epilog=epilog("stacks"))(stacks_cmd)
app.command("metrics", epilog=epilog("metrics"))(metrics_cmd.metrics)
app.command("report", epilog=epilog("report"))(metrics_cmd.report)


def _show_version(value: bool) -> None:
    if value:
        from .. import __version__
        typer.echo(f"clusterddp {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", is_eager=True, callback=_show_version,
                                        help="Print clusterddp's version and exit.")) -> None:
    """Start PyTorch DDP training on several machines over SSH, from one command."""


def main() -> None:
    from .pipes import guard
    guard()  # a closed stdout (`| head -1`) ends no command halfway: see cli/pipes.py
    try:
        app()
    except SystemExit as e:
        from .common import exit_at_interrupt, quick_exit
        quick_exit(e.code)
        exit_at_interrupt(e.code if isinstance(e.code, int) else 1)
        raise
