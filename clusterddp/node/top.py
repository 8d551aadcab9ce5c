"""``top``: one look at a node for ``clusterddp top``, all of that node's jobs in one SSH round.

Node side, :func:`main`: for each job (its control folder and ``CLUSTERDDP_JOB`` marker) its
state (the words of ``plan.status_command``), the last line of ``node.log``, the last step
number the progress regex finds in the log's tail, and the CPU seconds and resident memory of
its processes (found by the marker, as teardown finds them); for the node, the CPU and memory
counters and, where ``nvidia-smi`` answers, each GPU's utilisation and memory; and, for the
time since the job's last progress line, ``node.log``'s modification time and, when the run has a
stall timeout, what the node's watcher (``node/watch.py``) last wrote to ``$CTL/watch.json``
(``last_progress``: this node's last progress line, ``run_last_progress``: the last anywhere as the
node knows it, epoch seconds on the node's clock or null; ``timeout``: seconds; ``state``). One line:
:data:`MARK` and a JSON object. Rates (steps/s, CPU %) are differences between two looks, so
counters and the node's clock are sent, not rates. Python 3.8 grammar, standard library only.

Launcher side, :func:`parse_reply`: that line, every value checked (the node is not trusted).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys

MARK = "CLUSTERDDP_TOP "
STATES = ("running", "exited", "lost", "missing")
MAX_LINE = 500         # characters of a log line sent and kept
MAX_GPUS = 64
MAX_JOBS = 1000
WATCH_FILE = "watch.json"   # in the control folder, written by the node's watcher (node/watch.py)
MAX_WATCH = 4096           # bytes of it read: it holds a few numbers
WATCH_STATES = ("waiting", "watching", "stalled")
WHERE_FILE = "where.jsonl"  # in the control folder, written by the node's rank sampler (node/where.py)
WHERE_TAIL = 65536          # bytes of its end sent: its last samples, for ``top``'s stragglers


def _job_pids(markers: list[str]) -> dict:
    """The pids of each marker's processes, from one pass over /proc/*/environ."""
    wanted = set(("CLUSTERDDP_JOB=%s" % m).encode() for m in markers)
    found = dict((m, []) for m in markers)  # type: dict
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as f:
                env = f.read()
        except OSError:
            continue
        for entry in env.split(b"\0"):
            if entry in wanted:
                found[entry[len(b"CLUSTERDDP_JOB="):].decode("utf-8", "replace")].append(int(name))
                break
    return found


