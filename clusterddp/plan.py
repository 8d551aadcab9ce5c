"""Pure launch planning: inventory + run spec -> one :class:`NodeLaunch` per host.

Every shell command clusterddp sends to a node is rendered here, and all quoting
happens here, once (``shlex.quote``); the Python programs some of them run on the node
are modules of :mod:`clusterddp.node`, sent as source. Nothing in this module touches the
network, the clock or the filesystem (beyond reading those modules' source from this
package): the run id and facts are passed in, so ``--dry-run`` shows exactly what a real
run executes and tests compare it to golden files.

On each node a run lives in ``<workdir>/runs/<run_id>/`` (the script's folder is
unpacked there) with a control folder ``.clusterddp/`` holding ``launch.sh``,
``node.log`` (all output), ``pid`` and, once the job ends, ``exit_code``: the folder 0700 and
its files 0600 whatever the node's umask (launch.sh holds the env values), while the job itself
keeps the node's umask. Env values never appear on a command line, where every user of the
node could read them in ``/proc/PID/cmdline``: launch.sh is uploaded over stdin, and the probe
and ``exec`` read their exports from stdin (:class:`NodeCommand`). The job
runs in its own session, detached from SSH, and every process of it carries the
environment marker ``CLUSTERDDP_JOB=<run_id>/<host>``, which is how teardown finds
exactly this node's processes (torchrun puts its workers in sessions of their own,
so a process group alone would miss them).
"""

from __future__ import annotations

import json
import posixpath
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from .inventory import Host, Inventory
from .node import envinfo as node_envinfo
from .node import probe as node_probe
from .node import source as node_source

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


class NodeCommand(NamedTuple):
    """A command and the bytes to feed its standard input (a transport's ``run(text, stdin=...)``)."""

    text: str
    stdin: bytes


# The shell variable that holds the exports read from stdin, until they are evaluated.
_ENV_VAR = "cddp_env"


# ---- how every node command starts ----

def _exports(env: Iterable[tuple[str, str]]) -> list[str]:
    return [f"export {k}={q(v)}" for k, v in env]


def _preamble(host: Host, env: Iterable[tuple[str, str]], *, stdout_to: str,
              on_fail: Callable[[str], str], env_on_stdin: bool = False) -> list[str]:
    """The lines a node command starts with: the host's setup lines, output redirected by
    ``stdout_to`` (may be empty), each followed by ``on_fail(line)`` if it fails; then an
    ``export`` of each of ``env``. launch.sh, the probe, exec and the node helpers all start here.

    ``env_on_stdin``: the exports are not in the text but read from standard input first (before a
    setup line could read it) and evaluated in their place; send :func:`_env_stdin` there. They are
    the very lines that would be inline, each value quoted once by :func:`q`, so ``eval`` of them
    runs exactly what the inline lines would, and the values stay off every command line."""
    env = tuple(env)
    redirect = f" {stdout_to}" if stdout_to else ""
    lines = [f"{{ {line}\n}}{redirect} || {{ {on_fail(line)}; }}" for line in host.setup]
    if not env_on_stdin:
        return lines + _exports(env)
    if not env:
        return lines
    return [f"{_ENV_VAR}=$(cat)", *lines, f'eval "${_ENV_VAR}"; unset {_ENV_VAR}']


def _env_stdin(env: Iterable[tuple[str, str]]) -> bytes:
    """What a command rendered with ``env_on_stdin`` reads from its standard input."""
    return "".join(line + "\n" for line in _exports(env)).encode()


def _python(host: Host, program: str, args: Iterable[str], *, site: bool = False) -> str:
    """Run node program ``program`` (a module of ``clusterddp/node``) with the host's python.

    Nothing is installed on nodes: the module's whole source travels as ``-c``. ``-S`` unless
    ``site``: no site-packages to scan (.pth files and all); the helpers need only the standard
    library, and a collect starts measurably sooner.
    """
    return " ".join([q(host.python), *([] if site else ["-S"]), "-c", q(node_source(program)), *args])


def _helper(node: NodeLaunch, program: str, *args: str) -> str:
    """A node program run by a job's launcher after the host's setup lines (quietly, failures
    ignored), without the job's env: a PYTHONPATH there could shadow the modules it imports."""
    lines = _preamble(node.host, (), stdout_to=">/dev/null 2>&1", on_fail=lambda line: "true")
    return "\n".join([*lines, _python(node.host, program, args)])


# ---- the plan ----

class _Probed(str):
    """An argv word of clusterddp's own whose value launch.sh finds on the node: rendered in double
    quotes so it expands. Only these words expand; every user word (a script argument that reads
    ``$NPROC`` included) is an ordinary ``str`` and is quoted to stay literal."""


NPROC, LOCAL_ADDR = _Probed("$NPROC"), _Probed("$LOCAL_ADDR")


