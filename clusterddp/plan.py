"""Pure launch planning: inventory + run spec -> one :class:`NodeLaunch` per host.

Every shell command clusterddp sends to a node is rendered here, and all quoting
happens here, once (``shlex.quote``). Nothing in this module touches the network,
the clock or the filesystem: the run id and facts are passed in, so ``--dry-run``
shows exactly what a real run executes and tests compare it to golden files.

On each node a run lives in ``<workdir>/runs/<run_id>/`` (the script's folder is
unpacked there) with a control folder ``.clusterddp/`` holding ``launch.sh``,
``node.log`` (all output), ``pid`` and, once the job ends, ``exit_code``. The job
runs in its own session, detached from SSH, and every process of it carries the
environment marker ``CLUSTERDDP_JOB=<run_id>/<host>``, which is how teardown finds
exactly this node's processes (torchrun puts its workers in sessions of their own,
so a process group alone would miss them).
"""

from __future__ import annotations

import json
import posixpath
import shlex
from dataclasses import dataclass, field
from typing import Callable

from .inventory import Host, Inventory

CONTROL = ".clusterddp"
MARKER = "CLUSTERDDP_JOB"
DEFAULT_GRACE = 10.0


@dataclass(frozen=True)
class RunSpec:
    """What the user asked for on the command line (flags win over the inventory)."""

    script: str                                  # as given, relative to the launch directory or absolute
    script_args: tuple[str, ...] = ()
    name: str | None = None
    gpus: int | None = None                      # --gpus: processes per node, for every node
    master_port: int | None = None
    env: tuple[tuple[str, str], ...] = ()        # -e K=V, applied after the inventory's env
    collect: tuple[str, ...] = ()                # --collect, added to the inventory's globs
    max_restarts: int = 0


@dataclass(frozen=True)
class NodeLaunch:
    """Everything one node runs, as data."""

    host: Host
    node_rank: int
    nproc: int | str              # a count, or "auto" (probed on the node: GPUs, 1 when none)
    run_dir: str                  # where the script runs; may start with "~/"
    control_dir: str
    marker: str                   # value of CLUSTERDDP_JOB for every process of this node's job
    env: tuple[tuple[str, str], ...]
    argv: tuple[str, ...]         # the torchrun command line
    launch_script: str            # the full text of launch.sh


@dataclass(frozen=True)
class LaunchPlan:
    """A whole run: what every node does, and what comes back afterwards."""

    run_id: str
    inventory: Inventory
    spec: RunSpec
    nodes: tuple[NodeLaunch, ...]
    master_addr: str
    master_port: int
    collect: tuple[str, ...]
    upload: bool                  # copy the script's folder to each node (not in local mode)
    local: bool = field(default=False)

    @property
    def nnodes(self) -> int:
        return len(self.nodes)


def q(s: str) -> str:
    """Quote one word for a POSIX shell."""
    return shlex.quote(s)


