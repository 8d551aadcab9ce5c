"""Preflight checks: will these hosts run a DDP job together?

Most failed multi-node runs fail before training starts: a host that does not answer, a
changed host key, another torch or Python on one node, fewer GPUs than the inventory says,
the master port in use, no route to the master, a full disk. Each host runs one probe
(:func:`probe_command`, a single SSH command, whose node side and reply parser
are :mod:`clusterddp.node.probe`); everything else here is pure: :func:`evaluate` turns every host's facts into
findings, comparing the hosts with each other (versions must be identical everywhere; the
majority, or on a tie the earliest host, is the reference that the odd ones are named against).
:func:`run_checks` is the one function that touches the network.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources

from . import __version__
from .errors import HostError, HostErrorKind, PreflightFailed
from .fleet import Fleet, HostResult
from .inventory import Host, Inventory
from .node import probe as node_probe
from .node import reply as node_reply
from .node.probe import ProbeError, parse_reply
from .nodescript import CONTROL, IFACE_FN, NodeCommand, env_stdin, preamble, python_command, q
from .runspec import master_port_of
from .sizes import human_size

OK, WARN, FAIL = "ok", "warn", "fail"
_RANK = {OK: 0, WARN: 1, FAIL: 2}

# The table's columns. The quick set is what `up` checks before starting a job: it needs no
# torch import and no nvidia-smi, so it costs one short SSH command per host.
FULL_CHECKS = ("ssh", "python", "torch", "cuda", "nccl", "gpus", "iface", "port", "disk", "clock", "workdir",
               "train")
QUICK_CHECKS = ("ssh", "python", "torch", "cuda", "iface", "port")

MIN_FREE_DISK = 1 << 30          # below this a run's checkpoints will not fit: fail
LOW_FREE_DISK = 10 << 30         # below this: warn
WARN_SKEW_S = 1.0                # clock skew against this machine: warn above, fail above FAIL_SKEW_S
FAIL_SKEW_S = 60.0
PROBE_TIMEOUT_S = 60.0           # the full probe imports torch, which takes seconds on a busy node


@dataclass(frozen=True)
class Finding:
    """One check on one host: a short ``value`` for the table and, unless ok, what is wrong and the fix."""

    check: str
    status: str
    value: str
    problem: str | None = None
    fix: str | None = None
    note: str | None = None    # what clusterddp will do about something that is no problem


@dataclass(frozen=True)
class HostReport:
    host: str
    address: str
    findings: tuple[Finding, ...]
    facts: dict | None = None  # the parsed probe; None when the host could not be probed

    @property
    def status(self) -> str:
        return max((f.status for f in self.findings), key=_RANK.__getitem__, default=OK)

    def get(self, check: str) -> Finding | None:
        return next((f for f in self.findings if f.check == check), None)


@dataclass(frozen=True)
class Report:
    """Every host's findings; ``ok`` unless some finding failed."""

    hosts: tuple[HostReport, ...]
    checks: tuple[str, ...] = FULL_CHECKS

    @property
    def ok(self) -> bool:
        return all(h.status != FAIL for h in self.hosts)

    def problems(self, status: str = FAIL) -> list[tuple[str, Finding]]:
        return [(h.host, f) for h in self.hosts for f in h.findings if f.status == status]

    def to_dict(self) -> dict:
        return {"ok": self.ok, "checks": list(self.checks), "hosts": [
            {"host": h.host, "address": h.address, "status": h.status, "facts": h.facts,
             "checks": [f.__dict__ for f in h.findings]} for h in self.hosts]}

    def summary(self) -> str:
        """The failures as text: one line per problem naming the host, then its fix."""
        lines = []
        for host, f in self.problems(FAIL):
            lines.append(f"  {host}: {f.problem}")
            if f.fix:
                lines.append(f"    fix: {f.fix}")
        return "\n".join(lines)


def preflight_failed(report: Report, inventory_path: str) -> PreflightFailed:
    """The error `up` raises when its preflight found problems: each failing host and the report."""
    return PreflightFailed([h.host for h in report.hosts if h.status == FAIL], report.summary(),
                           inventory_path, report)


# ---- pure ----

def human_bytes(n: float) -> str:
    return human_size(n, short=True)


def _reference(values: dict[str, str | None]) -> str | None:
    """The value most hosts have; on a tie, the earliest host's (dicts keep inventory order)."""
    if not values:
        return None
    counts = Counter(values.values())
    best = max(counts.values())
    return next(v for v in values.values() if counts[v] == best)


