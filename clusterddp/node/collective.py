"""``collective``: the node program of ``clusterddp check --collective``, and the parser of its answer.

Node side, :func:`main`: one process per node, started on every node at once by
``plan.collective_command`` (after the host's setup lines and env, with the same interface
choice as a run's launch.sh). It imports torch, and:

1. joins a rendezvous on the master's address and port (rank 0 hosts the TCPStore there),
   within ``join_s``; rank 0 waits that long for every rank's hello (its torch, Python,
   interface and address), names the ranks that never came, and refuses to go on when the
   torch versions or an interface (loopback, no address) would make the job fail;
2. forms the process group (NCCL when every node has a GPU, gloo otherwise);
3. times ``all_reduce`` at each size over all ranks, then over each pair of ring neighbours
   (rank i with rank i+1; twice round, each size's better median kept), so a slow node or link
   shows in the figures of its pairs only.
   Every rank of a group runs the same number of operations (agreed from the slowest member's
   first one), and a size whose operation would take longer than ``op_s`` is not tried, so a
   slow link shortens the test rather than lengthening it.

It prints one line per step, :data:`MARK` and a JSON object: ``started``, ``joined``, then
``result`` or ``error`` (with the phase and a kind). A watchdog ends it after ``limit_s``
whatever happens, so nothing is left running on a node.

Launcher side, :func:`parse_output`: the events of one node from its output, every field
checked and bounded (a node's bytes are not trusted).
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time

MARK = "CLUSTERDDP_COLLECTIVE "
PREFIX = "cddp/"  # the rendezvous keys of this program in the TCPStore
ROUNDS = 2        # times round the ring of pairs
_T0 = time.monotonic()


def _say(event: str, **fields: object) -> None:
    fields["event"] = event
    fields["t"] = round(time.monotonic() - _T0, 3)  # seconds since the program started
    sys.stdout.write(MARK + json.dumps(fields) + "\n")
    sys.stdout.flush()


class _Stop(Exception):
    def __init__(self, phase: str, kind: str, message: str, **extra: object) -> None:
        super().__init__(message)
        self.phase, self.kind, self.extra = phase, kind, extra


def _iface_addr(name: str) -> str | None:
    """The IPv4 address of interface ``name`` (SIOCGIFADDR), or None."""
    import fcntl
    import socket
    import struct
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        res = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
        return socket.inet_ntoa(res[20:24])
    except OSError:
        return None
    finally:
        s.close()


def _watchdog(limit: float) -> None:
    def expire() -> None:
        _say("error", phase="limit", kind="timeout", message="still running after %gs: ended" % limit)
        os._exit(3)
    t = threading.Timer(limit, expire)
    t.daemon = True
    t.start()


def main(argv: list[str]) -> int:
    """argv: a JSON object {rank, world, addr, port, sizes, gloo_max, join_s, op_s, budget_s, limit_s}."""
    a = json.loads(argv[0])
    _watchdog(float(a["limit_s"]))
    import platform
    import socket
    rank, world = int(a["rank"]), int(a["world"])
    iface = os.environ.get("GLOO_SOCKET_IFNAME") or os.environ.get("NCCL_SOCKET_IFNAME") or ""
    info = {"python": platform.python_version(), "hostname": socket.gethostname(), "iface": iface,
            "addr": _iface_addr(iface) if iface else None, "torch": None, "cuda": None}  # type: dict
    try:
        import torch
        import torch.distributed as dist
    except Exception as e:  # noqa: BLE001 - whatever stops the import is the answer
        _say("error", phase="start", kind="torch", message="import torch failed: %s: %s" % (type(e).__name__, e),
             **info)
        return 1
    info.update(torch=torch.__version__, cuda=torch.version.cuda, gpu=bool(torch.cuda.is_available()))
    torch.set_num_threads(1)  # the nodes' other processes keep their CPUs; gloo's reductions need no pool
    _say("started", **info)
    try:
        out = _run(a, rank, world, info, torch, dist)
    except _Stop as e:
        _say("error", phase=e.phase, kind=e.kind, message=str(e), **e.extra)
        return 1
    except Exception as e:  # noqa: BLE001 - reported, with the phase it broke in
        _say("error", phase="measure", kind="failed", message="%s: %s" % (type(e).__name__, e))
        return 1
    _say("result", **out)
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - the figures are out; teardown is best effort
        pass
    return 0


def _join(a: dict, rank: int, world: int, info: dict, torch: object, dist: object) -> tuple[object, str]:
    """The rendezvous: the store, every rank's hello, and rank 0's go (with the backend) or abort."""
    from datetime import timedelta
    join_s = float(a["join_s"])
    try:
        store = dist.TCPStore(a["addr"], int(a["port"]), None, rank == 0,  # type: ignore[attr-defined]
                              timeout=timedelta(seconds=join_s), wait_for_workers=False)
    except Exception as e:  # noqa: BLE001 - the store's own message says what (timeout, refused, bind)
        kind = "port_busy" if rank == 0 else "master_unreachable"
        where = "%s:%s" % (a["addr"], a["port"])
        what = "cannot listen on the master port %s" % where if rank == 0 else \
            "cannot reach the master port %s within %gs" % (where, join_s)
        raise _Stop("join", kind, "%s: %s" % (what, _first_line(e))) from None
    store.set(PREFIX + "hello/%d" % rank, json.dumps(info))
    _say("joined")
    if rank == 0:
        deadline = time.monotonic() + join_s
        keys = [PREFIX + "hello/%d" % r for r in range(world)]
        while not store.check(keys) and time.monotonic() < deadline:
            time.sleep(0.05)
        hellos = {}
        for r, k in enumerate(keys):
            if store.check([k]):
                hellos[r] = json.loads(store.get(k).decode())
        go = _decide(hellos, world, join_s)
        store.set(PREFIX + "go", json.dumps(go))
        if "abort" in go:  # the store ends with this process: let every rank that joined read why first
            deadline = time.monotonic() + 10
            while store.add(PREFIX + "read", 0) < len(hellos) - 1 and time.monotonic() < deadline:
                time.sleep(0.05)
    else:
        try:
            store.wait([PREFIX + "go"], timedelta(seconds=2 * join_s + 10))
            go = json.loads(store.get(PREFIX + "go").decode())
            store.add(PREFIX + "read", 1)
        except Exception as e:  # noqa: BLE001
            raise _Stop("join", "no_go", "joined, but the master never said go: %s" % _first_line(e)) from None
    if "abort" in go:
        raise _Stop("join", go["kind"], go["abort"], ranks=go.get("ranks", []), hellos=go.get("hellos") or {})
    return store, go["backend"]


def _decide(hellos: dict, world: int, join_s: float) -> dict:
    """Rank 0's verdict on the hellos: go with a backend, or abort saying why."""
    seen = dict((str(r), h) for r, h in hellos.items())
    missing = [r for r in range(world) if r not in hellos]
    if missing:
        return {"abort": "rank(s) %s never joined within %gs" % (", ".join(map(str, missing)), join_s),
                "kind": "missing", "ranks": missing, "hellos": seen}
    odd = [r for r, h in sorted(hellos.items()) if h["torch"] != hellos[0]["torch"]]
    if odd:
        return {"abort": "torch versions differ: %s on rank 0, %s" % (hellos[0]["torch"], ", ".join(
            "%s on rank %d" % (hellos[r]["torch"], r) for r in odd)), "kind": "version_mismatch", "ranks": odd,
            "hellos": seen}
    one_machine = len(set(h["hostname"] for h in hellos.values())) == 1  # loopback is fine there
    for r, h in sorted(hellos.items()):
        if world > 1 and (not h["addr"] or h["addr"].startswith("127.") and not one_machine):
            why = "has no IPv4 address" if not h["addr"] else "is a loopback interface"
            return {"abort": "rank %d's interface %s %s: its peers cannot reach it" % (r, h["iface"] or "?", why),
                    "kind": "interface", "ranks": [r], "hellos": seen}
    backend = "nccl" if all(h.get("gpu") for h in hellos.values()) else "gloo"
    return {"backend": backend}


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:500] if text else type(e).__name__