def qpath(path: str) -> str:
    """Quote a path, letting a leading ``~/`` expand to the remote user's home."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + q(path[2:])
    return q(path)


def build_plan(inventory: Inventory, spec: RunSpec, run_id: str, *, local_run_dir: str | None = None,
               local_control_dir: str | None = None) -> LaunchPlan:
    """Plan a run. Local mode (``up local``: run in place, ``torchrun --standalone``) is chosen by
    passing the absolute launch directory and the control folder."""
    local = local_run_dir is not None
    master_port = spec.master_port or inventory.master.port
    nodes = []
    for rank, host in enumerate(inventory.hosts):
        if local:
            assert local_control_dir, "local mode needs a control folder"
            run_dir, control_dir = local_run_dir, local_control_dir
            script = spec.script
        else:
            run_dir = posixpath.join(host.workdir, "runs", run_id)
            control_dir = posixpath.join(run_dir, CONTROL)
            script = posixpath.basename(spec.script)
        nproc: int | str = spec.gpus or host.gpus
        # With restarts, torchrun's shared rendezvous store hands restarted workers the previous
        # attempt's addresses and gloo's connectFullMesh is refused (pytorch/pytorch#135712):
        # workers get a store of their own instead. The inventory or -e may still set it.
        restart_env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"} if spec.max_restarts > 0 else {}
        node_env = tuple({**restart_env, **dict(host.env), **dict(spec.env)}.items())
        torchrun = [host.python, "-m", "torch.distributed.run"]
        if local:
            torchrun += ["--standalone", "--nnodes", "1"]
        elif spec.max_restarts > 0:
            # Static rendezvous does not restart nodes together: a restarted node would meet the
            # others' previous attempt. c10d rendezvous runs each restart as a new round on every
            # node; torch then assigns node ranks itself. is_host and --local-addr spare torch from
            # resolving the node's own hostname, which need not resolve.
            is_host = int(host.name == inventory.master.host)
            torchrun += ["--nnodes", str(len(inventory.hosts)), "--rdzv-backend", "c10d",
                         "--rdzv-endpoint", f"{inventory.master.addr}:{master_port}", "--rdzv-id", run_id,
                         "--rdzv-conf", f"is_host={is_host}", "--local-addr", "$LOCAL_ADDR"]
        else:
            torchrun += ["--nnodes", str(len(inventory.hosts)), "--node-rank", str(rank),
                         "--master-addr", inventory.master.addr, "--master-port", str(master_port)]
        torchrun += ["--nproc-per-node", "$NPROC" if nproc == "auto" else str(nproc),
                     "--max-restarts", str(spec.max_restarts), script, *spec.script_args]
        marker = f"{run_id}/{host.name}"
        node = NodeLaunch(host, rank, nproc, run_dir, control_dir, marker, node_env, tuple(torchrun), "")
        nodes.append(_with_script(node, run_id, len(inventory.hosts), inventory.master.addr, local))
    collect = tuple(dict.fromkeys(inventory.collect + spec.collect))
    return LaunchPlan(run_id, inventory, spec, tuple(nodes), inventory.master.addr, master_port,
                      collect, upload=not local, local=local)


# ---- launch.sh ----

_IFACE_FN = r"""cddp_iface() {  # the interface on this node that routes to $1 (the master)
  local a; a=$(getent ahostsv4 "$1" 2>/dev/null | awk 'NR==1{print $1}'); a=${a:-$1}
  ip -o -4 addr show to "$a" 2>/dev/null | awk 'NR==1{print $2; f=1} END{exit !f}' && return 0
  ip -o route get "$a" 2>/dev/null | sed -n 's/.* dev \([^ ]*\).*/\1/p' | head -n 1
}"""

_PROBED = ("$NPROC", "$LOCAL_ADDR")  # argv words whose value launch.sh finds on the node
_NPROC_AUTO = ("NPROC=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); "
               "[ \"${NPROC:-0}\" -gt 0 ] 2>/dev/null || NPROC=1")


def _with_script(node: NodeLaunch, run_id: str, nnodes: int, master_addr: str, local: bool) -> NodeLaunch:
    h = node.host
    ctl = node.control_dir
    lines = [
        "#!/usr/bin/env bash",
        f"# clusterddp run {run_id}: node {node.node_rank} of {nnodes} ({h.name})",
        "# A stop signal must not kill this shell before it records the exit code;",
        "# a trap (unlike ignoring the signal) is reset for the children, so torchrun still gets it.",
        "trap 'echo \"[clusterddp] stop signal received\" >&2' TERM INT HUP",
        f"CTL={qpath(ctl)}",
        'cddp_exit() { echo "$1" > "$CTL/exit_code.tmp" && mv "$CTL/exit_code.tmp" "$CTL/exit_code"; exit "$1"; }',
        f"cd {qpath(node.run_dir)} || cddp_exit 97",
        f"export CLUSTERDDP_RUN_ID={q(run_id)} CLUSTERDDP_HOST={q(h.name)} "
        f"CLUSTERDDP_NODE_RANK={node.node_rank}",
    ]
    lines += _setup_lines(h, "", lambda line: f"echo {q('[clusterddp] setup failed: ' + line)} >&2; cddp_exit 98")
    for k, v in node.env:
        lines.append(f"export {k}={q(v)}")
    env_keys = {k for k, _ in node.env}
    if not local and ("$LOCAL_ADDR" in node.argv
                      or not {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"} <= env_keys):
        lines += [_IFACE_FN, f"IFACE=$(cddp_iface {q(master_addr)})",
                  'if [ -n "$IFACE" ]; then']
        lines += [f"  export {k}=\"$IFACE\"" for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
                  if k not in env_keys]
        warning = (f"[clusterddp] warning: no interface routes to {master_addr}; "
                   "set NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME in the inventory env")
        if "$LOCAL_ADDR" in node.argv:
            lines.append("  LOCAL_ADDR=$(ip -o -4 addr show dev \"$IFACE\" | awk 'NR==1{split($4, a, \"/\"); print a[1]}')")
        lines += ["else", f"  echo {q(warning)} >&2", "fi"]
    if node.nproc == "auto":
        lines.append(_NPROC_AUTO)
    argv = " ".join(f'"{a}"' if a in _PROBED else q(a) for a in node.argv)
    lines += [
        f"echo \"[clusterddp] node {node.node_rank}/{nnodes} on $(hostname)"
        + (" iface=${IFACE:-?}" if not local else "") + "\"",
        argv,
        "cddp_exit $?",
        "",
    ]
    return NodeLaunch(**{**node.__dict__, "launch_script": "\n".join(lines)})


# ---- commands sent to a node (all through `bash -c` / the login shell) ----

def prepare_command(node: NodeLaunch) -> str:
    """Create the run and control folders; refuse to reuse a run folder that already has a job."""
    return (f"mkdir -p {qpath(node.control_dir)} && cd {qpath(node.control_dir)} && "
            f"if [ -e pid ]; then echo 'run folder already holds a job' >&2; exit 3; fi && pwd")


def upload_command(path: str) -> str:
    """Write standard input to ``path`` (used for the source tarball and launch.sh)."""
    return f"cat > {qpath(path)}"


def unpack_command(node: NodeLaunch) -> str:
    tar = qpath(node.control_dir + "/source.tar.gz")
    return f"cd {qpath(node.run_dir)} && tar -xzf {tar} && rm -f {tar}"


def start_command(node: NodeLaunch) -> str:
    """Start launch.sh in a new session, detached from this SSH connection; print its pid.

    ``setsid`` is not a process group leader here, so it execs in place and ``$!`` is the
    job's shell. Its output goes to node.log, so the job never depends on the SSH channel.
    """
    return (f"cd {qpath(node.control_dir)} || exit 3; {MARKER}={q(node.marker)} setsid bash launch.sh "
            "> node.log 2>&1 < /dev/null & echo $! > pid; cat pid")


# Follows node.log until the job has ended and the log is drained. The end is the exit_code
# file, or the job's shell gone or a zombie: `tail --pid` treats an unreaped zombie as alive,
# and an orphan's reaping can lag by seconds, so tail would hold every run's end back.
_FOLLOW_PY = r"""
import os, sys, time
os.chdir(sys.argv[1])
line, poll = int(sys.argv[2]), float(sys.argv[3])
pid = int(open("pid").read().strip() or 0)
def alive():
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
out = sys.stdout.buffer
log = open("node.log", "rb")
while line > 1:  # skip to the first line wanted, waiting for it if needed
    pos, text = log.tell(), log.readline()
    if text.endswith(b"\n"):
        line -= 1
        continue
    log.seek(pos)
    if os.path.exists("exit_code") or not alive():
        sys.exit(0)
    time.sleep(poll)