def _named(hosts: list[str], limit: int = 3) -> str:
    return ", ".join(hosts[:limit]) + (f" and {len(hosts) - limit} more" if len(hosts) > limit else "")


def _same(check: str, values: dict[str, str | None], show: Callable[[str | None], str],
          fix: Callable[[str, str | None], str]) -> dict[str, Finding]:
    """Compare one value across hosts: the odd ones fail, named against the reference hosts."""
    ref = _reference(values)
    ref_hosts = [h for h, v in values.items() if v == ref]
    out = {}
    for h, v in values.items():
        if v == ref:
            out[h] = Finding(check, OK, show(v))
        else:
            out[h] = Finding(check, FAIL, show(v), f"{check} {show(v)} differs from {show(ref)} on "
                             f"{_named(ref_hosts)}; every node must run the same {check}", fix(h, ref))
    return out


_SSH_VALUE = {
    HostErrorKind.HOST_KEY_UNKNOWN: "host key unknown",
    HostErrorKind.HOST_KEY_CHANGED: "host key CHANGED",
    HostErrorKind.AUTH_REFUSED: "auth failed",
    HostErrorKind.TIMEOUT: "timeout",
    HostErrorKind.UNREACHABLE: "unreachable",
    HostErrorKind.CONNECTION_LOST: "connection lost",
    HostErrorKind.CONFIG: "ssh_config",
    HostErrorKind.KEY_FILE: "key file",
    HostErrorKind.OTHER: "failed",
}


def _ssh_finding(e: HostError) -> Finding:
    return Finding("ssh", FAIL, _SSH_VALUE[e.kind], e.detail, e.hint)


def _torch(host: Host, f: dict, compared: Finding | None, ref: str | None) -> Finding:
    """A missing or broken torch says so, rather than only "differs"."""
    pin = f"=={ref.split('+')[0]}" if ref else ""
    if f.get("torch") and f.get("torch_error"):  # installed, but `import torch` failed
        return Finding("torch", FAIL, "broken", f"{host.python}: {f['torch_error']}",
                       f"reinstall it: `{host.python} -m pip install --force-reinstall "
                       f"torch=={f['torch'].split('+')[0]}`")
    if compared is None:
        why = f" ({f['torch_error']})" if f.get("torch_error") else ""
        return Finding("torch", FAIL, "missing", f"torch is not importable by {host.python}{why}",
                       f"install it: `{host.python} -m pip install torch{pin}`, or point `python` "
                       "at the interpreter that has it")
    return compared


def _gpus(host: Host, f: dict) -> Finding:
    seen, want = f.get("gpus"), host.gpus
    if f.get("gpu_error"):
        return Finding("gpus", FAIL, "nvidia-smi error", f"nvidia-smi failed: {f['gpu_error']}",
                       "fix the NVIDIA driver on this node (`nvidia-smi` must list the GPUs)")
    if seen is None:  # no nvidia-smi: a CPU node; a fixed count is processes per node (gloo)
        value = "no GPU" + (f", {want} procs" if isinstance(want, int) else ", 1 proc")
        return Finding("gpus", OK, value)
    if isinstance(want, int) and want > seen:
        return Finding("gpus", FAIL, f"{seen} < {want}",
                       f"the inventory says gpus: {want}, but nvidia-smi sees {seen}",
                       f"set gpus: {seen} (or auto) for {host.name}, or find out where the missing GPUs went")
    if seen and not f.get("cuda") and f.get("torch"):
        return Finding("gpus", FAIL, f"{seen} (CPU torch)",
                       f"nvidia-smi sees {seen} GPU(s) but torch {f['torch']} is a CPU-only build",
                       "install a CUDA build of torch on this node")
    return Finding("gpus", OK, f"{seen}" + (f" (uses {want})" if isinstance(want, int) and want < seen else ""))