def _probes(argv: Iterable[str], word: _Probed) -> bool:
    return any(isinstance(a, _Probed) and a == word for a in argv)


def build_plan(inventory: Inventory, spec: RunSpec, run_id: str, *, local_run_dir: str | None = None,
               local_control_dir: str | None = None) -> LaunchPlan:
    """Plan a run. Local mode (``up local``: run in place, ``torchrun --standalone``) is chosen by
    passing the absolute launch directory and the control folder."""
    local = local_run_dir is not None
    master_port = spec.master_port or inventory.master.port
    nodes = []
    for rank, host in enumerate(inventory.hosts):
        if local:
            assert local_run_dir and local_control_dir, "local mode needs a run and a control folder"
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
                         "--rdzv-conf", f"is_host={is_host}", "--local-addr", LOCAL_ADDR]
        else:
            torchrun += ["--nnodes", str(len(inventory.hosts)), "--node-rank", str(rank),
                         "--master-addr", inventory.master.addr, "--master-port", str(master_port)]
        torchrun += ["--nproc-per-node", NPROC if nproc == "auto" else str(nproc),
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

_NPROC_AUTO = ("NPROC=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); "
               "[ \"${NPROC:-0}\" -gt 0 ] 2>/dev/null || NPROC=1")


def _iface_lines(env_keys: set[str], master_addr: str, local_addr: bool = False) -> list[str]:
    """Export NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME (those ``env`` does not set) as the
    interface that routes to the master, probed on the node; ``local_addr``: also its address.
    The one interface choice, shared by launch.sh and ``check --collective``."""
    if not (local_addr or not {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"} <= env_keys):
        return []
    lines = [_IFACE_FN, f"IFACE=$(cddp_iface {q(master_addr)})", 'if [ -n "$IFACE" ]; then']
    lines += [f"  export {k}=\"$IFACE\"" for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
              if k not in env_keys]
    warning = (f"[clusterddp] warning: no interface routes to {master_addr}; "
               "set NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME in the inventory env")
    if local_addr:
        lines.append("  LOCAL_ADDR=$(ip -o -4 addr show dev \"$IFACE\" "
                     "| awk 'NR==1{split($4, a, \"/\"); print a[1]}')")
    return lines + ["else", f"  echo {q(warning)} >&2", "fi"]


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
        "# exit_code is written 0600 whatever umask the job runs with (the node's own, or a setup line's).",
        ('cddp_exit() { (umask 077 && echo "$1" > "$CTL/exit_code.tmp") && mv "$CTL/exit_code.tmp" "$CTL/exit_code"; '
         'exit "$1"; }'),
        f"cd {qpath(node.run_dir)} || cddp_exit 97",
        f"export CLUSTERDDP_RUN_ID={q(run_id)} CLUSTERDDP_HOST={q(h.name)} "
        f"CLUSTERDDP_NODE_RANK={node.node_rank}",
    ]
    lines += _preamble(h, node.env, stdout_to="",
                       on_fail=lambda line: f"echo {q('[clusterddp] setup failed: ' + line)} >&2; cddp_exit 98")
    if not local:
        lines += _iface_lines({k for k, _ in node.env}, master_addr, _probes(node.argv, LOCAL_ADDR))
    if node.nproc == "auto":
        lines.append(_NPROC_AUTO)
    argv = " ".join(f'"{a}"' if isinstance(a, _Probed) else q(a) for a in node.argv)
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
    """Create the run and control folders; refuse to reuse a run folder that already has a job.

    The control folder is made 0700 (it holds launch.sh, with the env values); the run folder,
    where the script runs and writes, keeps the node's usual modes."""
    ctl = qpath(node.control_dir)
    return (f"mkdir -p {ctl} && chmod 700 {ctl} && cd {ctl} && "
            f"if [ -e pid ]; then echo 'run folder already holds a job' >&2; exit 3; fi && pwd")


def upload_command(path: str) -> str:
    """Write standard input to ``path``, mode 0600 (the source tarball and launch.sh, in the
    control folder)."""
    p = qpath(path)
    return f"umask 077 && cat > {p} && chmod 600 {p}"


def unpack_command(node: NodeLaunch) -> str:
    tar = qpath(node.control_dir + "/source.tar.gz")
    return f"cd {qpath(node.run_dir)} && tar -xzf {tar} && rm -f {tar}"


def start_command(node: NodeLaunch) -> str:
    """Start launch.sh in a new session, detached from this SSH connection; print its pid.

    ``setsid`` is not a process group leader here, so it execs in place and ``$!`` is the
    job's shell. Its output goes to node.log, so the job never depends on the SSH channel.
    node.log and pid are made 0600 in subshells: the job keeps the node's umask for its own files.
    """
    return (f"cd {qpath(node.control_dir)} || exit 3; (umask 077 && : > node.log && chmod 600 node.log) || exit 3; "
            f"{MARKER}={q(node.marker)} setsid bash launch.sh "
            "> node.log 2>&1 < /dev/null & (umask 077 && echo $! > pid); cat pid")


def follow_command(node: NodeLaunch, from_line: int = 1, poll: float = 0.1) -> str:
    """Stream node.log from ``from_line`` until the job has ended and its log is drained
    (the node program ``clusterddp/node/follow.py``)."""
    return _helper(node, "follow", qpath(node.control_dir), str(int(from_line)), str(poll))


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
            f"for i in $(seq {steps}); do sleep 0.1; P=$(cddp_pids); "
            "[ -z \"$P\" ] && { echo terminated; exit 0; }; done; "
            "kill -KILL $P 2>/dev/null; sleep 0.3; P=$(cddp_pids); "
            "if [ -z \"$P\" ]; then echo killed; else echo survivors $P; fi")


def collect_command(node: NodeLaunch) -> str:
    """The node side of ``collect`` (``clusterddp/node/collect.py``): request on stdin, log and files on stdout."""
    return _helper(node, "collect", qpath(node.run_dir), qpath(node.control_dir + "/node.log"))


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

def probe_command(host: Host, master_addr: str, master_port: int | None, *, full: bool = True,
                  env: tuple[tuple[str, str], ...] | None = None) -> NodeCommand:
    """One command that reports what the preflight checks need about ``host``, as one JSON line.

    It runs the host's setup lines and exports its env first (read from its stdin), as launch.sh does, then its
    ``python``. ``master_port`` is given for the master only (it tries to bind it). ``full``
    also imports torch (NCCL version, a broken install) and asks nvidia-smi for the GPUs;
    without it the probe takes a fraction of a second (what ``up`` runs before starting).
    """
    args = {"full": full, "port": master_port, "workdir": host.workdir}
    env = host.env if env is None else env
    lines = _preamble(host, env, stdout_to=">&2", env_on_stdin=True,
                      on_fail=lambda line: f"echo {q(node_probe.setup_failed_reply(line))}; exit 0")
    lines += [_IFACE_FN, f"IFACE=$(cddp_iface {q(master_addr)})",
              "exec " + _python(host, "probe", [q(json.dumps(args)), '"$IFACE"'], site=True)]
    return NodeCommand("\n".join(lines), _env_stdin(env))


def exec_command(host: Host, words: list[str] | tuple[str, ...]) -> NodeCommand:
    """The user's command for ``clusterddp exec``, after the host's setup lines and env.

    Like ssh and pdsh, the words are joined with spaces and the remote shell interprets
    them (pipes, globs, ``$VAR``): ``exec inv -- 'ls runs | wc -l'`` works, and arguments
    that must stay one word need quoting for the remote shell. The env arrives on stdin, which
    is read to its end first: the user's command finds its stdin empty (it never was interactive).
    """
    lines = [f"export CLUSTERDDP_HOST={q(host.name)}"]
    lines += _preamble(host, host.env, stdout_to=">/dev/null", env_on_stdin=True,
                       on_fail=lambda line: f"echo {q('[clusterddp] setup failed: ' + line)} >&2; exit 98")
    lines.append(" ".join(words))
    return NodeCommand("\n".join(lines), _env_stdin(host.env))


def collective_command(host: Host, master_addr: str, args: dict) -> NodeCommand:
    """The node side of ``check --collective`` (``clusterddp/node/collective.py``; ``args`` is its
    JSON argument: rank, world, sizes, bounds). Set up as launch.sh sets up a job: the host's setup
    lines and env (on stdin), the same interface choice (:func:`_iface_lines`), the host's python
    with its site-packages (torch)."""
    lines = _preamble(host, host.env, stdout_to=">&2", env_on_stdin=True,
                      on_fail=lambda line: f"echo {q('[clusterddp] setup failed: ' + line)} >&2; exit 98")
    lines += _iface_lines({k for k, _ in host.env}, master_addr)
    lines.append("exec " + _python(host, "collective", [q(json.dumps(args, sort_keys=True))], site=True))
    return NodeCommand("\n".join(lines), _env_stdin(host.env))


def envinfo_command(host: Host, run_dir: str | None = None, files: Iterable[str] = ()) -> NodeCommand:
    """The node side of ``check --diff`` (``clusterddp/node/envinfo.py``): after the host's setup
    lines and env (on stdin), its python with site-packages reports versions, packages and, when
    ``run_dir`` (a previous run's folder there) is given, a hash of ``files`` below it."""
    lines = _preamble(host, host.env, stdout_to=">&2", env_on_stdin=True,
                      on_fail=lambda line: f"echo {q('[clusterddp] setup failed: ' + line)} >&2; exit 98")
    args = [qpath(run_dir), q(node_envinfo.files_arg(list(files)))] if run_dir else []
    lines.append("exec " + _python(host, "envinfo", args, site=True))
    return NodeCommand("\n".join(lines), _env_stdin(host.env))