while True:
    done = os.path.exists("exit_code") or not alive()
    chunk = log.read(1 << 16)
    if chunk:
        out.write(chunk)
        out.flush()
    elif done:
        break
    else:
        time.sleep(poll)
"""


def follow_command(node: NodeLaunch, from_line: int = 1, poll: float = 0.1) -> str:
    """Stream node.log from ``from_line`` until the job has ended and its log is drained."""
    return _py(node, _FOLLOW_PY, qpath(node.control_dir), str(int(from_line)), str(poll))


def status_command(node: NodeLaunch) -> str:
    """Print one line: ``running``, ``exit N``, ``lost`` (no process, no exit code) or ``missing``."""
    return (f"cd {qpath(node.control_dir)} 2>/dev/null || {{ echo missing; exit 0; }}; "
            "if [ -s exit_code ]; then echo \"exit $(cat exit_code)\"; "
            f"elif [ -n \"$(grep -lzxF {q(MARKER + '=' + node.marker)} /proc/[0-9]*/environ 2>/dev/null)\" ]; "
            "then echo running; else echo lost; fi")


def teardown_command(node: NodeLaunch, grace: float = DEFAULT_GRACE) -> str:
    """End every process of this node's job: SIGTERM, then SIGKILL after ``grace`` seconds.

    Processes are found by their environment marker, so nothing of another run is touched.
    Prints ``clean`` (nothing ran), ``terminated``, ``killed`` or ``survivors <pids>``.
    """
    m = q(f"{MARKER}={node.marker}")
    steps = max(1, int(grace * 10))
    return (f"cddp_pids() {{ grep -lzxF {m} /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3; }}; "
            "P=$(cddp_pids); [ -z \"$P\" ] && { echo clean; exit 0; }; "
            "kill -TERM $P 2>/dev/null; "
            f"for i in $(seq {steps}); do sleep 0.1; P=$(cddp_pids); [ -z \"$P\" ] && {{ echo terminated; exit 0; }}; done; "
            "kill -KILL $P 2>/dev/null; sleep 0.3; P=$(cddp_pids); "
            "if [ -z \"$P\" ]; then echo killed; else echo survivors $P; fi")


# The node side of `collect`: one command per node, so a collect pays for one remote shell
# (whose rc files may take a noticeable time) whatever the number of files. It reads a JSON
# request on stdin, {"globs": [...] or "paths": [...], "have": {path: size of the local copy},
# "log": bool}, and answers on stdout with JSON header lines, some followed by raw bytes:
#   {"log": n} + n bytes               the node log
#   {"files": [{"path", "size"}, ...]} what it will go through (regular files, no links, not .clusterddp)
#   {"path", "send": n} + n bytes, then {"path", "sha256", "stable"}   a file whose local copy differs in size
#   {"path", "sha256", "stable"}       a file whose local copy has its size: only its hash
#   {"path", "error"}                  a file it could not read
#   {"tick": 1}                        keeps the stream alive while large files are hashed
# "stable" is false when the file changed while it was read (a job still writing it). A file
# that shrank while sent is padded to its announced size so the framing holds; it is unstable.
_COLLECT_PY = r"""
import glob, hashlib, json, os, sys, time
req = json.load(sys.stdin)
out = sys.stdout.buffer
try:  # a 1 MiB pipe to sshd: this side hashes the next chunk while sshd sends the last
    import fcntl
    fcntl.fcntl(1, 1031, 1 << 20)  # F_SETPIPE_SZ (Linux); elsewhere, or over the limit: keep the default