_IFNAME_KEYS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def _iface(host: Host, f: dict, master_addr: str, nnodes: int) -> Finding:
    env = dict(host.env)
    named = {k: env.get(k) or (f.get("env_ifname") or {}).get(k) for k in _IFNAME_KEYS}
    have = f.get("interfaces")
    for k, name in named.items():
        # a plain name can be checked; NCCL's prefix, ^exclude and =exact forms are left to NCCL
        if name and have is not None and not any(c in name for c in ",^=") and name not in have:
            return Finding("iface", FAIL, f"{name}?", f"{k}={name}, but this node has no interface {name} "
                           f"(it has {', '.join(have)})",
                           f"set {k} to one of those, or remove it to use the interface that routes to "
                           f"the master")
    if named["NCCL_SOCKET_IFNAME"] and named["GLOO_SOCKET_IFNAME"]:
        return Finding("iface", OK, f"{named['GLOO_SOCKET_IFNAME']} (env)")
    iface = f.get("iface")
    if not iface and f.get("ip_tool") is False:
        return Finding("iface", WARN, "unknown", "cannot tell which interface routes to the master: "
                       "`ip` (iproute2) is not installed here", "install iproute2, or set NCCL_SOCKET_IFNAME "
                       "and GLOO_SOCKET_IFNAME in the inventory env")
    if not iface:
        return Finding("iface", FAIL, "no route", f"no interface on this node routes to the master address "
                       f"{master_addr}", "check the network and master.addr, or set NCCL_SOCKET_IFNAME and "
                       "GLOO_SOCKET_IFNAME in the inventory env")
    if iface == "lo" and nnodes > 1:
        return Finding("iface", FAIL, "lo", f"the master address {master_addr} is a loopback address here, "
                       "so the other nodes cannot reach the master through it",
                       "set master.addr in the inventory to an address every node reaches")
    return Finding("iface", OK, iface)


def _port(f: dict, port: int, fixed: bool) -> Finding:
    if f.get("port_free"):
        return Finding("port", OK, f"{port} free")
    why = f.get("port_error") or "in use"
    if not fixed:  # `up` leases the next free port from this one: nothing will fail
        return Finding("port", WARN, f"{port} busy", f"the master port {port} cannot be bound ({why}); `up` "
                       "will choose the next free one", "nothing to do; set master.port to pin a port")
    return Finding("port", FAIL, f"{port} busy", f"the master port {port} cannot be bound ({why})",
                   f"stop what listens there (`ss -ltnp 'sport = :{port}'` shows it), or choose another "
                   f"port with --master-port or master.port in the inventory")


def _disk(host: Host, f: dict) -> Finding:
    if f.get("disk_error"):
        return Finding("disk", WARN, "unknown", f"cannot tell the free space of {host.workdir}: {f['disk_error']}")
    free, where = f.get("disk_free", 0), f.get("disk_path", host.workdir)
    value = f"{human_bytes(free)} free"
    if not f.get("disk_writable", True):
        return Finding("disk", FAIL, "not writable", f"cannot write to {where} (workdir: {host.workdir})",
                       "make it writable for this user, or set workdir to a folder this user owns")
    if free < MIN_FREE_DISK:
        return Finding("disk", FAIL, value, f"only {human_bytes(free)} free in {where}",
                       "free some space (old runs live in <workdir>/runs/), or point workdir at a larger disk")
    if free < LOW_FREE_DISK:
        return Finding("disk", WARN, value, f"only {human_bytes(free)} free in {where}; checkpoints may not fit",
                       "free some space, e.g. old runs in <workdir>/runs/")
    return Finding("disk", OK, value if f.get("workdir_exists", True) else f"{value} (new)")


def _clock(f: dict, r: HostResult) -> Finding:
    # The node stamps its time just before answering; the answer reaches us a few ms later.
    skew = f["time"] - r.ended
    value = f"{skew:+.1f}s"
    if abs(skew) > FAIL_SKEW_S:
        return Finding("clock", FAIL, value, f"clock is {abs(skew):.0f}s {'ahead of' if skew > 0 else 'behind'} "
                       "this machine's", "enable time sync on the node (`timedatectl set-ntp true`, or chrony)")
    if abs(skew) > WARN_SKEW_S:
        return Finding("clock", WARN, value, f"clock is {abs(skew):.1f}s off this machine's; logs will not line up",
                       "enable time sync on the node (`timedatectl set-ntp true`, or chrony)")
    return Finding("clock", OK, value)


