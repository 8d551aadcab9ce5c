"""The options the commands share, each declared once: the launch options as Typer options (from
their one declaration in :data:`clusterddp.launch.OPTIONS`), ``--runs-dir``, ``--hosts``,
``--exclude`` and ``--fanout``, and the decorator that gives a command every launch option it
takes without a parameter of its own for each."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import typer

from .. import launch

F = TypeVar("F", bound=Callable)

RUNS_DIR = typer.Option("./runs", "--runs-dir", envvar="CLUSTERDDP_RUNS_DIR",
                        help="Folder holding run records, logs and artifacts.")


def option(name: str) -> Any:
    """The Typer option of the launch option ``name``, from its one declaration in :data:`clusterddp.launch.OPTIONS`."""
    o = launch.BY_NAME[name]
    low, high = ((int(v) if o.kind == "int" and v is not None else v) for v in (o.low, o.high))
    return typer.Option([] if o.kind == "texts" else o.default, *o.flags, help=o.help or None, metavar=o.metavar,
                        envvar=o.envvar, min=low, max=high)


_ANNOTATION: dict[str, Any] = {"text": str | None, "int": int | None, "float": float, "bool": bool,
                               "texts": list[str]}


def launch_options(names: Iterable[str], into: str = "options") -> Callable[[F], F]:
    """Give the decorated command the launch options ``names`` as parameters, each declared as
    :func:`option` declares it (in the order of :data:`clusterddp.launch.OPTIONS`); the command
    receives their values as one argument, ``into`` (name -> value). A new launch option reaches
    `up` with its entry in ``launch.OPTIONS`` alone."""
    wanted = set(names)
    chosen = [o for o in launch.OPTIONS if o.name in wanted]

    def decorate(fn: F) -> F:
        sig = inspect.signature(fn)
        own = [p for p in sig.parameters.values() if p.name != into]
        extra = [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=option(o.name),
                                   annotation=_ANNOTATION[o.kind] if o.default is None or o.kind != "text" else str)
                 for o in chosen]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            values = {o.name: kwargs.pop(o.name) for o in chosen}
            return fn(*args, **{into: values}, **kwargs)
        wrapper.__signature__ = sig.replace(parameters=[*own, *extra])  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]
    return decorate


def with_recorded_options(fn: F) -> F:
    """Give ``fn`` (`schedule add`) every launch option a spec records in its `up` object
    (:data:`clusterddp.launch.RECORDED`) as a parameter, declared as `up` declares it; ``fn``
    receives their values as one argument, ``up_options`` (name -> value)."""
    return launch_options((o.name for o in launch.RECORDED), into="up_options")(fn)


# The options of a run, shared by `up` and `schedule add` (which records them for cron).
INVENTORY = typer.Argument(..., help="Inventory YAML file, or `local` for this machine's GPUs.")
SCRIPT_ARGS = typer.Argument(None, help="Arguments for the script, after `--`.")
RUN_NAME = option("name")
# --hosts and --exclude of every command that runs on an inventory's hosts (up, schedule add, check, exec, leases)
HOSTS = option("hosts")
EXCLUDE = option("exclude")
FANOUT = typer.Option(None, "--fanout", min=1, max=1024,
                      help="Hosts contacted at once (default: the inventory's `fanout`, else 32).")
MAX_GPUS = launch.MAX_GPUS
GPUS = option("gpus")
MASTER_PORT = option("master_port")
ENV = option("env")
COLLECT = option("collect")
MAX_RESTARTS = option("max_restarts")
LOCAL_RANK_ARG = option("local_rank_arg")
MAX_UPLOAD = option("max_upload")
QUIET = option("quiet")
RAW = option("raw")