except (ImportError, OSError):
    pass
def emit(**rec):
    out.write(json.dumps(rec).encode() + b"\n")
if req.get("log"):
    try:
        with open(sys.argv[2], "rb") as f:
            data = f.read()
        emit(log=len(data))
        out.write(data)
    except OSError:
        pass
os.chdir(sys.argv[1])
names = req.get("paths") or [p for pat in req.get("globs", []) for p in sorted(glob.glob(pat, recursive=True))]
files = {}
for p in names:
    if p not in files and os.path.isfile(p) and not os.path.islink(p) and not p.startswith(".clusterddp"):
        files[p] = os.stat(p)
emit(files=[{"path": p, "size": st.st_size} for p, st in files.items()])
last = time.monotonic()
buf = memoryview(bytearray(1 << 20))  # one buffer for every read: no allocation per MiB
for p, st in files.items():
    send = req["have"].get(p) != st.st_size
    try:
        f = open(p, "rb")
    except OSError as e:
        emit(path=p, error=str(e))
        continue
    with f:
        if send:
            emit(path=p, send=st.st_size)
        h, n = hashlib.sha256(), 0
        while n < st.st_size:
            b = buf[:f.readinto(buf[:min(len(buf), st.st_size - n)])]
            if not b:
                break
            h.update(b)
            n += len(b)
            if send:
                out.write(b)
            elif time.monotonic() - last > 5:
                emit(tick=1)
                out.flush()
                last = time.monotonic()
        padded = n
        while send and padded < st.st_size:  # it shrank: keep the framing (reported unstable below)
            k = min(len(buf), st.st_size - padded)
            out.write(bytes(k))
            padded += k
        now = os.fstat(f.fileno())
    same = [(s.st_ino, s.st_size, s.st_mtime_ns) for s in (st, now)]
    emit(path=p, sha256=h.hexdigest(), stable=n == st.st_size and same[0] == same[1])