def _workdirs(hosts: dict[str, Host], facts: dict[str, dict]) -> dict[str, Finding]:
    """Hosts that read one id from the workdir marker (clusterddp/node/probe.py) share one workdir
    folder: say so, and (once, on the first of them) what clusterddp does about it."""
    sharing: dict[str, list[str]] = {}
    for h, f in facts.items():
        if f.get("workdir_id"):
            sharing.setdefault(f["workdir_id"], []).append(h)
    out = {}
    for h, f in facts.items():
        if f.get("workdir_id_error"):
            out[h] = Finding("workdir", WARN, "unknown", f"cannot tell whether workdir {hosts[h].workdir} is shared "
                             f"with other hosts: {f['workdir_id_error']}",
                             "make workdir a folder this user can create and write")
        elif f.get("workdir_id"):
            group = sharing[f["workdir_id"]]
            if len(group) == 1:
                out[h] = Finding("workdir", OK, "own")
                continue
            note = None
            if h == group[0]:
                note = (f"{_named(group, 6)} share one workdir folder (a shared file system: a marker one host "
                        f"wrote there is seen by the others). clusterddp handles it: each run's code is unpacked "
                        f"into <workdir>/runs/<run_id>/ once, by the first host to get there; each host keeps "
                        f"its own control files (launch.sh, node.log, pid, exit_code) in "
                        f"<workdir>/runs/<run_id>/{CONTROL}/<host>/; `collect` brings the run folder's files "
                        f"back from each host, so shared files arrive once per host")
            out[h] = Finding("workdir", OK, f"shared ({len(group)} hosts)", note=note)
    return out


@functools.cache
def _launcher_train_sha256() -> str:
    return hashlib.sha256(resources.files("clusterddp").joinpath("train.py").read_bytes()).hexdigest()


def _train(host: Host, f: dict) -> Finding | None:
    """Which clusterddp.train a script imports on this host: the copy each run ships (when its python
    has no clusterddp), or the node's own, which always wins and is named when it differs."""
    py, ver = host.python, __version__
    fix = (f"install this launcher's clusterddp there (`{py} -m pip install clusterddp=={ver}`), or uninstall "
           f"it (`{py} -m pip uninstall clusterddp`) so that each run ships the launcher's clusterddp.train")
    if f.get("train_error"):
        return Finding("train", WARN, "not shipped", f"{py} has a clusterddp that gives no clusterddp.train "
                       f"({f['train_error']}); it is not shipped there, since an installed clusterddp is never "
                       "shadowed", fix)
    if "train" not in f:  # a quick probe does not look
        return None
    if f["train"] is None:
        return Finding("train", OK, "shipped")
    if f.get("train_sha256") == _launcher_train_sha256():
        return Finding("train", OK, "installed")
    return Finding("train", WARN, "installed, differs",
                   f"{py} has its own clusterddp.train ({f['train']}), which differs from this launcher's "
                   f"(clusterddp {ver}); scripts on this node import the node's own, since an installed "
                   "clusterddp is never shadowed", fix)


