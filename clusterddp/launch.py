"""The options of a launch (`clusterddp up`), each declared once: its flag, type, bounds and help.

The CLI makes its Typer options from :data:`OPTIONS` (``cli.common.option``), so `up` and
`schedule add` declare the same thing; a schedule's spec records each one and gives it back to
`up` when it fires (:mod:`clusterddp.schedule.spec`). Where the spec keeps an option is
``recorded``: a field of the spec (the options older specs already held, under their own keys),
``UP`` (the spec's ``up`` object, by name: every option added since; nothing to write for a new
one), or ``None`` for the few a schedule does not record (and why, in ``help``).

Adding an option to `up`: one entry here (`up` takes every option here as a parameter:
``cli.options.launch_options``); a :class:`~clusterddp.runspec.RunSpec` field of the same name if a
backend reads it (``cli.flags.run_spec`` fills it by name); its line in :func:`clusterddp.runspec.resolve`
if the inventory has a say too (flag > host entry > inventory defaults > built-in); and its use.
``tests/launch/test_launch_options.py`` checks that every `up` option is here and round-trips through a spec.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .inventory.model import MAX_GPUS

UP = "up"  # recorded in the spec's generic `up` object


@dataclass(frozen=True)
class Option:
    """One launch option. ``kind``: ``text`` (a value or None), ``int``/``float`` (within ``low``..``high``),
    ``bool`` (a flag), ``texts`` (repeatable)."""

    name: str                       # the `up` parameter's name, and the key in the spec's `up` object
    flags: tuple[str, ...]
    kind: str
    default: Any
    help: str
    recorded: str | None = UP       # where a schedule's spec keeps it (see the module docstring)
    low: float | None = None
    high: float | None = None
    metavar: str | None = None
    envvar: str | None = None

    @property
    def flag(self) -> str:
        return self.flags[-1] if self.flags[-1].startswith("--") else self.flags[0]

    def check(self, v: Any) -> str | None:
        """What is wrong with ``v`` as this option's value (from a spec file), or None."""
        if self.kind == "bool":
            return None if type(v) is bool else "expected true or false"
        if self.kind == "texts":
            ok = isinstance(v, list) and all(isinstance(x, str) and "\0" not in x for x in v)
            return None if ok else "expected a list of strings"
        if v is None:
            return None if self.default is None else "expected a value"
        if self.kind == "text":
            return None if isinstance(v, str) and "\0" not in v else "expected a string without NUL"
        if self.kind == "int" and type(v) is not int:  # isinstance would let true and false through
            return "expected a whole number"
        if self.kind == "float" and (type(v) not in (int, float) or not math.isfinite(v)):
            return "expected a number"
        if (self.low is not None and v < self.low) or (self.high is not None and v > self.high):
            return f"{v} is out of range ({self.low:g}..{'' if self.high is None else f'{self.high:g}'})"
        return None

    def argv(self, v: Any) -> list[str]:
        """The words that give `up` the value ``v`` (none for the default)."""
        if v == self.default or (self.kind == "texts" and not v):
            return []
        if self.kind == "bool":
            return [self.flag] if v else []
        if self.kind == "texts":
            return [w for x in v for w in (f"{self.flag}={x}",)]
        text = repr(v) if self.kind == "float" else str(v)
        return [f"{self.flag}={text}"]