def _run(a: dict, rank: int, world: int, info: dict, torch: object, dist: object) -> dict:
    from datetime import timedelta
    store, backend = _join(a, rank, world, info, torch, dist)
    t = torch  # type: object
    device = "cpu"
    if backend == "nccl":
        t.cuda.set_device(0)  # type: ignore[attr-defined]
        device = "cuda:0"
    try:
        dist.init_process_group(backend, store=dist.PrefixStore(PREFIX + "pg/", store),  # type: ignore
                                rank=rank, world_size=world, timeout=timedelta(seconds=float(a["join_s"])))
        # The first collective makes every connection (NCCL connects lazily): part of forming the group.
        dist.barrier()  # type: ignore[attr-defined]
    except Exception as e:  # noqa: BLE001
        raise _Stop("connect", "connect", "the process group did not form (%s on interface %s, %s): %s" % (
            backend, info["iface"] or "?", info["addr"] or "no address", _first_line(e))) from None
    _say("connected", backend=backend)
    # gloo on CPU: the largest sizes take seconds and say nothing more about the link
    sizes = [int(s) for s in a["sizes"] if backend == "nccl" or int(s) <= int(a["gloo_max"])]
    op_s, budget_s = float(a["op_s"]), float(a["budget_s"])
    out = {"backend": backend, "world": _sweep(t, dist, None, sizes, op_s, budget_s, device)}  # type: dict
    pairs = {}  # type: dict
    if world > 2:
        rings = [sorted((r, (r + 1) % world)) for r in range(world)]
        groups = [dist.new_group(ranks) for ranks in rings]  # type: ignore[attr-defined]  # every rank, each one
        # Twice round the ring, each size's better median kept: a pair measured while the node's CPU
        # was busy elsewhere gets a second chance; a slow link is slow both times.
        for _ in range(ROUNDS):
            for i, ranks in enumerate(rings):  # (zip's strict= is Python 3.10)
                group = groups[i]
                if rank in ranks:
                    peer = str(ranks[1] if rank == ranks[0] else ranks[0])
                    pairs[peer] = _better(pairs.get(peer), _sweep(t, dist, group, sizes, op_s, budget_s, device))
    out["pairs"] = pairs
    return out