def evaluate(inventory: Inventory, results: Iterable[HostResult], *, full: bool = True,
             master_port: int | None = None, check_port: bool = True, port_fixed: bool = True) -> Report:
    """Turn each host's probe result into findings; compare versions across hosts. ``port_fixed``
    False: a busy master port is only a warning, since `up` then chooses a free one."""
    hosts = {h.name: h for h in inventory.hosts}
    results = list(results)
    port, _ = master_port_of(master_port, inventory)
    master = inventory.master.host
    per_host: dict[str, list[Finding]] = {r.host: [] for r in results}
    facts: dict[str, dict] = {}
    for r in results:
        h = hosts[r.host]
        if r.error is not None:
            per_host[r.host].append(_ssh_finding(r.error))
            continue
        per_host[r.host].append(Finding("ssh", OK, "ok"))
        assert r.result is not None
        try:
            f = node_reply.one_line_each(parse_reply(r.result.stdout, r.result.stderr, r.result.exit_code))
            assert isinstance(f, dict)
        except ProbeError as e:
            missing = r.exit_code == 127
            if e.field is not None:  # it answered, but not as the probe does: nothing of it is used
                per_host[r.host].append(Finding(
                    "python", FAIL, "bad reply", f"{h.python} ran the probe, but its reply is unusable: {e}",
                    "check that `python` for this host is a plain CPython and that its setup lines and "
                    "login files do not print a line starting with the probe's marker"))
                continue
            per_host[r.host].append(Finding(
                "python", FAIL, "not found" if missing else "probe failed",
                f"{h.python} {'was not found' if missing else 'could not run the probe'}: {e}",
                "set `python` for this host in the inventory to an interpreter that exists there "
                "(or fix its setup lines)"))
            continue
        if "setup_failed" in f:
            err = r.result.stderr.decode("utf-8", "replace").strip().splitlines() if r.result else []
            per_host[r.host].append(Finding(
                "setup", FAIL, "failed", f"setup line failed: {f['setup_failed']}"
                + (f" ({err[-1]})" if err else ""), "fix the line in the inventory, or the node's environment"))
            continue
        facts[r.host] = f

    # Versions are compared among the hosts that have them: a missing torch is its own failure.
    with_torch = [h for h, f in facts.items() if f.get("torch")]
    torch_v = {h: facts[h]["torch"] for h in with_torch}
    py = _same("python", {h: f.get("python") for h, f in facts.items()}, lambda v: v or "?", lambda h, ref: (
        f"point `python` for {h} at a Python {ref} interpreter (now {hosts[h].python}), "
        "or install that version there"))
    tv = _same("torch", torch_v, lambda v: v or "missing", lambda h, ref: (
        f"install the same torch as the others: "
        f"`{hosts[h].python} -m pip install torch=={(ref or '').split('+')[0]}`"))
    cu = _same("cuda", {h: facts[h].get("cuda") for h in with_torch}, lambda v: v or "cpu", lambda h, ref: (
        f"install the torch build for CUDA {ref}" if ref else "install the CPU build of torch, as on the others"))
    nc = _same("nccl", {h: facts[h]["nccl"] for h in with_torch if facts[h].get("nccl")}, lambda v: v or "-",
               lambda h, ref: f"install torch with NCCL {ref} (the same torch build as the others)")
    torch_ref = _reference(torch_v)
    workdirs = _workdirs(hosts, facts)
    by_host = {r.host: r for r in results}
    for host, f in facts.items():
        h, r = hosts[host], by_host[host]
        found = per_host[host]
        found += [py[host], _torch(h, f, tv.get(host), torch_ref), cu.get(host, Finding("cuda", OK, "-"))]
        if full:
            found.append(nc.get(host, Finding("nccl", OK, "-")))
        if full:
            found.append(_gpus(h, f))
        found.append(_iface(h, f, inventory.master.addr, len(inventory.hosts)))
        if host == master and check_port:
            found.append(_port(f, port, port_fixed))
        if full:
            found.append(_disk(h, f))
            if isinstance(f.get("time"), (int, float)) and r.ended:
                found.append(_clock(f, r))
            if host in workdirs:
                found.append(workdirs[host])
            train = _train(h, f)
            if train:
                found.append(train)
    if full:  # two inventory entries on one machine: two node ranks there, rarely meant
        names = Counter(f.get("hostname") for f in facts.values())
        for host, f in facts.items():
            twins = [o for o, g in facts.items() if o != host and g.get("hostname") == f.get("hostname")]
            if f.get("hostname") and names[f.get("hostname")] > 1:
                per_host[host].append(Finding("machine", WARN, f["hostname"],
                                              f"same machine as {_named(twins)} (hostname {f['hostname']})",
                                              "list each machine once, unless two node ranks there is meant"))
    return Report(tuple(HostReport(r.host, hosts[r.host].address, tuple(per_host[r.host]), facts.get(r.host))
                        for r in results), FULL_CHECKS if full else QUICK_CHECKS)


# ---- effects: probe every host ----

def run_checks(inventory: Inventory, *, full: bool = True, master_port: int | None = None,
               fleet: Fleet | None = None, env: dict[str, tuple[tuple[str, str], ...]] | None = None,
               timeout: float = PROBE_TIMEOUT_S, check_port: bool = True, env_looks: dict[str, dict] | None = None,
               on_stdout: Callable[[str, bytes], None] | None = None) -> Report:
    """Probe every host of ``inventory`` once, in parallel, and evaluate. ``env`` (by host) replaces
    the inventory's env in the probe, as a run's ``-e`` would. Uses ``fleet``'s connections if given
    (they stay open for the caller); otherwise opens and closes its own. ``check_port`` False: the
    master port is not probed (`up` chooses a free one with its lease). ``env_looks`` (by host: the
    `packages:` environment's look, :func:`clusterddp.envs.nodes.look_args`): that host's probe looks at its
    environment first, in the same command, and runs with its python when it is ready; ``on_stdout(host,
    bytes)`` is given each host's output (the look's answer is in it)."""
    port, port_fixed = master_port_of(master_port, inventory)

    def command(h: Host) -> NodeCommand:  # the env goes on stdin, off the command line
        probe_port = port if check_port and h.name == inventory.master.host else None
        return probe_command(h, inventory.master.addr, probe_port, full=full, env=(env or {}).get(h.name),
                             env_look=(env_looks or {}).get(h.name))
    own = fleet is None
    fleet = fleet or Fleet(inventory.hosts, fanout=inventory.fanout)
    try:
        results = fleet.run(command, timeout=timeout)
    finally:
        if own:
            fleet.close()
    for r in results:
        if on_stdout is not None and r.result is not None:
            on_stdout(r.host, r.result.stdout)
    return evaluate(inventory, results, full=full, master_port=port, check_port=check_port, port_fixed=port_fixed)