def _usage(pids: list[int]) -> tuple:
    """CPU seconds (user + system) and resident bytes, summed over ``pids``."""
    tick, page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
    cpu, rss = 0.0, 0
    for pid in pids:
        try:
            with open("/proc/%d/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cpu += (int(fields[11]) + int(fields[12])) / tick
            rss += int(fields[21]) * page
        except (OSError, IndexError, ValueError):
            pass
    return cpu, rss


def _tail(path: str, size: int, regex: re.Pattern, skip: tuple = ()) -> tuple:
    """The last non-empty line of the log (after a carriage return, as a terminal shows a progress
    bar) that no ``skip`` pattern matches (known torch noise), nor is an indented line right below
    one (the source line a Python warning prints), and the last step the regex finds in its last
    ``size`` bytes."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            end = f.tell()
            f.seek(max(0, end - size))
            data = f.read(size)
    except OSError:
        return None, None
    lines = data.decode("utf-8", "replace").split("\n")
    last = None

    def noise(i: int) -> bool:
        return any(p.search(lines[i]) for p in skip)
    for i in range(len(lines) - 1, -1, -1):
        shown = lines[i].rstrip("\r").rsplit("\r", 1)[-1]
        if not shown.strip() or noise(i):
            continue
        if shown[:1].isspace() and i > 0 and noise(i - 1):  # a warning's source line, below the warning
            continue
        last = shown[-MAX_LINE:]
        break
    step = None
    for line in reversed(lines):
        m = regex.search(line)
        if m:
            digits = m.group(1) if m.groups() else m.group(0)
            if digits is not None and digits.isdigit() and len(digits) <= 18:
                step = int(digits)
                break
    return last, step


def _state(ctl: str, pids: list[int]) -> tuple:
    if not os.path.isdir(ctl):
        return "missing", None
    try:
        with open(os.path.join(ctl, "exit_code")) as f:
            text = f.read().strip()
        if text:
            return "exited", int(text) if text.isdigit() and len(text) <= 3 else None
    except OSError:
        pass
    return ("running" if pids else "lost"), None


def _mtime(path: str) -> object:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def _watch(ctl: str) -> object:
    """The watcher's last-progress time and stall timeout from ``$CTL/watch.json`` (read bounded, never
    followed through a link); None where there is none or it cannot be read (checked again launcher side)."""
    try:
        fd = os.open(os.path.join(ctl, WATCH_FILE), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        import stat
        data = os.read(fd, MAX_WATCH + 1) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        w = json.loads(data.decode("utf-8")) if len(data) <= MAX_WATCH else None
    except ValueError:
        return None
    if not isinstance(w, dict):
        return None
    out = {"last_progress": w.get("last_progress"), "run_last_progress": w.get("run_last_progress"),
           "timeout": w.get("timeout"), "state": w.get("state")}

    def number(v: object) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if not number(out["timeout"]) or not all(v is None or number(v) for v in
                                             (out["last_progress"], out["run_last_progress"])):
        return None  # a file this program cannot read leaves the rest of the node's answer shown
    if out["state"] not in WATCH_STATES:
        out["state"] = None
    return out


def _where(ctl: str) -> object:
    """The lines in the last :data:`WHERE_TAIL` bytes of the rank sampler's file (the first may be cut: the
    launcher's reader drops it), as texts; None where there is none."""
    try:
        fd = os.open(os.path.join(ctl, WHERE_FILE), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        import stat
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        os.lseek(fd, max(0, st.st_size - WHERE_TAIL), 0)
        return os.read(fd, WHERE_TAIL).decode("utf-8", "replace").split("\n")
    except OSError:
        return None
    finally:
        os.close(fd)


def _gpus() -> tuple:
    """Each GPU's index, utilisation % and memory used/total (MiB) from nvidia-smi; (None, why)
    without one."""
    import shutil
    import subprocess
    if shutil.which("nvidia-smi") is None:
        return None, None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used,memory.total",
                              "--format=csv,noheader,nounits"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             timeout=5, universal_newlines=True)
    except Exception as e:
        return None, "nvidia-smi: %s" % e
    if out.returncode != 0:
        said = (out.stderr or out.stdout).strip().splitlines() or ["exit %d" % out.returncode]
        return None, "nvidia-smi: " + said[-1]
    gpus = []

    def num(text: str) -> object:
        try:
            return float(text)
        except ValueError:
            return None  # "[N/A]", "[Not Supported]"
    for line in out.stdout.splitlines()[:MAX_GPUS]:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4 and parts[0].isdigit():
            gpus.append({"index": int(parts[0]), "util": num(parts[1]), "mem_used": num(parts[2]),
                         "mem_total": num(parts[3])})
    return gpus, None