OPTIONS: tuple[Option, ...] = (
    Option("name", ("--name",), "text", None, "A name for the run.", recorded="run_name"),
    Option("hosts", ("--hosts",), "text", None, "Only these hosts: a,b,c; for `up`, host:0,1 also picks its GPUs.",
           recorded="hosts"),
    Option("exclude", ("--exclude",), "text", None, "Leave these hosts out: a,b (after --hosts).",
           recorded="hosts"),  # `schedule add` records the hosts left, as --hosts
    Option("gpus", ("--gpus",), "int", None, "Processes per node (overrides the inventory).", recorded="gpus",
           low=1, high=MAX_GPUS),
    Option("master_port", ("--master-port",), "int", None, "", recorded="master_port", low=1, high=65535),
    Option("env", ("-e", "--env"), "texts", [], "NAME=VALUE for the job (repeatable); NAME alone passes this "
           "shell's value, @FILE reads NAME=VALUE lines: values on the command line show in `ps`.", recorded="env"),
    Option("collect", ("--collect",), "texts", [], "Glob to bring back, relative to the run folder.",
           recorded="collect"),
    Option("checkpoints", ("--checkpoints",), "texts", [], "Glob of the files that are the job's checkpoints, "
           "relative to the run folder (repeatable; over the inventory's checkpoints:): what is mirrored while an "
           "attached run goes on and what every node of a new attempt starts with. Default: *.pt, *.pth, *.ckpt, "
           "*.safetensors, snapshot* and checkpoint*/ files the job writes (docs/machine-dies.md).", metavar="GLOB"),
    Option("max_restarts", ("--max-restarts",), "int", 0, "Passed to torchrun; an attached SSH run also starts again "
           "up to N times after a machine's failure, a spare in place of each lost host (inventory spares:).",
           recorded="max_restarts", low=0),
    Option("nodes", ("--nodes",), "text", None, "SSH runs: start on the first MAX hosts; after a machine's failure "
           "with no healthy spare left, carry on with the hosts left, down to MIN (a count alone: MIN and MAX).",
           metavar="MIN:MAX"),
    Option("local_rank_arg", ("--local-rank-arg",), "text", None,
           "Give every worker --local_rank=<its LOCAL_RANK> (or --local-rank=...) before the script's arguments, "
           "as torch.distributed.launch did; for scripts that parse it. E.g. --local-rank-arg=--local_rank",
           recorded="local_rank_arg", metavar="--local_rank|--local-rank"),
    Option("wait", ("--wait",), "bool", False, "When the GPU slots are taken, wait in the queue for them "
           "instead of refusing (exit 75).", recorded="wait"),
    Option("max_upload", ("--max-upload",), "text", "1G", "Refuse to upload the script's folder above this size "
           "(e.g. 500M, 4G); see .clusterddpignore for leaving files out.", metavar="SIZE",
           envvar="CLUSTERDDP_MAX_UPLOAD"),
    Option("packages", ("--packages",), "text", None, "Build every node's Python environment from this lock file "
           "(pinned requirements or pylock.toml), over the inventory's packages: (SSH, Slurm and `up local` runs); "
           "the wheels are fetched here and sent to the nodes (a Slurm job's: to the shared folder) "
           "(docs/environments.md).", metavar="FILE"),
    Option("skip_check", ("--skip-check",), "bool", False, "Start without the preflight check (hosts answer, "
           "versions agree, master port free)."),
    Option("raw", ("--raw",), "bool", False, "Print the job's output bytes as they are (colours, control "
           "characters); by default control characters are shown as escapes like \\x1b."),
    Option("quiet", ("--quiet", "-q"), "bool", False, "Hide known torch noise on the terminal (the c10d 'hostname "
           "of the client socket' warning, torchrun's OMP_NUM_THREADS banner, the no-numpy warning); log files "
           "keep it.", envvar="CLUSTERDDP_QUIET"),
    Option("join_timeout", ("--join-timeout",), "float", 120.0, "Name and end a run whose nodes have not all "
           "joined the rendezvous S seconds after it started (0: wait as long as torch does).", low=0,
           metavar="S"),
    Option("notify", ("--notify",), "texts", [], "Also tell TARGET when the run ends (repeatable; besides the "
           "inventory's notify:): @FILE, a file holding a webhook URL (mode 0600: the URL is a secret, never given "
           "on a command line), or command:CMD, which gets the event as JSON on stdin.", metavar="TARGET"),
    Option("stall_timeout", ("--stall-timeout",), "float", None, "End the run as a hang, with every rank's stacks, "
           "when no rank has printed a progress line for S seconds (nodes watch themselves: detached runs too). "
           "Off by default; over the inventory's stall_timeout (0: off for this run). "
           "See docs/run-hangs.md, \"Choosing the stall timeout\".", low=0, metavar="S"),
    Option("progress_regex", ("--progress-regex",), "text", None, "With a stall timeout: only a line matching "
           "REGEX counts as progress (default: any line of the ranks' output but clusterddp's own and known "
           "torch noise); over the inventory's progress_regex.", metavar="REGEX"),
    Option("metrics_interval", ("--metrics-interval",), "float", None, "Seconds between two samples of each "
           "node's GPUs (nvidia-smi), CPU, memory, network, disk and the job's progress and numbers, kept with the run "
           "for `clusterddp metrics` and `report` (default 5; 0: no sampler); over the inventory's metrics_interval.",
           low=0, high=3600, metavar="S"),
    Option("metrics_regex", ("--metrics-regex",), "text", None, "Numbers in the job's output lines: a regular "
           "expression whose named groups name them, e.g. 'loss (?P<loss>[0-9.eE+-]+)'; over the inventory's "
           "metrics_regex (docs/watching.md).", metavar="REGEX"),
    Option("report", ("--report",), "text", None, "Write the run's HTML report (`clusterddp report`) to FILE when an "
           "attached run ends, whatever its outcome.", metavar="FILE"),
    Option("resume", ("--resume",), "text", None, "SSH runs: every node starts with the newest checkpoint that run "
           "RUN (of this script and inventory) left, at the same path under its run folder: from RUN's mirror, what "
           "was collected, or its nodes, sha256-checked. RUN: a run id (or its start or end), `last` (the newest "
           "earlier run of this script and inventory), or `previous` (the previous run of a schedule: for "
           "`schedule add`).", metavar="RUN"),
    Option("dry_run", ("--dry-run",), "bool", False, "Print what the run would do and contact no host: each "
           "node's torchrun command and env, what is uploaded and what is left out (secrets, inventories). Env "
           "values (-e, the inventory's env) are shown as ***.",
           recorded=None),  # a schedule that contacts no host runs nothing
    Option("full", ("--full",), "bool", False, "With --dry-run: print every node's whole start command and "
           "launch script (Slurm: job.sbatch and node.sh), exactly as a real run executes them.",
           recorded=None),  # only --dry-run prints them
    Option("show_secrets", ("--show-secrets",), "bool", False, "With --dry-run: show env values as they are.",
           recorded=None),  # only --dry-run prints them
    Option("detach", ("--detach", "-d"), "bool", False, "Start the job and return; it runs on without us.",
           recorded=None),  # `schedule fire` waits for its run: it holds the schedule's lock for it
)
BY_NAME = {o.name: o for o in OPTIONS}


MOST_NODES = 100_000


def parse_nodes(text: str | None) -> tuple[int, int] | None:
    """``--nodes``: ``MIN:MAX`` or a count ``N`` (``N:N``), 1 <= MIN <= MAX; None when not given.
    A UsageError (exit 2) naming the option and the fix otherwise."""
    from .errors import UsageError
    if text is None:
        return None
    lo, sep, hi = text.partition(":")
    hi = hi if sep else lo
    ok = all(p.isascii() and p.isdigit() and len(p) <= 6 for p in (lo, hi))
    if not ok or not 1 <= int(lo) <= int(hi) <= MOST_NODES:
        raise UsageError(f"--nodes {text!r}: not a node count or a range MIN:MAX with 1 <= MIN <= MAX",
                         "give e.g. --nodes 2:4 (start on 4 hosts, carry on down to 2) or --nodes 3")
    return int(lo), int(hi)
RECORDED = tuple(o for o in OPTIONS if o.recorded == UP)  # the ones the spec's `up` object holds