# ---- a detached run's notifications: can node 0 reach each receiver ----

REACH_S = 5.0  # one TCP connect from node 0 to a webhook's host


def receiver_reach(inventory: Inventory, receivers: Iterable[tuple[str, str, int]], *,
                   seconds: float = REACH_S) -> list[tuple[str, Finding]]:
    """Whether node 0 (the master host, which tells a detached run's end) opens a TCP connection to
    each receiver ((label, host, port): :func:`clusterddp.notify.receivers`) within ``seconds``: one
    bounded probe per receiver, over one connection; (node 0's name, finding) each. An attached run
    needs none of it (its launcher tells), so a receiver out of reach is a warning."""
    receivers = list(receivers)
    master = next((h for h in inventory.hosts if h.name == inventory.master.host), None)
    if not receivers or master is None:
        return []
    from .node.notify import parse_reach
    out: list[tuple[str, Finding]] = []
    with Fleet([master], fanout=1) as fleet:
        for what, host, port in receivers:
            where = f"{host}:{port}"
            fix = (f"let {master.name} open connections to {where} (a firewall rule, or a proxy: HTTPS_PROXY in the "
                   "host's setup lines); until then leave --detach out, so that this machine tells the run's end")
            (r,) = fleet.run(reach_command(master, host, port, seconds), timeout=seconds + 30)
            if r.error is not None:
                out.append((master.name, Finding("notify", WARN, "?", f"{what}: cannot ask whether it reaches "
                                                 f"{where}: {r.error}", "run `clusterddp check` again once it "
                                                 "answers")))
                continue
            try:
                got = parse_reach(r.result.text if r.result is not None else "")
            except ValueError as e:
                out.append((master.name, Finding("notify", WARN, "?", f"{what}: unreadable answer of the reach "
                                                 f"probe: {e}", None)))
                continue
            if got["ok"]:
                out.append((master.name, Finding("notify", OK, f"{where} {got['s']:.2f}s")))
            else:
                out.append((master.name, Finding(
                    "notify", WARN, "unreachable", f"{what}: node 0 cannot reach {where} ({got['said']}), so a "
                    "detached run's end, which node 0 tells, would not arrive", fix)))
    return out


def reach_command(host: Host, address: str, port: int, seconds: float) -> str:
    """Can ``host`` open a TCP connection to a notification receiver (``address:port``) within
    ``seconds``: the node program ``notify reach``, after the host's setup lines."""
    lines = preamble(host, (), stdout_to=">/dev/null 2>&1", on_fail=lambda line: "true")
    return "\n".join([*lines, python_command(host.python, "notify", ["reach", q(address), str(int(port)),
                                                                     f"{seconds:g}"])])


# ---- the node side: the probe, and a receiver's reach (moved from plan.py) ----

def probe_command(host: Host, master_addr: str, master_port: int | None, *, full: bool = True,
                  env: tuple[tuple[str, str], ...] | None = None, env_look: dict | None = None) -> NodeCommand:
    """One command that reports what the preflight checks need about ``host``, as one JSON line.

    It runs the host's setup lines and exports its env first (read from its stdin), as launch.sh does, then its
    ``python``. ``master_port`` is given for the master only (it tries to bind it). ``full``
    also imports torch (NCCL version, a broken install) and asks nvidia-smi for the GPUs;
    without it the probe takes a fraction of a second (what ``up`` runs before starting).
    """
    args = {"full": full, "port": master_port, "workdir": host.workdir}
    env = host.env if env is None else env
    lines = preamble(host, env, stdout_to=">&2", env_on_stdin=True,
                      on_fail=lambda line: f"echo {q(node_probe.setup_failed_reply(line))}; exit 0")
    probe = python_command(host.python, "probe", [q(json.dumps(args)), '"$IFACE"'], site=True)
    if env_look is not None:  # `packages:`: its environment looked at first; the probe runs with its python once ready
        probe = python_command(host.python, "envbuild", ["lookexec", q(json.dumps(env_look))]) + probe[len(
            q(host.python)):]
    lines += [IFACE_FN, f"IFACE=$(cddp_iface {q(master_addr)})", "exec " + probe]
    return NodeCommand("\n".join(lines), env_stdin(env))