out.flush()
"""


def _py(node: NodeLaunch, code: str, *args: str) -> str:
    """Run a stdlib-only Python snippet with the node's interpreter, after its setup lines.

    ``-S``: no site-packages to scan (.pth files and all); the snippets need only the standard
    library, and a collect starts measurably sooner.
    """
    setup = "".join(f"{line}; " for line in _setup_lines(node.host, ">/dev/null 2>&1", lambda line: "true"))
    return f"{setup}{q(node.host.python)} -S -c {q(code)} " + " ".join(args)


def collect_command(node: NodeLaunch) -> str:
    """The node side of ``collect`` (see ``_COLLECT_PY``): request on stdin, log and files on stdout."""
    return _py(node, _COLLECT_PY, qpath(node.run_dir), qpath(node.control_dir + "/node.log"))


def node_log_command(node: NodeLaunch) -> str:
    return f"cat {qpath(node.control_dir + '/node.log')}"


def render(plan: LaunchPlan) -> str:
    """The dry-run text: for every node, where it runs and the exact launch script."""
    out = [f"run {plan.run_id}: {plan.nnodes} node(s), master {plan.master_addr}:{plan.master_port}"]
    for n in plan.nodes:
        h = n.host
        where = "this machine" if plan.local else f"{h.user + '@' if h.user else ''}{h.address}" + (
            f":{h.port}" if h.port else "")
        out += ["", f"== {h.name} (node {n.node_rank}, {where}) ==",
                f"run folder: {n.run_dir}", f"start: {start_command(n)}", "launch.sh:", n.launch_script]
    if plan.collect:
        out += ["", "collect: " + ", ".join(plan.collect)]
    return "\n".join(out)


# ---- fleet commands: the preflight probe and `clusterddp exec` ----

PROBE_MARK = "CLUSTERDDP_PROBE "

# Runs with the node's own `python`, which may be old: no f-strings, each part guarded, so a
# partial report still comes back. Prints one line: PROBE_MARK + JSON (parsed in check.py).
_PROBE_PY = r"""
import json, os, socket, sys, time
a = json.loads(sys.argv[1])
r = {"python": "%d.%d.%d" % tuple(sys.version_info[:3]), "executable": sys.executable,
     "hostname": socket.gethostname(), "iface": sys.argv[2] or None, "torch": None, "cuda": None,
     "nccl": None, "torch_error": None, "full": a["full"]}
try:  # torch's version and CUDA build from its version.py: no `import torch` (seconds) needed
    import importlib.util
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        r["torch_error"] = "not installed"
    else:
        ns = {}
        with open(os.path.join(list(spec.submodule_search_locations)[0], "version.py")) as f:
            exec(f.read(), ns)
        r["torch"], r["cuda"] = ns.get("__version__"), ns.get("cuda")
except Exception as e:
    r["torch_error"] = "%s: %s" % (type(e).__name__, e)