def _node() -> dict:
    r = {}  # type: dict
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
        r["cpu_total"], r["cpu_idle"] = sum(ticks), ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    except (OSError, ValueError, IndexError):
        pass
    try:
        mem = {}
        with open("/proc/meminfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                mem[k] = int(v.split()[0]) * 1024
        r["mem_total"], r["mem_available"] = mem["MemTotal"], mem["MemAvailable"]
    except (OSError, ValueError, IndexError, KeyError):
        pass
    r["ncpu"] = os.cpu_count() or 1
    return r


def main(argv: list[str]) -> int:
    """argv: a JSON object {"jobs": [[control folder, marker], ...], "regex": text, "tail": bytes,
    "skip": [regex text, ...] (optional: lines never shown as the last line)}."""
    import time
    a = json.loads(argv[0])
    try:
        regex = re.compile(a["regex"])
    except re.error:
        regex = re.compile(r"(?!)")
    skip = []
    for text in a.get("skip", []):
        try:
            skip.append(re.compile(text))
        except re.error:
            pass
    jobs = [(os.path.expanduser(c), m) for c, m in a["jobs"]]
    pids = _job_pids([m for _, m in jobs])
    out = {"time": time.time(), "jobs": []}  # type: dict
    for ctl, marker in jobs:
        state, code = _state(ctl, pids[marker])
        last, step = _tail(os.path.join(ctl, "node.log"), int(a["tail"]), regex, tuple(skip))
        cpu, rss = _usage(pids[marker])
        out["jobs"].append({"state": state, "exit_code": code, "last_line": last, "step": step,
                            "cpu_seconds": cpu, "rss": rss, "procs": len(pids[marker]),
                            "log_mtime": _mtime(os.path.join(ctl, "node.log")), "watch": _watch(ctl),
                            "where": _where(ctl)})
    out.update(_node())
    out["gpus"], gpu_error = _gpus()
    if gpu_error:
        out["gpu_error"] = gpu_error[:MAX_LINE]
    sys.stdout.write(MARK + json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


# ---- launcher side ----

class TopError(Exception):
    """The node's answer could not be read; the message says why."""


def _num(v: object, lo: float, hi: float, name: str, whole: bool = False, null: bool = False) -> object:
    if v is None and null:
        return None
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and lo <= v <= hi
    if not ok or (whole and not isinstance(v, int)):
        raise TopError("malformed top reply: %s must be %s between %g and %g" % (
            name, "a whole number" if whole else "a number", lo, hi))
    return v


def _text(v: object, name: str) -> object:
    if v is None:
        return None
    if not isinstance(v, str):
        raise TopError("malformed top reply: %s must be text" % name)
    return v[-MAX_LINE:]


def _watched(w: object, i: int) -> object:
    if w is None:
        return None
    if not isinstance(w, dict):
        raise TopError("malformed top reply: jobs[%d].watch must be an object" % i)
    if w.get("state") not in (None, *WATCH_STATES):
        raise TopError("malformed top reply: jobs[%d].watch.state must be one of %s" % (i, ", ".join(WATCH_STATES)))
    return {"last_progress": _num(w.get("last_progress"), 0, 1e11, "watch.last_progress", null=True),
            "run_last_progress": _num(w.get("run_last_progress"), 0, 1e11, "watch.run_last_progress", null=True),
            "timeout": _num(w.get("timeout"), 0, 1e9, "watch.timeout"), "state": w.get("state")}


def _job(j: object, i: int) -> dict:
    if not isinstance(j, dict):
        raise TopError("malformed top reply: jobs[%d] must be an object" % i)
    if j.get("state") not in STATES:
        raise TopError("malformed top reply: jobs[%d].state must be one of %s" % (i, ", ".join(STATES)))
    return {"state": j["state"],
            "exit_code": _num(j.get("exit_code"), 0, 255, "exit_code", whole=True, null=True),
            "last_line": _text(j.get("last_line"), "last_line"),
            "step": _num(j.get("step"), 0, 10 ** 18, "step", whole=True, null=True),
            "cpu_seconds": _num(j.get("cpu_seconds"), 0, 1e15, "cpu_seconds"),
            "rss": _num(j.get("rss"), 0, 2 ** 62, "rss", whole=True),
            "procs": _num(j.get("procs"), 0, 10 ** 7, "procs", whole=True),
            "log_mtime": _num(j.get("log_mtime"), 0, 1e11, "log_mtime", null=True),
            "watch": _watched(j.get("watch"), i), "where": _where_tail(j.get("where"), i)}


def _where_tail(w: object, i: int) -> object:
    """The rank sampler's last lines as the node sent them (texts, at most :data:`WHERE_TAIL` characters
    in all; read by ``node.where.parse``, which checks every value), or None."""
    if w is None:
        return None
    if (not isinstance(w, list) or not all(isinstance(x, str) for x in w)
            or sum(len(x) + 1 for x in w) > WHERE_TAIL + 1):
        raise TopError("malformed top reply: jobs[%d].where must be lines of at most %d characters in all"
                       % (i, WHERE_TAIL))
    return w


def _gpu(g: object) -> dict:
    if not isinstance(g, dict):
        raise TopError("malformed top reply: a gpu must be an object")
    return {"index": _num(g.get("index"), 0, 4096, "gpu index", whole=True),
            "util": _num(g.get("util"), 0, 100, "gpu util", null=True),
            "mem_used": _num(g.get("mem_used"), 0, 2 ** 40, "gpu mem_used", null=True),
            "mem_total": _num(g.get("mem_total"), 0, 2 ** 40, "gpu mem_total", null=True)}


def parse_reply(stdout: bytes, jobs: int) -> dict:
    """The node's last marked line, every value checked: it must report exactly ``jobs`` jobs.
    Raises :class:`TopError` saying what was wrong."""
    from .reply import ReplyError, last_marked_json  # launcher side only: never runs on a node
    try:
        r = last_marked_json(stdout, MARK, constant=lambda c: None)  # a NaN rate is no rate
    except ReplyError as e:
        raise TopError("unreadable top reply: %s" % e) from None
    if r is None:
        raise TopError("no answer from the node's top program")
    if not isinstance(r, dict) or not isinstance(r.get("jobs"), list) or len(r["jobs"]) != jobs:
        raise TopError("malformed top reply: expected %d job(s)" % jobs)
    out = {"time": _num(r.get("time"), 0, 1e11, "time"),
           "jobs": [_job(j, i) for i, j in enumerate(r["jobs"])],
           "ncpu": _num(r.get("ncpu", 1), 1, 10 ** 6, "ncpu", whole=True)}
    for k in ("cpu_total", "cpu_idle", "mem_total", "mem_available"):
        out[k] = _num(r.get(k), 0, 2 ** 62, k, whole=True, null=True)
    gpus = r.get("gpus")
    if gpus is not None and (not isinstance(gpus, list) or len(gpus) > MAX_GPUS):
        raise TopError("malformed top reply: gpus must be a list of at most %d" % MAX_GPUS)
    out["gpus"] = None if gpus is None else [_gpu(g) for g in gpus]
    out["gpu_error"] = _text(r.get("gpu_error"), "gpu_error")
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
