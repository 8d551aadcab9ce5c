"""`check --collective`: can these hosts run a collective together, and how fast?

A short real job: :func:`run_collective` starts the node program
:mod:`clusterddp.node.collective` on every host at once (:func:`collective_command`: the host's
setup lines, env and python, and the interface a run would use), one process per host, NCCL when
every host has a GPU and gloo otherwise. It times ``all_reduce`` over all hosts at each size,
then over each pair of ring neighbours: a host's figures are those of its better pair, so a slow
host shows as slow in both of its pairs, a slow link in one.

:func:`evaluate` (pure) turns every host's output into a :class:`CollectiveReport`: the figures,
the hosts that never joined (and why, where it is known), and the hosts and links much slower
than the median (:data:`RULE`).
"""

from __future__ import annotations

import json
import statistics
import threading
from dataclasses import dataclass, field

from .fleet import Fleet, HostResult
from .inventory import Host, Inventory
from .node.collective import CollectiveReplyError, busbw, parse_output
from .nodescript import NodeCommand, env_stdin, iface_lines, preamble, python_command, q
from .runspec import master_port_of
from .sizes import human_size

KiB, MiB = 1 << 10, 1 << 20
SIZES = (1 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB)
GLOO_MAX = 16 * MiB       # gloo on CPU stops here: 64 MiB takes seconds per operation and says no more
JOIN_S = 20.0             # after the master is ready, how long a host may take to join
OP_S = 0.5                # a size whose one operation would take longer is not tried
BUDGET_S = 0.1            # seconds of operations timed per size and group, after the first
MAX_OUTPUT = 256 * KiB    # bytes kept of one host's output (the program prints a few KiB)

SLOW_BW = 5.0             # slow: bus bandwidth under 1/SLOW_BW of the median host's
SLOW_LAT = 5.0            # or latency above SLOW_LAT times the median host's,
SLOW_LAT_MIN_S = 0.001    # and at least this much above it (scheduling noise is not slowness)
RULE = (f"a host is slow when its bus bandwidth is under 1/{SLOW_BW:g} of the median host's, or its latency "
        f"over {SLOW_LAT:g}x the median host's and {SLOW_LAT_MIN_S * 1000:g} ms more (3 hosts or more); a link "
        f"when its bandwidth is under 1/{SLOW_BW:g} of both its hosts'. A host's figures are those of its "
        "better ring pair (all_reduce with the host before or after it): latency at the smallest size; bandwidth "
        "compared as the best figure up to the largest size every pair reached")

OK, SLOW, NEVER_JOINED, FAILED, NOT_MEASURED = "ok", "slow", "never joined", "failed", "not measured"


@dataclass(frozen=True)
class Figure:
    """all_reduce at one size: the slowest member's median seconds per operation."""

    size: int
    seconds: float
    busbw: float      # bytes/s


@dataclass(frozen=True)
class HostOutcome:
    host: str
    rank: int
    status: str
    latency: float | None = None      # seconds per operation at the smallest size
    bandwidth: Figure | None = None   # the best bus bandwidth
    problem: str | None = None
    fix: str | None = None
    facts: dict = field(default_factory=dict)   # torch, python, iface, addr, hostname, as the node said

    def to_dict(self) -> dict:
        bw = self.bandwidth
        return {"host": self.host, "rank": self.rank, "status": self.status, "latency_s": self.latency,
                "busbw_bytes_per_s": bw.busbw if bw else None, "busbw_size": bw.size if bw else None,
                "problem": self.problem, "fix": self.fix, "facts": self.facts}


@dataclass(frozen=True)
class Link:
    a: str
    b: str
    latency: float | None
    bandwidth: Figure | None
    slow: bool = False


@dataclass(frozen=True)
class CollectiveReport:
    hosts: tuple[HostOutcome, ...]
    backend: str | None
    world: tuple[Figure, ...]         # all hosts together, per size
    links: tuple[Link, ...]
    join_s: float
    master: str
    port: int

    @property
    def ok(self) -> bool:
        return all(h.status == OK for h in self.hosts) and not any(li.slow for li in self.links)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "backend": self.backend, "join_s": self.join_s, "master": self.master,
                "port": self.port, "rule": RULE,
                "world": [f.__dict__ for f in self.world],
                "hosts": [h.to_dict() for h in self.hosts],
                "links": [{"hosts": [li.a, li.b], "latency_s": li.latency, "slow": li.slow,
                           "busbw_bytes_per_s": li.bandwidth.busbw if li.bandwidth else None,
                           "busbw_size": li.bandwidth.size if li.bandwidth else None} for li in self.links]}


# ---- pure ----