def _better(a: list | None, b: list) -> list:
    """Two sweeps merged: per size, the measurement with the lower median."""
    best = {}  # type: dict
    for m in (a or []) + b:
        if m[0] not in best or m[2] < best[m[0]][2]:
            best[m[0]] = m
    return [best[size] for size in sorted(best)]


def _sweep(torch: object, dist: object, group: object, sizes: list[int], op_s: float, budget_s: float,
           device: str) -> list[list[float]]:
    """[size, operations, median seconds, fastest seconds] of all_reduce at each size that fits."""
    t = torch  # type: object
    out = []
    for i, size in enumerate(sizes):
        buf = t.ones(max(1, size // 4), dtype=t.float32, device=device)  # type: ignore[attr-defined]
        dist.all_reduce(buf, group=group)  # type: ignore[attr-defined]  # warm-up; also waits for the peers
        times = [_timed(t, dist, buf, group, device)]
        # Every member must run as many operations: agree on the slowest member's first time.
        ops = int(min(50, max(0, budget_s / max(_slowest(t, dist, group, times[0], device), 1e-6) - 1)))
        for _ in range(ops):
            times.append(_timed(t, dist, buf, group, device))
        times.sort()
        median = times[len(times) // 2]
        out.append([size, len(times), median, times[0]])
        del buf
        # The next size would take too long on this link: it has said enough. From 64 KiB on, where
        # the time grows with the size (below, latency rules and the estimate would be far too high);
        # on medians, agreed, so that one operation that waited for the CPU ends no sweep early.
        if i + 1 < len(sizes) and size >= 65536 and \
                _slowest(t, dist, group, median, device) * sizes[i + 1] / size > op_s:
            break
    return out


def _slowest(torch: object, dist: object, group: object, seconds: float, device: str) -> float:
    """The largest of every member's ``seconds``: a figure all members agree on."""
    x = torch.tensor([seconds], dtype=torch.float64, device=device)  # type: ignore[attr-defined]
    dist.all_reduce(x, op=dist.ReduceOp.MAX, group=group)  # type: ignore[attr-defined]
    return float(x.item())


def _timed(torch: object, dist: object, buf: object, group: object, device: str) -> float:
    t0 = time.perf_counter()
    dist.all_reduce(buf, group=group)  # type: ignore[attr-defined]
    if device != "cpu":
        torch.cuda.synchronize()  # type: ignore[attr-defined]
    return time.perf_counter() - t0


# ---- launcher side ----

class CollectiveReplyError(Exception):
    """A node's output could not be used: the message names the field."""


MAX_EVENTS = 16        # events kept per node (the program prints at most five)
MAX_TEXT = 2000        # characters kept of a text
MAX_SIZES = 32         # sizes in one sweep
MAX_SIZE = 1 << 40     # bytes in one operation
MAX_OPS = 10 ** 6
MAX_SECONDS = 1e6
MAX_RANKS = 100000
PHASES = ("start", "join", "connect", "measure", "limit")
KINDS = ("torch", "master_unreachable", "port_busy", "missing", "version_mismatch", "interface", "no_go",
         "connect", "failed", "timeout")
EVENTS = ("started", "joined", "connected", "result", "error")


def _bad(name: str, want: str) -> CollectiveReplyError:
    return CollectiveReplyError("malformed collective reply: %s must be %s" % (name, want))


def _text(name: str, v: object, null: bool = True) -> str | None:
    if v is None and null:
        return None
    if not isinstance(v, str):
        raise _bad(name, "text")
    return v if len(v) <= MAX_TEXT else v[:MAX_TEXT] + "..."


def _rank_key(k: object) -> bool:
    """A rank as a JSON key: 1 to 9 ASCII digits (isdigit() alone takes ² and Arabic-Indic digits,
    which int() refuses or reads as another number)."""
    return isinstance(k, str) and 0 < len(k) <= 9 and k.isascii() and k.isdigit()


def _int(name: str, v: object, lo: int, hi: int) -> int:
    if type(v) is not int or not lo <= v <= hi:  # noqa: E721 - a bool is no count
        raise _bad(name, "a whole number from %d to %d" % (lo, hi))
    return v


def _seconds(name: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= MAX_SECONDS:  # NaN fails too
        raise _bad(name, "a number of seconds from 0 to %g" % MAX_SECONDS)
    return float(v)


def _sweep_of(name: str, v: object) -> list[tuple[int, int, float, float]]:
    if not isinstance(v, list) or len(v) > MAX_SIZES:
        raise _bad(name, "a list of at most %d measurements" % MAX_SIZES)
    out = []
    for i, m in enumerate(v):
        where = "%s[%d]" % (name, i)
        if not isinstance(m, list) or len(m) != 4:
            raise _bad(where, "[size, operations, median, fastest]")
        size, ops = _int(where + ".size", m[0], 1, MAX_SIZE), _int(where + ".operations", m[1], 1, MAX_OPS)
        med, fast = _seconds(where + ".median", m[2]), _seconds(where + ".fastest", m[3])
        if fast > med:
            raise _bad(where, "a measurement whose fastest time is not above its median")
        out.append((size, ops, med, fast))
    return out


def _event(ev: object, world: int) -> dict:
    """One event, only its known fields, each checked."""
    if not isinstance(ev, dict) or ev.get("event") not in EVENTS:
        raise _bad("event", "one of %s" % ", ".join(EVENTS))
    kind = ev["event"]
    out = {"event": kind, "t": _seconds("t", ev.get("t"))}  # type: dict
    for k in ("python", "hostname", "iface", "addr", "torch", "cuda"):
        if k in ev:
            out[k] = _text(k, ev[k])
    if "gpu" in ev:
        if not isinstance(ev["gpu"], bool):
            raise _bad("gpu", "true or false")
        out["gpu"] = ev["gpu"]
    if kind == "connected" or kind == "result":
        if ev.get("backend") not in ("gloo", "nccl"):
            raise _bad("backend", "gloo or nccl")
        out["backend"] = ev["backend"]
    if kind == "error":
        if ev.get("phase") not in PHASES:
            raise _bad("phase", "one of %s" % ", ".join(PHASES))
        if ev.get("kind") not in KINDS:
            raise _bad("kind", "one of %s" % ", ".join(KINDS))
        out.update(phase=ev["phase"], kind=ev["kind"], message=_text("message", ev.get("message"), null=False))
        ranks = ev.get("ranks", [])
        if not isinstance(ranks, list) or len(ranks) > world:
            raise _bad("ranks", "a list of ranks")
        out["ranks"] = [_int("ranks", r, 0, world - 1) for r in ranks]
        hellos = ev.get("hellos", {})
        if not isinstance(hellos, dict) or len(hellos) > world:
            raise _bad("hellos", "an object of ranks")
        out["hellos"] = {}
        for r, h in hellos.items():
            if not (_rank_key(r) and int(r) < world) or not isinstance(h, dict):
                raise _bad("hellos", "an object of ranks")
            out["hellos"][int(r)] = {"torch": _text("hellos.torch", h.get("torch"))}
    if kind == "result":
        out["world"] = _sweep_of("world", ev.get("world"))
        pairs = ev.get("pairs")
        if not isinstance(pairs, dict) or len(pairs) > 2:
            raise _bad("pairs", "an object of at most two peers")
        out["pairs"] = {}
        for peer, sweep in pairs.items():
            if not (_rank_key(peer) and int(peer) < world):
                raise _bad("pairs", "an object keyed by peer rank")
            out["pairs"][int(peer)] = _sweep_of("pairs[%s]" % peer, sweep)
    return out


def _no_constant(name: str) -> object:
    raise ValueError("%s is not a number" % name)


def parse_output(output: bytes, world: int) -> tuple[list[dict], list[str]]:
    """The node's events, in order, and its other output lines (the last few, for a reason when
    it printed no error of its own). Raises :class:`CollectiveReplyError` for a malformed event."""
    events, other = [], []  # type: list[dict], list[str]
    for line in output.decode("utf-8", "replace").split("\n"):
        line = line.rstrip("\r")
        if not line.startswith(MARK):
            if line.strip():
                other = (other + [line[:MAX_TEXT]])[-10:]
            continue
        if len(events) >= MAX_EVENTS:
            raise CollectiveReplyError("malformed collective reply: more than %d events" % MAX_EVENTS)
        try:
            ev = json.loads(line[len(MARK):], parse_constant=_no_constant)
        except (ValueError, RecursionError) as e:
            raise CollectiveReplyError("unreadable collective reply: %s" % e) from None
        events.append(_event(ev, world))
    return events, other


def busbw(size: int, seconds: float, n: int) -> float:
    """all_reduce bus bandwidth in bytes/s (nccl-tests' definition: algbw * 2(n-1)/n)."""
    if seconds <= 0 or n < 2:
        return 0.0 if n < 2 else math.inf
    return size / seconds * 2 * (n - 1) / n


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
