"""The inventory as frozen data: hosts, master (or a backend's own settings), and the names and defaults they obey.

Nothing here reads a file or knows the YAML shape (that is :mod:`.loader` and its parsers), so a
run record, `up local` or ``--help`` import this without yaml or the schema. The environment names
a job may not set (:func:`reserved_env`) are kept here too, for the inventory and ``-e`` alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import InventoryError

LOCAL = "local"
# Validate with .fullmatch() only: `$` would also accept a trailing newline ("local\n").
HOST_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # it names <host>.log: short enough for any file system
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Environment names a job may not set (inventory env, `-e`): clusterddp, launch.sh or torchrun set
# them on the node, so a value there would hide the job from stop/teardown, move where the exit code
# goes, or be silently overwritten. Each with what to do instead.
_RESERVED_HINT = {
    "clusterddp": "clusterddp sets CLUSTERDDP_* on every node (CLUSTERDDP_JOB is how stop and teardown find the "
                  "job's processes); use another name",
    "launch.sh": "launch.sh uses it for itself (CTL is the control folder the exit code goes to; NPROC, IFACE and "
                 "LOCAL_ADDR are probed on the node); use another name",
    "torchrun": "torchrun sets it for every worker, so this value would be ignored; the master is `master:` or "
                "--master-port, processes per node `gpus` or --gpus",
    "torchrun option": "torchrun reads it as the option clusterddp passes or decides (node rank, master, "
                       "rendezvous); set `master:`, `gpus`, --master-port or --max-restarts instead",
}
RESERVED_ENV = {
    **dict.fromkeys(("CTL", "NPROC", "IFACE", "LOCAL_ADDR"), "launch.sh"),
    **dict.fromkeys(("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "WORLD_SIZE",
                     "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                     "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
                     "TORCHELASTIC_USE_AGENT_STORE"), "torchrun"),
    **dict.fromkeys((f"PET_{o}" for o in ("NNODES", "NODE_RANK", "NPROC_PER_NODE", "MASTER_ADDR", "MASTER_PORT",
                                          "MAX_RESTARTS", "RDZV_BACKEND", "RDZV_ENDPOINT", "RDZV_ID", "RDZV_CONF",
                                          "STANDALONE", "LOCAL_ADDR")), "torchrun option"),
}


# What a job may set among clusterddp's names: a setting of the job's own pythons (docs/script-environment.md).
JOB_SETTINGS = frozenset({"CLUSTERDDP_QUICK_EXIT"})


def reserved_env(name: str) -> str | None:
    """Why a job may not set ``name`` and what to do instead, or None when it may."""
    if name.startswith("CLUSTERDDP_") and name not in JOB_SETTINGS:
        return _RESERVED_HINT["clusterddp"]
    owner = RESERVED_ENV.get(name)
    return _RESERVED_HINT[owner] if owner else None


def ascii_digits(text: str) -> bool:
    """Whether ``text`` is one or more ASCII digits: ``str.isdigit`` also takes ``²``, which ``int()``
    refuses, and Arabic-Indic digits, which ``int()`` silently reads; a count or a port is 0-9 only."""
    return text.isascii() and text.isdigit()


# C0 controls, DEL and C1 controls: a newline or an escape sequence in an address, a path or a glob
# is a mistake (or an attempt to forge terminal output).
CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f]")


def control_problem(text: str) -> str | None:
    """What is wrong with ``text`` as one-line text (a control character, named and placed), or None."""
    bad = CONTROL_RE.search(text)
    return None if bad is None else (f"holds the control character U+{ord(bad.group()):04X} at position "
                                     f"{bad.start() + 1}; remove it")


def glob_problem(glob: str) -> str | None:
    """What is wrong with a ``collect`` glob (the inventory's or --collect's), or None: the node's own
    rule (relative to the run folder, no ``..``), and one line of text."""
    from ..node.collect import glob_parts  # the node program's rule, so both ends refuse the same globs
    problem = control_problem(glob)
    if problem is None and glob_parts(glob) is None:
        problem = "must be relative to the run folder, without .. (e.g. checkpoints/**)"
    return problem


def show(text: str, limit: int = 40) -> str:
    """User text for a message: quoted, control characters escaped, cut at ``limit`` characters."""
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def some(names: list[str], limit: int = 8) -> str:
    """The first ``limit`` of ``names`` for a message, comma-separated, each shown safely; the rest counted."""
    shown = ", ".join(show(n)[1:-1] if n.isprintable() and len(n) <= 40 else show(n) for n in names[:limit])
    return shown + (f" (and {len(names) - limit} more)" if len(names) > limit else "")


BUILTIN: dict[str, Any] = dict(host_key_policy="strict", gpus="auto", python="python3", workdir="~/clusterddp",
                               known_hosts="~/.ssh/known_hosts", connect_timeout=10.0, keepalive=5.0)
DEFAULT_MASTER_PORT = 29500  # the first port tried when the master port is chosen
DEFAULT_FANOUT = 32  # hosts contacted at once by fleet commands, like pdsh's default
DEFAULT_QUARANTINE_S = 2 * 3600.0  # `quarantine:`: a machine at fault is set aside for 2 h
MAX_GPUS = 1024  # processes per node (`gpus`, --gpus): far above any machine, low enough for torchrun's numbers


@dataclass(frozen=True)
class Host:
    """One node, with defaults merged in. ``None`` means: let ssh_config or the SSH library decide."""

    name: str
    address: str
    user: str | None
    port: int | None
    identity_file: str | None
    known_hosts: str
    host_key_policy: str
    gpus: int | str  # a count, or "auto"
    python: str
    workdir: str
    env: tuple[tuple[str, str], ...]
    setup: tuple[str, ...]
    connect_timeout: float
    transport: str = "ssh"  # "ssh" or "local" (a node no inventory lists is a Node, not a Host)
    keepalive: float = BUILTIN["keepalive"]  # seconds between SSH keepalives; 0: none
    slots: tuple[int, ...] | None = None  # a fixed choice of GPU slots (`gpus: [0, 1]`); gpus is then their count
    lease_dir: str | None = None  # the node's lease folder; None: <workdir>/leases/%h (%h: the node's hostname)
    # where identity_file was set (`lab.yaml:7: hosts[1].identity_file`), for the message when that
    # file cannot be read; None where it was not set or is not from a file
    identity_from: str | None = None
    packages: str | None = None  # `packages:`: the lock file (absolute) its job's environment is built from
    env_id: str | None = None  # the id of the environment its job ran in (set once it is ready: python is its python)
    lock_sha256: str | None = None  # the sha256 of the lock that environment was built from
    wheels: str = "push"  # `packages: {wheels: push|index}`: this machine sends the wheels, or the node's index
    # `packages: {index_url: URL}`: the index the node installs from (wheels: index); a secret (credentials): not in
    # a repr, never recorded in run.json, sent to the node on stdin only
    index_url: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Node:
    """A run's node that no inventory lists (a Slurm node: its backend allocated it, and reaches it through
    the run only, never by a connection of its own): what the code that renders a node's commands and
    shows it reads, and nothing of SSH's. The other kind of run node is an inventory's :class:`Host`."""

    name: str
    address: str
    python: str
    workdir: str                        # its shared folder (the run's folders are under it)
    env: tuple[tuple[str, str], ...] = ()
    setup: tuple[str, ...] = ()
    gpus: int | str = 1                 # a count, or "auto"
    connect_timeout: float = BUILTIN["connect_timeout"]  # how long a command on it may take to answer
    env_id: str | None = None       # as Host's: the environment its job ran in, where one was built
    lock_sha256: str | None = None


RunNode = Host | Node  # a run's node: a host an inventory lists, or a node its backend reaches


@dataclass(frozen=True)
class Master:
    host: str
    addr: str
    port: int
    port_fixed: bool = False  # master.port was written in the inventory; otherwise a free one is chosen from it


# What a run tells its notification targets (`notify:`, --notify): its end, by how it ended
# ("hang", "idle": a failed run the stall watchdog or the idle policy ended), a schedule's firing skipped, and a
# straggler named while an attached run goes (clusterddp.stragglers; told only to a target whose `on` names it).
NOTIFY_EVENTS = ("succeeded", "failed", "hang", "idle", "stopped", "interrupted", "skipped", "straggler")
NOTIFY_KINDS = ("webhook", "webhook_file", "command")


# What a notify command may name, filled in from values of a fixed alphabet (words, run ids, host and
# schedule names), so that substituting them into shell text can never add a word or a quote.
NOTIFY_FIELDS = ("event", "status", "run_id", "host", "schedule")


def webhook_problem(url: str) -> str | None:
    """What is wrong with ``url`` as a webhook, or None. The message never quotes the URL (a secret)."""
    from urllib.parse import urlsplit
    if CONTROL_RE.search(url) or " " in url:
        return "a webhook URL holds no spaces or control characters"
    try:
        parts = urlsplit(url)
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        return "is not a URL"
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        return "must be an http:// or https:// URL with a host, e.g. https://hooks.slack.com/services/..."
    from ..node.notify import link_local
    if link_local(parts.hostname) or parts.hostname.rstrip(".").lower() in METADATA_HOSTS:
        return ("names a link-local address or a cloud's metadata service (169.254.0.0/16, fe80::/10, "
                f"{parts.hostname}), never a webhook receiver; give the receiver's own address")
    return None


# Names of a cloud's instance metadata service, refused as webhook hosts as its link-local address is
METADATA_HOSTS = ("metadata.google.internal", "metadata.goog", "metadata", "instance-data",
                  "instance-data.ec2.internal")


def notify_command_problem(command: str) -> str | None:
    """What is wrong with a notify ``command``, or None: one line, and only :data:`NOTIFY_FIELDS` in braces."""
    import string
    problem = control_problem(command)
    if problem or not command.strip():
        return problem or "is empty"
    known = ", ".join("{" + f + "}" for f in NOTIFY_FIELDS)
    try:
        parsed = list(string.Formatter().parse(command))
    except ValueError as e:
        return f"{e} (write {{{{ and }}}} for a brace; the fields are {known})"
    for _, name, spec, conv in parsed:
        if name is not None and (name not in NOTIFY_FIELDS or spec or conv):
            return f"{{{name}}} is not a field it can name; use {known} (write {{{{ and }}}} for a brace)"
    return None


@dataclass(frozen=True)
class NotifyTarget:
    """Where events are told (:mod:`clusterddp.notify` sends them): a ``webhook`` URL (a secret: it
    carries a token, so it is never shown; not in the repr), a ``webhook_file`` holding one (an
    absolute path), or a shell ``command`` that gets the event as JSON on stdin. ``on``: the events
    it wants (empty: every one); ``timeout``: seconds for one try; ``where``: what names it in a
    message (``lab.yaml: notify[0]``, ``--notify``)."""

    kind: str
    value: str = field(repr=False)
    on: tuple[str, ...] = ()
    timeout: float = 10.0
    where: str = ""


@dataclass(frozen=True)
class Inventory:
    """A validated inventory: hosts in inventory order, or none where its backend allocates them (a
    backend's section of the file, such as `slurm:`: ``backend`` names it, ``backend_settings`` holds
    what that backend read, opaque here; :mod:`.section`)."""

    path: str
    name: str
    hosts: tuple[Host, ...]
    master: Master
    collect: tuple[str, ...] = field(default=())
    fanout: int = DEFAULT_FANOUT  # at most this many hosts are contacted at once
    keep_runs: int | None = None  # `up` prunes this inventory's runs to the newest N after each run
    backend: str = "ssh"           # the backend that runs it: the registry's name (the file's section key)
    backend_settings: Any = None   # that backend's settings, as its Section read them (None: a list of hosts)
    stall_timeout: float | None = None   # `up`'s stall watchdog, seconds (--stall-timeout wins); None: off
    progress_regex: str | None = None    # what a progress line is for it (--progress-regex wins); None: any line
    metrics_interval: float | None = None  # `metrics_interval:` the sampler's (--metrics-interval wins); None: 5 s
    metrics_regex: str | None = None     # `metrics_regex:` numbers in the job's lines (--metrics-regex wins)
    idle_policy: tuple[float, float, bool] | None = None  # `idle_policy:` (below %, seconds, stop); None: off
    notify: tuple[NotifyTarget, ...] = ()  # `notify:`: told when a run ends (clusterddp.notify)
    quarantine_s: float = DEFAULT_QUARANTINE_S  # `quarantine:`: how long a machine at fault is set aside
    retry_job_failures: bool = False     # `retry_job_failures:`: a failure of the job moves to a spare too
    quarantine_stragglers: bool = False  # `quarantine_stragglers:`: a straggler of an attached run gets a strike
    # `spares:`: hosts that replace a host lost during a run (the SSH backend's attempt loop), in order
    spares: tuple[Host, ...] = ()
    restarts: int | None = None  # `restarts:`: new attempts after a machine's failure (--max-restarts wins)
    checkpoints: tuple[str, ...] = ()  # `checkpoints:`: what the mirror takes (clusterddp.mirror; --checkpoints wins)

    def ranked(self) -> list[Host]:
        """The hosts in node-rank order: the master first (node rank 0 serves torchrun's static
        rendezvous store at the master's address), then the others in inventory order."""
        return sorted(self.hosts, key=lambda h: h.name != self.master.host)

    def select(self, names: list[str]) -> Inventory:
        """The same inventory restricted to ``names`` (kept in inventory order; its spares kept)."""
        known = {h.name for h in self.hosts}
        unknown = [n for n in names if n not in known]
        if unknown:
            spare = [n for n in unknown if n in {s.name for s in self.spares}]
            raise InventoryError(self.path, f"--hosts names {some(unknown)}, not in the inventory's hosts"
                                 + (f" ({some(spare)}: a spare, used only to replace a lost host)" if spare else ""),
                                 hint=f"choose from: {some(sorted(known))}"
                                 + ("; to run on a spare from the start, list it under hosts:" if spare else ""))
        return self.in_use(tuple(h for h in self.hosts if h.name in names))

    def in_use(self, hosts: tuple[Host, ...], spares: tuple[Host, ...] | None = None) -> Inventory:
        """The same inventory running on ``hosts`` (in the order given: a run's hosts in inventory order,
        then the spares that replaced lost ones), with ``spares`` left (default: its own). The master
        stays where it is when it is among them; otherwise the first of them leads."""
        master = self.master
        if master.host not in {h.name for h in hosts}:  # the master left: the first host leads
            master = Master(hosts[0].name, hosts[0].address, master.port, master.port_fixed)
        return Inventory(self.path, self.name, hosts, master, self.collect, self.fanout, keep_runs=self.keep_runs,
                         stall_timeout=self.stall_timeout, progress_regex=self.progress_regex,
                         metrics_interval=self.metrics_interval, metrics_regex=self.metrics_regex,
                         idle_policy=self.idle_policy,
                         notify=self.notify, quarantine_s=self.quarantine_s,
                         retry_job_failures=self.retry_job_failures, quarantine_stragglers=self.quarantine_stragglers,
                         spares=self.spares if spares is None else spares,
                         restarts=self.restarts, checkpoints=self.checkpoints)

    def narrow(self, hosts: list[str] | None = None, exclude: list[str] | None = None) -> Inventory:
        """``--hosts`` then ``--exclude``: the chosen hosts (all when None) less the excluded ones,
        in inventory order. Every name given must be one of the inventory's hosts; ``--exclude`` may also
        name spares, which are then left out of the run too (``--hosts`` chooses among hosts only)."""
        inv = self if hosts is None else self.select(hosts)
        if not exclude:
            return inv
        known = {h.name for h in self.hosts} | {s.name for s in self.spares}
        unknown = [n for n in exclude if n not in known]
        if unknown:
            raise InventoryError(self.path, f"--exclude names {some(unknown)}, not in the inventory",
                                 hint=f"choose from: {some(sorted(known))}")
        left = [h.name for h in inv.hosts if h.name not in exclude]
        if not left:
            raise InventoryError(self.path, "--exclude leaves no host to run on",
                                 hint="exclude fewer hosts" + (" or choose others with --hosts" if hosts else ""))
        narrowed = inv.select(left)
        return narrowed.in_use(narrowed.hosts, tuple(s for s in inv.spares if s.name not in exclude))