def rate(bytes_per_s: float) -> str:
    """Decimal units, as nccl-tests prints them."""
    for unit in ("B/s", "kB/s", "MB/s", "GB/s"):
        if round(bytes_per_s) < 1000 or unit == "GB/s":
            digits = 0 if bytes_per_s >= 100 else 1 if bytes_per_s >= 10 else 2
            return f"{bytes_per_s:.{digits}f} {unit}"
        bytes_per_s /= 1000
    raise AssertionError


def size_text(n: int) -> str:
    return human_size(n, digits=0)


def _figures(sweeps: list[list[tuple[int, int, float, float]]], n: int) -> list[Figure]:
    """Per size every member measured: the slowest member's median (they ran the same operations)."""
    if not sweeps:
        return []
    by = [{m[0]: m[2] for m in s} for s in sweeps]
    common = [size for size, *_ in sweeps[0] if all(size in b for b in by)]
    return [Figure(size, max(b[size] for b in by), busbw(size, max(b[size] for b in by), n)) for size in common]


def _best(figs: list[Figure]) -> Figure | None:
    return max(figs, key=lambda f: f.busbw, default=None)


def _reason(kind: str, message: str, host: str, master: str, port: int, python: str) -> tuple[str, str]:
    """(why, fix) for a node's own error."""
    if kind == "master_unreachable":
        return (f"master port unreachable: {message}",
                f"let {host} reach {master} on TCP port {port} (a firewall? `iptables -L` on both), or set "
                "master.addr to an address every node reaches")
    if kind == "port_busy":
        return message, "free the master port, or choose another with --master-port"
    if kind == "torch":
        return message, f"install torch for {python} on {host}, or point `python` at the interpreter that has it"
    if kind == "interface":
        return (f"wrong interface: {message}",
                "set NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME in this host's env to the interface on the network "
                "the nodes share, or set master.addr to an address on that network")
    if kind == "connect":
        return (message, "check that every node reaches every other on that interface (any TCP port): a firewall, "
                "or NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME naming an interface the others cannot reach")
    return message, "see the node's message; `clusterddp check` tests the rest of its set-up"


