"""The flags' text read into values, each refusal a UsageError naming the flag and the fix:
``--hosts``/``--exclude`` (and ``host:0,1``), ``-e``, the globs, ``--local-rank-arg``, and the
run spec a command's launch options ask for."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .. import launch
from .output import err

if TYPE_CHECKING:
    from ..inventory import Inventory
    from ..runspec import RunSpec

MAX_GPUS = launch.MAX_GPUS


def run_spec(script: str, script_args: list[str] | None, options: Mapping[str, Any]) -> RunSpec:
    """The RunSpec (the flags, not yet resolved: :func:`clusterddp.runspec.resolve`) that the launch
    options ``options`` (name -> value, as :func:`~.options.launch_options` gives them) ask for: each
    RunSpec field named as a launch option is taken from it, ``-e``, the globs and ``--local-rank-arg``
    checked here."""
    import dataclasses

    from ..runspec import RunSpec
    fields = {f.name for f in dataclasses.fields(RunSpec)}
    read: dict[str, Callable[[Any], Any]] = {
        "env": parse_env, "collect": lambda g: _globs(g, "--collect", "e.g. --collect 'checkpoints/**'"),
        "checkpoints": checkpoint_globs, "local_rank_arg": local_rank_flag}
    given: dict[str, Any] = {}
    for name, value in options.items():
        if name not in fields or name not in launch.BY_NAME:
            continue
        if name in read:
            value = read[name](value)
        elif isinstance(value, list):
            value = tuple(value)
        given[name] = value
    return RunSpec(script=script, script_args=tuple(script_args or ()), **given)


def _globs(globs: list[str], flag: str, example: str) -> tuple[str, ...]:
    from ..errors import UsageError
    from ..inventory import glob_problem, show
    for g in globs:
        problem = glob_problem(g)
        if problem:
            raise UsageError(f"{flag} {show(g)}: {problem}", f"give a glob relative to the run folder, {example}")
    return tuple(globs)


def checkpoint_globs(globs: list[str]) -> tuple[str, ...]:
    """``--checkpoints`` globs, each checked as ``--collect``'s are (a UsageError naming a bad one)."""
    return _globs(globs, "--checkpoints", "e.g. --checkpoints 'out/*.pt'")


def local_rank_flag(value: str | None) -> str | None:
    """``--local-rank-arg``'s value as the flag workers get: ``--local_rank`` or ``--local-rank``."""
    if value is None:
        return None
    flag = "--" + value.lstrip("-")
    if flag not in ("--local_rank", "--local-rank"):
        from ..errors import UsageError
        from ..inventory import show
        raise UsageError(f"--local-rank-arg {show(value)}: expected --local_rank or --local-rank",
                         "the spelling your script's argparse knows, e.g. --local-rank-arg=--local_rank")
    return flag


def host_list(hosts: str | None, flag: str = "--hosts") -> list[str] | None:
    """``--hosts a,b`` (or ``--exclude a,b``) as a list, or None (no such flag)."""
    if hosts is None:
        return None
    names = [h.strip() for h in hosts.split(",") if h.strip()]
    if not names:
        from ..errors import UsageError
        from ..inventory import show
        raise UsageError(f"{flag} {show(hosts)} names no host", f"give host names from the inventory: {flag} a,b")
    return names


def load_inventory(arg: str, hosts: str | None = None, fanout: int | None = None, exclude: str | None = None,
                   gpus: int | None = None) -> Inventory:
    """The inventory a command names (a file, or `local`), narrowed to ``--hosts`` less ``--exclude``,
    with ``--fanout`` applied (the flag wins): :func:`clusterddp.backends.load_inventory` (a backend's section
    read by that backend), from the flags' text."""
    from ..backends import load_inventory as load
    return load(arg, gpus, host_list(hosts), host_list(exclude, "--exclude"), fanout)


def host_slots(hosts: str | None) -> tuple[list[str] | None, dict[str, tuple[int, ...]]]:
    """``--hosts gpu-01:0,1,gpu-02`` as the host names and each fixed choice of GPUs: after
    ``host:N``, the bare numbers that follow are more of that host's GPUs."""
    from ..errors import UsageError
    from ..inventory import ascii_digits, show
    names = host_list(hosts)
    if names is None:
        return None, {}
    out: list[str] = []
    slots: dict[str, list[int]] = {}
    last: str | None = None
    for word in names:
        name, colon, first = word.partition(":")
        if colon:
            last = name
            out.append(name)
            slots[name] = []
            word = first
        elif last is None or not ascii_digits(word):
            last = None
            out.append(word)
            continue
        if not ascii_digits(word) or len(word) > 4 or int(word) >= MAX_GPUS:
            raise UsageError(f"--hosts {show(hosts or '')}: {show(word)} is not a GPU number for {last}",
                             "give GPUs as numbers after the host: --hosts gpu-01:0,1,gpu-02:2,3")
        assert last is not None
        if int(word) in slots[last]:
            raise UsageError(f"--hosts {show(hosts or '')}: GPU {word} of {last} named twice", "name each GPU once")
        slots[last].append(int(word))
    return out, {h: tuple(sorted(s)) for h, s in slots.items()}




def parse_env(pairs: list[str]) -> tuple[tuple[str, str], ...]:
    """``-e`` flags as pairs (:func:`clusterddp.envfile.parse`); warnings go to stderr."""
    from .. import envfile
    return envfile.parse(pairs, err)