if a["full"] and r["torch"]:
    try:
        import torch
        r["torch"], r["cuda"] = torch.__version__, torch.version.cuda
        if torch.version.cuda:
            try:
                v = torch.cuda.nccl.version()
                r["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
            except Exception:
                pass
    except Exception as e:
        r["torch_error"] = "import torch failed: %s: %s" % (type(e).__name__, e)
if a["full"]:
    import subprocess
    try:
        p = subprocess.Popen(["nvidia-smi", "-L"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             universal_newlines=True)
        out, err = p.communicate(timeout=30)
        if p.returncode == 0:
            r["gpus"] = sum(1 for l in out.splitlines() if l.startswith("GPU "))
        else:
            r["gpu_error"] = ((err or out).strip().splitlines() or ["exit %d" % p.returncode])[-1]
    except OSError:
        r["gpus"] = None
    except Exception as e:
        p.kill()
        r["gpu_error"] = "nvidia-smi did not answer: %s" % e
try:
    r["interfaces"] = sorted(n for _, n in socket.if_nameindex())
except Exception:
    r["interfaces"] = None
try:
    import shutil
    r["ip_tool"] = shutil.which("ip") is not None
except Exception:
    pass
r["env_ifname"] = dict((k, os.environ.get(k)) for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"))
try:  # free space where the runs will go: the workdir, or its nearest existing parent
    w = p = os.path.expanduser(a["workdir"])
    while p and not os.path.exists(p):
        p = os.path.dirname(p.rstrip("/"))
    p = p or "."
    st = os.statvfs(p)
    r.update(disk_path=p, disk_free=st.f_bavail * st.f_frsize, workdir_exists=os.path.isdir(w),
             disk_writable=os.access(p, os.W_OK | os.X_OK))
except Exception as e:
    r["disk_error"] = "%s: %s" % (type(e).__name__, e)
if a["port"]:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's TCPStore: TIME_WAIT is no conflict
    try:
        s.bind(("", a["port"]))
        r["port_free"] = True
    except Exception as e:
        r["port_free"], r["port_error"] = False, getattr(e, "strerror", None) or str(e)
    s.close()
r["time"] = time.time()
sys.stdout.write(a["mark"] + json.dumps(r) + "\n")
sys.stdout.flush()
os._exit(0)  # now: the launcher's clock reading must follow the node's at once (and torch's teardown is slow)
"""


def _setup_lines(host: Host, stdout_to: str, on_fail: Callable[[str], str]) -> list[str]:
    """The host's setup lines, output redirected by ``stdout_to`` (may be empty), each followed by
    ``on_fail(line)`` if it fails. Every shell line that runs ``setup`` is rendered here."""
    redirect = f" {stdout_to}" if stdout_to else ""
    return [f"{{ {line}\n}}{redirect} || {{ {on_fail(line)}; }}" for line in host.setup]


def probe_command(host: Host, master_addr: str, master_port: int | None, *, full: bool = True,
                  env: tuple[tuple[str, str], ...] | None = None) -> str:
    """One command that reports what the preflight checks need about ``host``, as one JSON line.

    It runs the host's setup lines and exports its env first, as launch.sh does, then its
    ``python``. ``master_port`` is given for the master only (it tries to bind it). ``full``
    also imports torch (NCCL version, a broken install) and asks nvidia-smi for the GPUs;
    without it the probe takes a fraction of a second (what ``up`` runs before starting).
    """
    args = {"full": full, "port": master_port, "workdir": host.workdir, "mark": PROBE_MARK}
    lines = _setup_lines(host, ">&2", lambda line: f"echo {q(PROBE_MARK + json.dumps({'setup_failed': line}))}; exit 0")
    lines += [f"export {k}={q(v)}" for k, v in (host.env if env is None else env)]
    lines += [_IFACE_FN, f"IFACE=$(cddp_iface {q(master_addr)})",
              f"exec {q(host.python)} -c {q(_PROBE_PY)} {q(json.dumps(args))} \"$IFACE\""]
    return "\n".join(lines)


def exec_command(host: Host, words: list[str] | tuple[str, ...]) -> str:
    """The user's command for ``clusterddp exec``, after the host's setup lines and env.

    Like ssh and pdsh, the words are joined with spaces and the remote shell interprets
    them (pipes, globs, ``$VAR``): ``exec inv -- 'ls runs | wc -l'`` works, and arguments
    that must stay one word need quoting for the remote shell.
    """
    lines = [f"export CLUSTERDDP_HOST={q(host.name)}"]
    lines += _setup_lines(host, ">/dev/null",
                          lambda line: f"echo {q('[clusterddp] setup failed: ' + line)} >&2; exit 98")
    lines += [f"export {k}={q(v)}" for k, v in host.env]
    lines.append(" ".join(words))
    return "\n".join(lines)