def evaluate(inventory: Inventory, results: list[HostResult], outputs: dict[str, bytes], *,
             join_s: float = JOIN_S, master_port: int | None = None) -> CollectiveReport:
    """Every host's output (and its command's result) -> the report, hosts in rank order (:meth:`Inventory.ranked`)."""
    hosts = inventory.ranked()
    n = len(hosts)
    names = [h.name for h in hosts]
    port, _ = master_port_of(master_port, inventory)
    master = inventory.master.host
    by_result = {r.host: r for r in results}
    events: dict[str, list[dict]] = {}
    other: dict[str, list[str]] = {}
    unusable: dict[str, str] = {}
    for h in hosts:
        try:
            events[h.name], other[h.name] = parse_output(outputs.get(h.name, b""), n)
        except CollectiveReplyError as e:
            events[h.name], other[h.name], unusable[h.name] = [], [], str(e)

    def last(name: str, kind: str) -> dict | None:
        return next((e for e in reversed(events[name]) if e["event"] == kind), None)

    started = {h: last(h, "started") for h in names}
    results_ev = {h: last(h, "result") for h in names}
    errors = {h: last(h, "error") for h in names}
    master_err = errors.get(names[0])
    # The master's verdict on the rendezvous blames ranks: missing, or their torch, or their interface.
    blamed: dict[int, str] = {}
    if master_err and master_err["kind"] in ("missing", "version_mismatch", "interface"):
        blamed = {r: master_err["kind"] for r in master_err["ranks"]}
    master_torch = (started[names[0]] or {}).get("torch")

    # Figures: all hosts, then each ring pair from both members' views.
    done = {names.index(h): ev for h, ev in results_ev.items() if ev is not None}
    world = _figures([ev["world"] for ev in done.values()], n) if len(done) == n else []
    backend = next((ev["backend"] for ev in done.values()), None)
    pair_figs: dict[tuple[int, int], list[Figure]] = {}
    if n > 2 and len(done) == n:
        for r in range(n):
            a, b = sorted((r, (r + 1) % n))
            sweeps = [done[x]["pairs"].get(y) for x, y in ((a, b), (b, a))]
            if all(s for s in sweeps):
                pair_figs[(a, b)] = _figures([s for s in sweeps if s], 2)
    per_host: dict[int, tuple[float | None, Figure | None]] = {}
    if len(done) == n:
        for r in range(n):
            figs = [f for (a, b), f in pair_figs.items() if r in (a, b)] if n > 2 else [world]
            lat = [f[0].seconds for f in figs if f]
            best = [b for b in (_best(f) for f in figs) if b]
            per_host[r] = (min(lat, default=None), max(best, key=lambda f: f.busbw, default=None))

    # Judged up to one size, the largest every pair reached: a pair that stopped early (slow) is
    # compared like for like, never its 64 KiB figure against others' 16 MiB; and each pair by its
    # best figure up to there, so that one size measured while the CPU was busy flags nothing.
    sizes = [{f.size for f in figs} for figs in pair_figs.values()]
    judge_at = max(set.intersection(*sizes), default=None) if sizes else None

    def at(figs: list[Figure]) -> float | None:
        return max((f.busbw for f in figs if judge_at and f.size <= judge_at), default=None)
    judged: dict[int, float] = {}
    for r in per_host:
        mine = [v for (a, b), figs in pair_figs.items() if r in (a, b) for v in [at(figs)] if v is not None]
        if mine:
            judged[r] = max(mine)
    slow: dict[int, str] = {}
    if len(per_host) >= 3:
        bws = list(judged.values())
        lats = [lt for lt, _ in per_host.values() if lt is not None]
        med_bw = statistics.median(bws) if bws else 0.0
        med_lat = statistics.median(lats) if lats else 0.0
        for r, (lt, _bw) in per_host.items():
            said = []
            if r in judged and judge_at and judged[r] < med_bw / SLOW_BW:
                said.append(f"bus bandwidth {rate(judged[r])} (best up to {size_text(judge_at)}) is "
                            f"{judged[r] / med_bw:.2g}x the median {rate(med_bw)}")
            if lt is not None and lt > SLOW_LAT * med_lat and lt - med_lat > SLOW_LAT_MIN_S:
                said.append(f"latency {lt * 1e3:.3g} ms is {lt / med_lat:.2g}x the median {med_lat * 1e3:.3g} ms")
            if said:
                slow[r] = "; ".join(said)
    links = []
    for (a, b), sweep in pair_figs.items():
        mine_bw = at(sweep)
        is_slow = bool(mine_bw is not None and a not in slow and b not in slow and all(
            e in judged and mine_bw < judged[e] / SLOW_BW for e in (a, b)))
        links.append(Link(names[a], names[b], sweep[0].seconds if sweep else None, _best(sweep), is_slow))

    out = []
    for r, h in enumerate(hosts):
        name = h.name
        st, ev, res = started[name], errors[name], by_result.get(name)
        facts = {k: st.get(k) for k in ("hostname", "python", "torch", "cuda", "iface", "addr")} if st else {}
        joined = any(e["event"] == "joined" for e in events[name]) and blamed.get(r) != "missing"
        if name in unusable:
            out.append(HostOutcome(name, r, FAILED, problem=f"its reply is unusable: {unusable[name]}",
                                   fix=f"check that `python` for {name} is a plain CPython and that its setup "
                                   "lines print nothing that looks like the program's marker", facts=facts))
            continue
        if r in per_host:
            lt, bw = per_host[r]
            status = SLOW if r in slow else OK
            out.append(HostOutcome(name, r, status, lt, bw, slow.get(r), (
                "look at this host's network: link speed and errors (`ip -s link`, `ethtool`), traffic shaping "
                "(`tc qdisc show`), the interface it uses, and what else it is running") if r in slow else None,
                facts))
            continue
        if not joined:
            why, fix = _never_joined(name, r, st, ev, res, other[name], blamed.get(r), master_torch, join_s,
                                     inventory.master.addr, port, h.python)
            out.append(HostOutcome(name, r, NEVER_JOINED, problem=why, fix=fix, facts=facts))
            continue
        if blamed.get(r) in ("version_mismatch", "interface") and master_err:
            why, fix = _reason(blamed[r], master_err["message"], name, inventory.master.addr, port, h.python)
            if blamed[r] == "version_mismatch":
                why = f"version mismatch: torch {facts.get('torch')} here, {master_torch} on the master {master}"
                fix = f"install torch {master_torch} for {h.python} on {name}, as on the master"
            out.append(HostOutcome(name, r, FAILED, problem=why, fix=fix, facts=facts))
            continue
        if ev is not None and ev["kind"] not in ("missing", "version_mismatch", "interface"):
            why, fix = _reason(ev["kind"], ev["message"], name, inventory.master.addr, port, h.python)
            out.append(HostOutcome(name, r, FAILED, problem=why, fix=fix, facts=facts))
            continue
        if results_ev[name] is not None:  # it measured, but a figure takes every host's answer
            out.append(HostOutcome(name, r, NOT_MEASURED, problem="ran, but its figures need every host's answer",
                                   facts=facts))
            continue
        if ev is not None or blamed:  # joined, then the test stopped for the hosts named above
            out.append(HostOutcome(name, r, NOT_MEASURED, problem="joined; not measured, since the test stopped "
                                   "for the host(s) named", facts=facts))
            continue
        why = res.error.message if res is not None and res.error is not None else \
            "; ".join(other[name][-2:]) or "no result"
        out.append(HostOutcome(name, r, FAILED, problem=f"joined, then ended without figures: {why}", facts=facts))
    return CollectiveReport(tuple(out), backend, tuple(world), tuple(links), join_s, master, port)


