"""Commands that take ``SCRIPT [-- ARGS...]``: the script's own options typed without ``--``.

``clusterddp up inv.yaml train.py --epochs 1`` is the most common slip: click would answer
"No such option: --epochs (Possible options: --detach)", which points at the wrong fix. These
commands say that the script's arguments go after ``--`` and print the command as it should be.
"""

from __future__ import annotations

import difflib
import shlex
from typing import Any

import typer
from typer.core import TyperCommand

from .common import EXIT_USAGE, err

try:  # typer 0.28 ships its own copy of click (private, but what its commands raise and are built on)
    from typer._click.exceptions import NoSuchOption
except ImportError:  # pragma: no cover - typer < 0.28 uses the click package
    from click import NoSuchOption  # type: ignore[no-redef,import-not-found,assignment,unused-ignore]


class ScriptCommand(TyperCommand):
    """A Typer command whose unknown options are reported as script arguments missing their ``--``."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        original = list(args)  # click consumes the list it parses
        try:
            return super().parse_args(ctx, args)
        except NoSuchOption as e:
            # Printed here, not raised as click's UsageError: its box would wrap the command to copy.
            err(f"error: {explain(self, ctx.command_path, e.option_name, original)}")
            raise typer.Exit(EXIT_USAGE) from None


def explain(cmd: Any, command_path: str, option: str, args: list[str]) -> str:
    """What to say about ``option``, unknown to ``cmd``: a typo of one of its options, or (most
    often) the script's own option, with the command line that passes it to the script."""
    names = [n for p in cmd.params if p.param_type_name == "option" for n in (*p.opts, *p.secondary_opts)]
    close = difflib.get_close_matches(option, names, n=1, cutoff=0.8)
    fixed = corrected(cmd, args)
    usage = " ".join(n.upper() for n in _fixed_names(cmd))
    msg = f"`{command_path}` has no option {option}"
    msg += (f" (did you mean {close[0]}?); if {option} is meant for the script, it goes after `--`" if close
            else "; the script's own arguments go after `--`")
    if fixed is None:
        return msg + f", at the end: {command_path} [OPTIONS] {usage} -- SCRIPT_ARGS..."
    return msg + ":\n  " + shlex.join([*command_path.split(), *fixed])


def _fixed_names(cmd: Any) -> list[str]:
    return [p.name or "" for p in cmd.params if p.param_type_name == "argument" and p.nargs == 1]


def corrected(cmd: Any, args: list[str]) -> list[str] | None:
    """``args`` with every token that is not one of ``cmd``'s options or fixed arguments moved after
    ``--`` (ahead of what already followed it), or None when the fixed arguments (``INVENTORY
    SCRIPT``) were not all given before the first unknown option, so the intent is unclear."""
    takes_value: dict[str, bool] = {}
    for p in cmd.params:
        if p.param_type_name == "option":
            for name in (*p.opts, *p.secondary_opts):
                takes_value[name] = not (p.is_flag or p.count)
    fixed = len(_fixed_names(cmd))
    head, sep, tail = _split(args)
    ours: list[str] = []
    theirs: list[str] = []
    positionals = 0
    i = 0
    while i < len(head):
        tok = head[i]
        name = tok.split("=", 1)[0]
        if not tok.startswith("--") and takes_value.get(tok[:2]) and len(tok) > 2:
            ours.append(tok)  # -eNAME=VALUE: a short option with its value attached
        elif name in takes_value:
            ours.append(tok)
            if takes_value[name] and "=" not in tok and i + 1 < len(head):
                ours.append(head[i + 1])
                i += 1
        elif tok.startswith("-") and tok != "-":
            if positionals < fixed:
                return None
            theirs.append(tok)
        elif positionals < fixed:
            ours.append(tok)
            positionals += 1
        else:
            theirs.append(tok)
        i += 1
    return [*ours, "--", *theirs, *(tail if sep else [])]


def _split(args: list[str]) -> tuple[list[str], bool, list[str]]:
    if "--" in args:
        i = args.index("--")
        return args[:i], True, args[i + 1:]
    return args, False, []
