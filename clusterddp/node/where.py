"""``where``: where each rank of one node's job is, every few seconds, so that the slow rank of a
synchronous job can be named (``clusterddp.stragglers``) without any change to the user's script.

In synchronous DDP every rank steps at the same rate; the slow rank is the one the others wait for.
So each sample asks every hooked rank for its main thread's stack, as ``clusterddp stacks`` does
(the node program ``stacks``, written beside this one: ``faulthandler`` through the job's
``sitecustomize``, one signal each, no ptrace), and keeps only where it is, in one word: ``w``
(waiting: the frames inside the user's innermost one include a collective, a ``wait`` or autograd's
``backward``, in which DDP waits for the others' gradients), ``c`` (in its own code, or computing
in a library outside any collective; ``where`` says at which of its functions) or ``?`` (no dump).

Beside that, what may explain a slow node: the host's CPU busy %, the job's share of it (every
process with the job's ``CLUSTERDDP_JOB`` marker) and what is left for other processes (with the
busiest of them, when they take a good part), the share of time the ranks' CPU cgroup was held back
by its quota (``cpu.max``, or v1's ``cpu.cfs_quota_us``), the share of time the ranks were runnable but not running
(``/proc/PID/schedstat``: waiting for a CPU, or held back by a quota), and, every :data:`APPS_EVERY` seconds
where ``nvidia-smi`` answers, processes on the node's GPUs that are not the job's. GPU clocks,
temperature and throttle reasons are the metrics sampler's (``metrics.jsonl``), not taken twice.

launch.sh (``nodescript.where_lines``) writes this source and ``stacks`` into ``$CTL/where/`` and
starts ``python -S $CTL/where/where.py CTL JSON`` in the background before torchrun; it carries the
job's marker, so teardown, ``stop`` and ``prune`` end it with the job, and launch.sh ends it after
the job. No daemon: it lives and dies with the job.

``$CTL/where.jsonl`` (0600): a header line, then one JSON object a sample (:func:`sample_line`).
It never grows past ``most`` bytes: when the next line would pass it, every other sample is dropped
(the file rewritten whole, atomically) and from then on only every second (fourth, ...) sample is
taken. A rank's dump file (``$CTL/stacks/<pid>.txt``, appended to at each signal) is cut back to its
header once past :data:`DUMP_MOST`, under the lock ``stacks`` takes too, so neither grows without
bound. Its cost is measured by ``tests/node/test_where.py`` (well under 1% of one CPU at the
default interval).

Launcher side, :func:`parse`: the file's bytes (untrusted) as samples, bounded, never raising.

Python 3.8 grammar, standard library only.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

# The ranks' stacks are taken with the ``stacks`` program's code; the file kept bounded by the samplers' writer,
# and the loop stopped, as the metrics sampler's (the ``watch`` program's). On the node both sources are written
# beside this file (nodescript.where_lines); in-process (tests), they are this package's modules.
if __package__:
    from . import stacks as stacks_module
    from . import watch as watcher
else:  # pragma: no cover - on the node
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import watch as watcher  # type: ignore[no-redef]  # noqa: E402

    import stacks as stacks_module  # type: ignore[no-redef]  # noqa: E402

SCHEMA = 1
KIND = "clusterddp-where"
INTERVAL = 2.0          # default seconds between samples
MOST = 1 << 20          # default bytes of where.jsonl, at most
RESCAN = 30.0           # seconds between /proc scans for the job's processes (sooner when a rank is gone)
DUMP_WAIT = 1.0         # seconds a signalled rank has to write its stack
DUMP_MOST = 256 << 10   # bytes of a rank's dump file past which it is cut back to its header
APPS_EVERY = 30.0       # seconds between nvidia-smi's lists of the processes on the GPUs
SMI_TIMEOUT = 10.0
OTHER_NAMED = 25.0      # % of the host's CPU outside the job from which its busiest process is named
MAX_WHERE = 120         # characters of a rank's place
MAX_RANKS = 256

# What a rank waits in: the collectives of torch.distributed, a work's wait, autograd's backward (where
# DDP's reducer waits for every rank's gradients), and the device syncs that wait for a collective's kernel.
WAIT = frozenset((
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "all_gather_object",
    "all_gather_coalesced", "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
    "broadcast", "broadcast_object_list", "barrier", "monitored_barrier", "reduce", "gather", "scatter",
    "gather_object", "scatter_object_list", "send", "recv", "isend", "irecv", "batch_isend_irecv", "wait",
    "wait_tensor", "backward", "_engine_run_backward", "run_backward", "synchronize",
))
# Of those, the ones in which a rank also computes (autograd runs the backward pass on the calling thread):
# there, a main thread that is running (not asleep) is computing, not waiting.
COMPUTES = frozenset(("backward", "_engine_run_backward", "run_backward"))
LIBRARY = re.compile(r"(/site-packages/|/dist-packages/|/lib/python\d[\d.]*/|^<)")


def state_of(frames: list, running: bool = False) -> tuple:
    """Where a main thread is, from its frames (innermost first, as ``stacks.parse_dump`` gives them) and
    whether it was running (``R`` in /proc, not asleep) as it was sampled: (``w``, the call it waits in)
    when a frame inside the innermost frame of the user's own code is a :data:`WAIT` one (but for a
    :data:`COMPUTES` one while running: computing its own backward pass, ``c``); otherwise (``c``,
    ``function (file:line)`` of that user frame, or the innermost frame's function where none is the
    user's); (``?``, "") with no frames."""
    if not frames:
        return "?", ""
    for path, line, fn in frames:
        if LIBRARY.search(path) is None:
            return "c", ("%s (%s:%s)" % (fn, os.path.basename(path), "?" if line is None else line))[:MAX_WHERE]
        if fn in WAIT:
            if running and fn in COMPUTES:
                return "c", "%s (computing)" % fn
            return "w", fn[:MAX_WHERE]
    return "c", str(frames[0][2])[:MAX_WHERE]


def running_now(pid: int) -> bool:
    """Whether ``pid``'s main thread is running or runnable (``R``: computing, or held back by a CPU quota)."""
    return _read("/proc/%d/stat" % pid, 4096).rsplit(b")", 1)[-1].split()[:1] == [b"R"]


def _read(path: str, most: int = 1 << 16) -> bytes:
    return stacks_module.read_head(path, most)


def marked(marker: str) -> list:
    """Every pid whose environment holds the job's marker (its ranks, their workers, the agent)."""
    want = ("CLUSTERDDP_JOB=%s" % marker).encode()
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and want in _read("/proc/%s/environ" % name, 1 << 20).split(b"\0"):
            out.append(int(name))
    return out


def cpu_jiffies(pid: int) -> int:
    """user + system jiffies of ``pid`` (0 once it is gone)."""
    try:
        return sum(int(x) for x in _read("/proc/%d/stat" % pid).rsplit(b")", 1)[1].split()[11:13])
    except (IndexError, ValueError):
        return 0


def host_jiffies() -> tuple:
    """(busy, total) jiffies of the host's CPUs."""
    first = _read("/proc/stat", 4096).split(b"\n", 1)[0].split()
    vals = [int(v) for v in first[1:9] if v.isdigit()]
    if first[:1] != [b"cpu"] or len(vals) < 5:
        return 0, 0
    return sum(vals) - vals[3] - vals[4], sum(vals)


def run_delay(pids: list) -> object:
    """Seconds ``pids`` have spent runnable but not running (``/proc/PID/schedstat``: waiting for a CPU,
    or held back by a CPU quota), summed; None where the kernel does not keep it."""
    total, seen = 0, False
    for pid in pids:
        w = _read("/proc/%d/schedstat" % pid, 256).split()
        if len(w) >= 2 and w[1].isdigit():
            total += int(w[1])
            seen = True
    return total * 1e-9 if seen else None


def cgroup_stat(pid: int) -> object:
    """The ``cpu.stat`` file of ``pid``'s CPU cgroup and its unit (v2: ``throttled_usec``; v1:
    ``throttled_time``, ns), or None."""
    for line in _read("/proc/%d/cgroup" % pid, 8192).decode("utf-8", "replace").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        path = parts[2].lstrip("/")
        if parts[1] == "" and parts[0] == "0":
            cand = os.path.join("/sys/fs/cgroup", path, "cpu.stat")
            if os.path.exists(cand):
                return cand, "throttled_usec", 1e-6
            cand = os.path.join("/sys/fs/cgroup/unified", path, "cpu.stat")
            if os.path.exists(os.path.join("/sys/fs/cgroup/unified", path, "cpu.max")):
                return cand, "throttled_usec", 1e-6
        elif "cpu" in parts[1].split(","):
            for mount in ("/sys/fs/cgroup/" + parts[1], "/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"):
                cand = os.path.join(mount, path, "cpu.stat")
                if os.path.exists(cand):
                    return cand, "throttled_time", 1e-9
    return None


def throttled_s(stat) -> object:
    """Seconds the cgroup has been held back by its quota, or None."""
    if stat is None:
        return None
    path, key, unit = stat
    for line in _read(path, 8192).decode("ascii", "replace").splitlines():
        w = line.split()
        if len(w) == 2 and w[0] == key and w[1].isdigit():
            return int(w[1]) * unit
    return None


def busiest_other(before: dict, job: set) -> tuple:
    """(the busiest process outside the job since ``before``'s look, by name or None; this look)."""
    now = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in job:
            now[int(name)] = cpu_jiffies(int(name))
    best, most = None, 0
    for pid, j in now.items():
        d = j - before.get(pid, j)
        if d > most:
            best, most = pid, d
    if best is None:
        return None, now
    comm = _read("/proc/%d/comm" % best, 64).decode("utf-8", "replace").strip()
    return ("%s (pid %d)" % (comm or "?", best))[:MAX_WHERE], now


def gpu_others(job: set) -> object:
    """Processes on this node's GPUs that are not the job's, as ``name (pid N, GPU uuid)``; None: no nvidia-smi."""
    try:
        r = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name,gpu_uuid", "--format=csv,noheader"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=SMI_TIMEOUT)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        return None
    out = []
    for line in r.stdout[:65536].decode("utf-8", "replace").splitlines()[:64]:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 3 and cells[0].isdigit() and int(cells[0]) not in job:
            out.append(("%s (pid %s, GPU %s)" % (os.path.basename(cells[1]), cells[0], cells[2]))[:MAX_WHERE])
    return out


Writer = watcher.Writer  # where.jsonl, kept under ``most`` bytes by thinning (see the module docstring)


def steady(ranks: list, before: dict) -> tuple:
    """The pids of ``ranks`` safe to signal now (:func:`stacks.steady`: the very threads they had at the
    previous look, so not while a rank starts: torch's import, the process group and DDP's set-up make and
    end threads), and every rank's threads (``before`` for the next look)."""
    return stacks_module.steady([p["pid"] for p in ranks], before)


def look(folder: str, ranks: list, sig: int, wait: float, safe: "set | None" = None) -> dict:
    """Every rank's place now: rank -> [state, where] (``?`` for a rank not in ``safe``, a set of pids: not
    signalled; None: every rank is). Dump files past :data:`DUMP_MOST` are cut back."""
    lock = stacks_module.locked(folder)
    try:
        running = dict((p["pid"], running_now(p["pid"])) for p in ranks)  # before the signal wakes it
        asked = [p for p in ranks if safe is None or p["pid"] in safe]
        stacks_module.take(folder, asked, sig, wait, py_spy=False, settle=False)  # steady() looked already
        out = dict((str(p["rank"]), ["?", ""]) for p in ranks)
        for p in asked:
            threads = stacks_module.parse_dump(p["dump"])
            want = int(p["main"], 16) if p.get("main") else None
            frames = next((fr for tid, _, fr in threads if tid == want), threads[0][2] if threads else [])
            out[str(p["rank"])] = list(state_of(frames, running[p["pid"]]))
            path = os.path.join(folder, "%d.txt" % p["pid"])
            try:
                if os.stat(path).st_size > DUMP_MOST:
                    head = _read(path, 200).split(b"\n", 1)[0] + b"\n"
                    os.truncate(path, len(head))  # the rank appends (O_APPEND): its next dump follows the header
            except OSError:
                pass
    finally:
        if lock is not None:
            os.close(lock)
    return out


def sample_line(t: float, ranks: dict, cpu: dict, other_top, throttled, apps, cpu_wait=None) -> dict:
    """One sample as where.jsonl holds it."""
    s = {"t": round(t, 3), "ranks": ranks}  # type: dict
    s.update(cpu)
    if cpu_wait is not None:
        s["cpu_wait"] = cpu_wait
    if other_top:
        s["other_top"] = other_top
    if throttled is not None:
        s["throttled"] = throttled
    if apps is not None:
        s["gpu_others"] = apps
    return s


def main(argv: list) -> int:
    """``where CTL JSON``: the job's control folder and {"interval", "most"}; the job's marker and host
    from the environment (CLUSTERDDP_JOB, CLUSTERDDP_HOST). Runs until the job ends."""
    ctl = argv[0]
    args = json.loads(argv[1]) if len(argv) > 1 else {}
    args.update(ctl=ctl, marker=os.environ.get("CLUSTERDDP_JOB", ""), host=os.environ.get("CLUSTERDDP_HOST", ""))
    if not args["marker"]:
        return 0
    signal.signal(signal.SIGTERM, watcher.on_sigterm)  # launch.sh's kill once the job has ended: out at once
    run(args, os.getppid())
    return 0


def run(args: dict, parent, clock=time.monotonic, sleep=time.sleep, samples=None) -> None:
    """The sampling loop; ``parent`` None: no launch.sh to outlive (tests); ``samples``: how many to take."""
    ctl = args["ctl"]
    folder = os.path.join(ctl, "stacks")
    interval = max(0.1, float(args.get("interval") or INTERVAL))
    sig = int(signal.SIGRTMIN) + stacks_module.OFFSET
    out = Writer(os.path.join(ctl, "where.jsonl"),
                 {"schema": SCHEMA, "kind": KIND, "host": args.get("host", ""), "interval": interval,
                  "started": round(time.time(), 3)}, args.get("most") or MOST)
    ncpu = os.cpu_count() or 1
    job, ranks, scanned, apps_at = set(), [], 0.0, None  # type: set, list, float, object
    others, thread_counts = {}, {}  # type: dict, dict
    taken = 0
    before_host, before_job, before_thr, before_t, before_delay = host_jiffies(), 0, None, clock(), None
    while True:
        if watcher.nap(interval, sleep) or watcher.job_over(ctl, parent):
            return  # launch.sh has ended (or killed this at the job's end): so has the job
        if not out.due():
            continue
        now = clock()
        if not ranks or now - scanned >= RESCAN or any(not os.path.exists("/proc/%d" % p["pid"]) for p in ranks):
            scanned = now
            job = set(marked(args["marker"]))
            ranks = [p for p in stacks_module.job_processes(args["marker"]) if p["role"] == "rank"][:MAX_RANKS]
        safe, thread_counts = steady(ranks, thread_counts)
        places = look(folder, ranks, sig, DUMP_WAIT, safe) if ranks else {}
        host = host_jiffies()
        job_j = sum(cpu_jiffies(p) for p in job)
        busy, total = host[0] - before_host[0], host[1] - before_host[1]
        cpu = {}  # type: dict
        top = None
        if total > 0 and taken > 0:
            jobd = max(0, job_j - before_job)
            # the job's share never above the host's: a process's jiffies and /proc/stat's are counted apart
            # (read a few ms apart, and ticks charged differently), so on a busy host the two can cross
            host_cpu = round(100.0 * busy / total, 1)
            cpu = {"cpu": host_cpu, "cpu_job": round(min(100.0, host_cpu, 100.0 * jobd / total), 1)}
            cpu["cpu_other"] = round(max(0.0, cpu["cpu"] - cpu["cpu_job"]), 1)
            if cpu["cpu_other"] >= OTHER_NAMED:
                top, others = busiest_other(others, job)
            else:
                others = {}
        stat = cgroup_stat(ranks[0]["pid"]) if ranks else None
        thr = throttled_s(stat)
        delay = run_delay([p["pid"] for p in ranks])
        wall = now - before_t
        throttled = cpu_wait = None
        if thr is not None and before_thr is not None and wall > 0:
            throttled = round(min(1.0, max(0.0, (thr - before_thr) / wall / max(1, len(ranks)))), 3)
        if delay is not None and before_delay is not None and wall > 0:
            cpu_wait = round(min(1.0, max(0.0, (delay - before_delay) / wall / max(1, len(ranks)))), 3)
        apps = None
        if apps_at is None or now - apps_at >= APPS_EVERY:
            apps_at = now
            apps = gpu_others(job)
        if taken > 0:
            line = sample_line(time.time(), places, dict(cpu, ncpu=ncpu), top, throttled, apps, cpu_wait)
            try:
                out.write((json.dumps(line, sort_keys=True) + "\n").encode())
            except OSError:
                pass
        before_host, before_job, before_thr, before_t, before_delay = host, job_j, thr, now, delay
        taken += 1
        if samples is not None and taken >= samples:
            return


# ---- launcher side ----

PARSE_MOST = 8 << 20   # bytes of a where.jsonl read
MAX_LINE = 64 << 10    # bytes of one line; longer lines are dropped
MAX_SAMPLES = 200000
STATES = ("w", "c", "?")


def _num(v, lo: float, hi: float):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or not lo <= v <= hi:
        return None
    return float(v)


def _text(v) -> object:
    if not isinstance(v, str):
        return None
    return "".join(ch if ch.isprintable() else "?" for ch in v[:MAX_WHERE])


def parse(data: bytes) -> tuple:
    """A where.jsonl's bytes as (header dict, [sample dict]): each sample
    ``{"t", "ranks": {rank: (state, where)}, "cpu", "cpu_job", "cpu_other", "ncpu", "other_top", "throttled",
    "cpu_wait", "gpu_others"}`` (absent numbers None), every value checked; lines of any other shape are dropped.
    Reads at most :data:`PARSE_MOST` bytes; never raises."""
    header = {}  # type: dict
    samples = []  # type: list
    for i, raw in enumerate(data[:PARSE_MOST].split(b"\n")):
        if len(samples) >= MAX_SAMPLES:
            break
        if not raw.strip() or len(raw) > MAX_LINE:
            continue
        try:
            rec = json.loads(raw.decode("utf-8", "replace"))
        except (ValueError, RecursionError):
            continue
        if not isinstance(rec, dict):
            continue
        if i == 0 and rec.get("kind") == KIND:
            header = {"host": _text(rec.get("host")) or "", "interval": _num(rec.get("interval"), 0.0, 1e6),
                      "started": _num(rec.get("started"), 0.0, 1e11)}
            continue
        t = _num(rec.get("t"), 0.0, 1e11)
        ranks = rec.get("ranks")
        if t is None or not isinstance(ranks, dict):
            continue
        got = {}
        for k, v in list(ranks.items())[:MAX_RANKS]:
            if (isinstance(k, str) and k.isdigit() and len(k) < 8 and isinstance(v, list) and len(v) == 2
                    and v[0] in STATES and isinstance(v[1], str)):
                got[int(k)] = (v[0], _text(v[1]) or "")
        apps = rec.get("gpu_others")
        samples.append({
            "t": t, "ranks": got,
            "cpu": _num(rec.get("cpu"), 0.0, 100.0), "cpu_job": _num(rec.get("cpu_job"), 0.0, 100.0),
            "cpu_other": _num(rec.get("cpu_other"), 0.0, 100.0), "ncpu": _num(rec.get("ncpu"), 1.0, 1e6),
            "other_top": _text(rec.get("other_top")), "throttled": _num(rec.get("throttled"), 0.0, 1.0),
            "cpu_wait": _num(rec.get("cpu_wait"), 0.0, 1.0),
            "gpu_others": ([_text(a) or "" for a in apps[:16] if isinstance(a, str)]
                           if isinstance(apps, list) else None),
        })
    return header, samples


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