def _never_joined(name: str, rank: int, started: dict | None, ev: dict | None, res: HostResult | None,
                  other: list[str], blame: str | None, master_torch: str | None, join_s: float, master_addr: str,
                  port: int, python: str) -> tuple[str, str]:
    """Why a host never joined, as far as its own output and its connection tell."""
    head = f"never joined within {join_s:g}s"
    if ev is not None and ev["kind"] in ("master_unreachable", "torch", "interface", "port_busy"):
        why, fix = _reason(ev["kind"], ev["message"], name, master_addr, port, python)
        return f"{head}: {why}", fix
    if started and master_torch and started.get("torch") != master_torch:
        return (f"{head}: version mismatch: torch {started.get('torch')} here, {master_torch} on the master",
                f"install torch {master_torch} for {python} on {name}, as on the master")
    if res is not None and res.error is not None and not started:
        e = res.error
        return f"{head}: it did not start: {e.detail}", e.hint or "run `clusterddp check` on this inventory"
    if ev is not None:
        why, fix = _reason(ev["kind"], ev["message"], name, master_addr, port, python)
        return f"{head}: {why}", fix
    said = "; ".join(other[-2:])
    if not started:
        return (f"{head}: the test did not start there" + (f": {said}" if said else ""),
                "run `clusterddp check` on this inventory: it tests python, torch and the setup lines")
    return f"{head}: no answer from it" + (f" ({said})" if said else ""), "run `clusterddp check` on this inventory"


# ---- effects ----

def run_collective(inventory: Inventory, *, master_port: int | None = None, join_s: float = JOIN_S,
                   sizes: tuple[int, ...] = SIZES) -> CollectiveReport:
    """Run the test on every host of ``inventory`` at once and evaluate it."""
    hosts = inventory.ranked()
    n = len(hosts)
    port, _ = master_port_of(master_port, inventory)
    rank = {h.name: r for r, h in enumerate(hosts)}
    # torch's import, the join, forming the group, then each group's sweep: the node ends itself after this
    limit_s = 60 + 3 * join_s + (n + 1) * len(sizes) * (BUDGET_S + 3 * OP_S)

    def command(h) -> NodeCommand:
        return collective_command(h, inventory.master.addr, {
            "rank": rank[h.name], "world": n, "addr": inventory.master.addr, "port": port, "sizes": list(sizes),
            "gloo_max": GLOO_MAX, "join_s": join_s, "op_s": OP_S, "budget_s": BUDGET_S, "limit_s": limit_s})
    outputs: dict[str, bytearray] = {h.name: bytearray() for h in hosts}
    lock = threading.Lock()

    def on_output(host: str, data: bytes) -> None:
        with lock:
            buf = outputs[host]
            if len(buf) < MAX_OUTPUT:
                buf += data[:MAX_OUTPUT - len(buf)]
    # Every host must run at once (a collective waits for all): the fan-out is the host count.
    with Fleet(hosts, fanout=n) as fleet:
        results = fleet.run(command, on_output=on_output, timeout=limit_s + 15, limit=limit_s + 15)
    return evaluate(inventory, results, {k: bytes(v) for k, v in outputs.items()}, join_s=join_s,
                    master_port=port)


# ---- the node side (moved from plan.py) ----

def collective_command(host: Host, master_addr: str, args: dict) -> NodeCommand:
    """The node side of ``check --collective`` (``clusterddp/node/collective.py``; ``args`` is its
    JSON argument: rank, world, sizes, bounds). Set up as launch.sh sets up a job: the host's setup
    lines and env (on stdin), the same interface choice (:func:`_iface_lines`), the host's python
    with its site-packages (torch)."""
    lines = preamble(host, host.env, stdout_to=">&2", env_on_stdin=True,
                      on_fail=lambda line: f"echo {q('[clusterddp] setup failed: ' + line)} >&2; exit 98")
    lines += iface_lines({k for k, _ in host.env}, master_addr)
    lines.append("exec " + python_command(host.python, "collective", [q(json.dumps(args, sort_keys=True))], site=True))
    return NodeCommand("\n".join(lines), env_stdin(host.env))
