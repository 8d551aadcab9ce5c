"""Commands that take ``SCRIPT [-- ARGS...]``: the script's own options typed without ``--``.

``clusterddp up inv.yaml train.py --epochs 1`` is the most common slip: click would answer
"No such option: --epochs (Possible options: --detach)", which points at the wrong fix. These
commands say that the script's arguments go after ``--`` and print the command as it should be.
The two other slips of the same line are caught here too, before anything starts: the script and
the inventory given the other way round (``up train.py inv.yaml``: an error, with the command as
it should be), and one of the command's own options typed after ``--`` (``-- --steps 3 --detach``:
a warning only, since a script may have an option of the same name).
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
            rest = super().parse_args(ctx, args)
        except NoSuchOption as e:
            # Printed here, not raised as click's UsageError: its box would wrap the command to copy.
            err(f"error: {explain(self, ctx.command_path, e.option_name, original)}")
            raise typer.Exit(EXIT_USAGE) from None
        if ctx.resilient_parsing:  # shell completion: nothing is run, nothing to say
            return rest
        problem = swapped(self, ctx.command_path, ctx.params, original)
        if problem:
            err(f"error: {problem}")
            raise typer.Exit(EXIT_USAGE)
        warning = ours_after_dashes(self, ctx.command_path, original)
        if warning:
            err(f"warning: {warning}")
        return rest


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


def looks_like_script(path: str) -> bool:
    """A Python script's name (never an inventory's: those are YAML files, hostfiles or `local`)."""
    return path.lower().endswith((".py", ".pyw"))


def swapped(cmd: Any, command_path: str, params: dict[str, Any], args: list[str]) -> str | None:
    """What to say when INVENTORY names a Python script and SCRIPT does not: the two were given the
    other way round (``up train.py inv.yaml``). Without this the script was read as YAML, and the
    error was a YAML syntax error about a line of Python."""
    inventory, script = params.get("inventory"), params.get("script")
    if not (isinstance(inventory, str) and isinstance(script, str)):
        return None
    if not looks_like_script(inventory) or looks_like_script(script):
        return None
    fixed = list(args)
    at = _positionals(cmd, args)
    names = _fixed_names(cmd)
    i, j = names.index("inventory"), names.index("script")
    if len(at) > max(i, j):
        fixed[at[i]], fixed[at[j]] = fixed[at[j]], fixed[at[i]]
    return (f"INVENTORY and SCRIPT are swapped: {inventory} is a Python script, {script} is not; "
            f"the inventory comes first:\n  " + shlex.join([*command_path.split(), *fixed]))


def ours_after_dashes(cmd: Any, command_path: str, args: list[str]) -> str | None:
    """A warning when a script argument (after ``--``) is exactly one of ``cmd``'s own options
    (``--detach``, ``--gpus=2``): it goes to the script, which most likely fails on it on every
    rank once the job has started. Not an error: a script may take an option of the same name.
    Names the options and prints the command with them (and their values) moved before ``--``."""
    head, sep, tail = _split(args)
    if not sep:
        return None
    takes_value = _takes_value(cmd)
    moved: list[str] = []
    kept: list[str] = []
    named: list[str] = []
    i = 0
    while i < len(tail):
        tok = tail[i]
        name = tok.split("=", 1)[0] if tok.startswith("--") else tok
        if name not in takes_value:
            kept.append(tok)
            i += 1
            continue
        named.append(name)
        moved.append(tok)
        if takes_value[name] and "=" not in tok and i + 1 < len(tail):
            moved.append(tail[i + 1])
            i += 1
        i += 1
    if not named:
        return None
    unique = list(dict.fromkeys(named))
    one = len(unique) == 1
    return (f"{', '.join(unique)} after `--` {'is' if one else 'are'} passed to the script, though "
            f"{'it is also an option' if one else 'they are also options'} of `{command_path}`; if meant for "
            f"`{command_path}`, put {'it' if one else 'them'} before `--`:\n  "
            + shlex.join([*command_path.split(), *head, *moved, "--", *kept]))


def _takes_value(cmd: Any) -> dict[str, bool]:
    """Each option name of ``cmd`` (long and short), and whether it takes a value."""
    out: dict[str, bool] = {}
    for p in cmd.params:
        if p.param_type_name == "option":
            for name in (*p.opts, *p.secondary_opts):
                out[name] = not (p.is_flag or p.count)
    return out


def _positionals(cmd: Any, args: list[str]) -> list[int]:
    """The indices in ``args`` (before ``--``) of the tokens click reads as positional arguments."""
    takes_value = _takes_value(cmd)
    head, _, _ = _split(args)
    out: list[int] = []
    i = 0
    while i < len(head):
        tok = head[i]
        name = tok.split("=", 1)[0]
        if name in takes_value:
            if takes_value[name] and "=" not in tok:
                i += 1  # its value
        elif not tok.startswith("-") or tok == "-":
            out.append(i)
        i += 1
    return out


def _fixed_names(cmd: Any) -> list[str]:
    return [p.name or "" for p in cmd.params if p.param_type_name == "argument" and p.nargs == 1]


def corrected(cmd: Any, args: list[str]) -> list[str] | None:
    """``args`` with every token that is not one of ``cmd``'s options or fixed arguments moved after
    ``--`` (ahead of what already followed it), or None when the fixed arguments (``INVENTORY
    SCRIPT``) were not all given before the first unknown option, so the intent is unclear."""
    takes_value = _takes_value(cmd)
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
