"""The pieces every node script and node command is made of, for every backend: quoting, the setup
lines and exports a command starts with, the interface choice, the exit-code function, the marker
scan and the shipped ``clusterddp.train`` lookup. One copy each, used by :mod:`clusterddp.plan`
(SSH and local runs) and by the Slurm backend's node script, so the two never drift apart.

Pure text: nothing here touches the network, the clock or the filesystem (beyond reading the node
programs' source from :mod:`clusterddp.node`).
"""

from __future__ import annotations

import json
import posixpath
import shlex
from collections.abc import Callable, Iterable
from typing import NamedTuple, Protocol

from .node import source as node_source

CONTROL = ".clusterddp"      # a run folder's private control folder
MARKER = "CLUSTERDDP_JOB"    # the environment marker every process of a node's job carries
ERRORS = "errors"            # in a node's control folder: torchrun's --log-dir (per-rank error files)
# clusterddp.train travels with every run (clusterddp.upload puts it in the tarball) for nodes
# whose python lacks clusterddp; it is unpacked here, below the run folder.
SHIPPED_LIB = CONTROL + "/lib"


class HostLike(Protocol):
    """What the preamble needs of a host (an inventory Host, or a Slurm inventory's node settings)."""

    @property
    def setup(self) -> tuple[str, ...]: ...

    @property
    def python(self) -> str: ...


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


def exports(env: Iterable[tuple[str, str]]) -> list[str]:
    return [f"export {k}={q(v)}" for k, v in env]


def preamble(host: HostLike, env: Iterable[tuple[str, str]], *, stdout_to: str,
             on_fail: Callable[[str], str], env_on_stdin: bool = False) -> list[str]:
    """The lines a node command starts with: the host's setup lines, output redirected by
    ``stdout_to`` (may be empty), each followed by ``on_fail(line)`` if it fails; then an
    ``export`` of each of ``env``. launch.sh, node.sh, the probe, exec and the node helpers all start here.

    ``env_on_stdin``: the exports are not in the text but read from standard input first (before a
    setup line could read it) and evaluated in their place; send :func:`env_stdin` there. They are
    the very lines that would be inline, each value quoted once by :func:`q`, so ``eval`` of them
    runs exactly what the inline lines would, and the values stay off every command line."""
    env = tuple(env)
    redirect = f" {stdout_to}" if stdout_to else ""
    lines = [f"{{ {line}\n}}{redirect} || {{ {on_fail(line)}; }}" for line in host.setup]
    if not env_on_stdin:
        return lines + exports(env)
    if not env:
        return lines
    return [f"{_ENV_VAR}=$(cat)", *lines, f'eval "${_ENV_VAR}"; unset {_ENV_VAR}']


def env_stdin(env: Iterable[tuple[str, str]]) -> bytes:
    """What a command rendered with ``env_on_stdin`` reads from its standard input."""
    return "".join(line + "\n" for line in exports(env)).encode()


def python_command(python: str, program: str, args: Iterable[str], *, site: bool = False) -> str:
    """Run node program ``program`` (a module of ``clusterddp/node``) with ``python``.

    Nothing is installed on nodes: the module's whole source travels as ``-c``. ``-S`` unless
    ``site``: no site-packages to scan (.pth files and all); the helpers need only the standard
    library, and a collect starts measurably sooner.
    """
    return " ".join([q(python), *([] if site else ["-S"]), "-c", q(node_source(program)), *args])


# ---- the job's own lines ----

def exit_function() -> str:
    """``cddp_exit N``: write N to ``$CTL/exit_code`` (0600 whatever umask the job runs with: the node's
    own, or a setup line's; written whole, then renamed) and exit N."""
    return ('cddp_exit() { (umask 077 && echo "$1" > "$CTL/exit_code.tmp") && '
            'mv "$CTL/exit_code.tmp" "$CTL/exit_code"; '
            'exit "$1"; }')


STOP_TRAP = "trap 'echo \"[clusterddp] stop signal received\" >&2' TERM INT HUP"


def setup_failed(exit_code: int = 98) -> Callable[[str], str]:
    """A job's ``on_fail`` for :func:`preamble`: say which setup line failed, record ``exit_code``."""
    return lambda line: f"echo {q('[clusterddp] setup failed: ' + line)} >&2; cddp_exit {exit_code}"


IFACE_FN = r"""cddp_iface() {  # the interface on this node that routes to $1 (the master)
  local a; a=$(getent ahostsv4 "$1" 2>/dev/null | awk 'NR==1{print $1}'); a=${a:-$1}
  ip -o -4 addr show to "$a" 2>/dev/null | awk 'NR==1{print $2; f=1} END{exit !f}' && return 0
  ip -o route get "$a" 2>/dev/null | sed -n 's/.* dev \([^ ]*\).*/\1/p' | head -n 1
}"""

_IFACE_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def iface_lines(env_keys: set[str], master_addr: str | None, local_addr: bool = False) -> list[str]:
    """Export NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME (those ``env`` does not set) as the
    interface that routes to the master, probed on the node; ``local_addr``: also its address in
    ``LOCAL_ADDR``. ``master_addr`` None: the master is ``$MASTER_ADDR``, found on the node (Slurm).
    The one interface choice, shared by launch.sh, node.sh and ``check --collective``."""
    if not (local_addr or not set(_IFACE_VARS) <= env_keys):
        return []
    word = '"$MASTER_ADDR"' if master_addr is None else q(master_addr)
    lines = [IFACE_FN, f"IFACE=$(cddp_iface {word})", 'if [ -n "$IFACE" ]; then']
    lines += [f"  export {k}=\"$IFACE\"" for k in _IFACE_VARS if k not in env_keys]
    fix = "; set NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME in the inventory env"
    if master_addr is None:
        warn = f'  echo "[clusterddp] warning: no interface routes to $MASTER_ADDR{fix}" >&2'
    else:
        warn = f"  echo {q(f'[clusterddp] warning: no interface routes to {master_addr}{fix}')} >&2"
    if local_addr:
        lines.append("  LOCAL_ADDR=$(ip -o -4 addr show dev \"$IFACE\" "
                     "| awk 'NR==1{split($4, a, \"/\"); print a[1]}')")
    return lines + ["else", warn, "fi"]


# Which clusterddp.train a job's script would import, asked of the job's python in the run folder
# (the node program ``probe`` asks the same for `check`).
FIND_TRAIN = """import importlib.util as u
try:
    p = u.find_spec("clusterddp")
    if p is None or p.origin in (None, "namespace"):  # a bare folder named clusterddp is no install
        print("none")
    else:
        s = u.find_spec("clusterddp.train")
        print(s.origin if s else "it has no clusterddp.train (%s)" % p.origin)
except Exception as e:
    print("%s: %s" % (type(e).__name__, e))"""


def ship_train_lines(python: str, run_dir: str) -> list[str]:
    """Put the shipped clusterddp.train (``<run_dir>/.clusterddp/lib``) on PYTHONPATH only when the
    job's python has no clusterddp: an installed one (or one on the job's own PYTHONPATH) always
    wins, and the job's log says so when it differs from the copy shipped."""
    lib = qpath(posixpath.join(run_dir, SHIPPED_LIB))
    differs = ("[clusterddp] note: this node's own clusterddp.train ($cddp_train) is used; it differs from the "
               "launcher's copy shipped with the run, which never shadows an installed clusterddp")
    other = "[clusterddp] note: clusterddp.train is not shipped to this node, whose python has a clusterddp: "
    return [
        f"CDDP_LIB={lib}",
        f"cddp_train=$({q(python)} -c {q(FIND_TRAIN)} 2>&1 | tail -n 1)",
        'case "$cddp_train" in',
        '  none) export PYTHONPATH="$CDDP_LIB${PYTHONPATH:+:$PYTHONPATH}" ;;',
        f'  /*) cmp -s "$cddp_train" "$CDDP_LIB/clusterddp/train.py" || echo "{differs}" >&2 ;;',
        f'  *) echo {q(other)}"$cddp_train" >&2 ;;',
        "esac",
    ]


# What runs torchrun on a node: its module, run as `python -m` runs it (as __main__, with its argv; an
# error ends it as it would end that), with two things around it (bench/RESULTS-up-ssh.md, sixth round):
# - With STORE_WAIT=HOST:PORT (a node that does not serve the run's rendezvous store), it waits, once
#   torchrun's imports are done, until that port accepts a connection (10 ms apart, 30 s at most; then
#   torchrun goes on as it would have). torchrun's client, refused because the master's torchrun was
#   still importing torch, tried again only 0.3-0.75 s later (a random back-off): about every other
#   2-node start. The variable is taken out of the environment before torchrun starts the workers.
# - Once torchrun returned, gc.freeze(): the interpreter's last collection at exit walks every object
#   torch made; it was 0.13 s of the agent's 0.2 s exit, on every node, after the outcome was known.
#   The rest of the exit is Python's own (threads joined, atexit run).
# The module's name stays a word of its own, as with -m: node programs find the agent by it in
# /proc/PID/cmdline (node/watch.py, node/stacks.py).
STORE_WAIT = "CLUSTERDDP_STORE"
TORCHRUN_VAR = "cddp_torchrun"
# What a node's torchrun says of its ranks (clusterddp.failure.FINISHED_LINE, RESTART_LINE): a node that
# finished while another restarts is a run whose ranks resumed from different points
RESTART_MARK = "[clusterddp] torchrun restarts this node's ranks"
FINISHED_MARK = "[clusterddp] torchrun: this node's ranks finished; it waits for the other nodes (its exit barrier)"
FINISHED_AFTER_S = 3  # said only when the wait lasts that long (as it does not in a run whose nodes end together)
TORCHRUN = f"""import gc, os, runpy, sys
w = os.environ.pop("{STORE_WAIT}", "")
if w:
    try:
        import socket, time
        __import__(sys.argv[1])  # the imports torchrun does before it connects; then out of sys.modules,
        sys.modules.pop(sys.argv[1])  # or runpy warns that it runs a module already imported
        host, port = w.rsplit(":", 1)
        end = time.monotonic() + 30
        while time.monotonic() < end:
            try:
                socket.create_connection((host.strip("[]"), int(port)), 1).close()
                break
            except OSError:
                time.sleep(0.01)
    except Exception:
        pass
try:  # torch elastic's agent says at INFO (not shown) that it restarts its ranks, or that they finished
    import logging, threading
    import torch.distributed.elastic.agent.server.api as a
    g = logging.getLogger(a.__name__)
    shown = g.getEffectiveLevel()
    def said(r):
        m = r.getMessage()
        if "will restart worker group" in m:
            os.write(2, b"{RESTART_MARK}\\n")
        elif "Local worker group finished" in m and "SUCCEEDED" in m:  # said if its wait lasts
            t = threading.Timer({FINISHED_AFTER_S}, os.write, (2, b"{FINISHED_MARK}\\n"))
            t.daemon = True
            t.start()
        return r.levelno >= shown
    g.addFilter(said)
    g.setLevel(min(shown, logging.INFO))
except Exception:
    pass
runpy.run_module(sys.argv.pop(1), run_name="__main__", alter_sys=True)
gc.freeze()"""


def torchrun_lines() -> list[str]:
    """The lines that define ``$cddp_torchrun``, the source that ``python -c`` runs torchrun with
    (:data:`TORCHRUN`; :func:`torchrun_start`)."""
    return ["# torchrun as `python -m` runs it, with a wait for the rendezvous store and a quicker exit "
            "(clusterddp/nodescript.py)", f"{TORCHRUN_VAR}={q(TORCHRUN)}"]


STACKS = "stacks"  # in a node's control folder: the stack hook, and each python's dump file (`clusterddp stacks`)


def stack_hook_lines() -> list[str]:
    """Every python of the job hooked for ``clusterddp stacks``: the node program ``stackhook`` written
    as ``$CTL/stacks/hook/sitecustomize.py`` and that folder put first on PYTHONPATH. A node where it
    cannot be written runs the job anyway (``stacks`` then says the ranks are not hooked)."""
    hook = f'"$CTL/{STACKS}/hook"'
    return [
        f"(umask 077 && mkdir -p {hook} && cat > {hook}/sitecustomize.py) <<'CDDP_STACKHOOK' 2>/dev/null || true",
        node_source("stackhook").rstrip("\n"),
        "CDDP_STACKHOOK",
        f'export CLUSTERDDP_STACKS="$CTL/{STACKS}" PYTHONPATH={hook}"${{PYTHONPATH:+:$PYTHONPATH}}"',
    ]


WATCH = "watch"  # in a node's control folder: the stall watchdog's programs (node programs watch and stacks)
HANG = "hang.json"  # in a node's control folder: written by the watchdog when it found the run stalled


def watch_lines(python: str, args: dict) -> tuple[list[str], list[str]]:
    """The stall watchdog (``up --stall-timeout``): the lines that start the node program ``watch``
    beside the job, in the background (``args``: its JSON argument), and the lines after the job that
    give its exit code (``cddp_rc``) to ``cddp_exit``: 1 when the watchdog ended it (hang.json), after
    waiting for the watchdog to finish; otherwise the job's, the watchdog ended. The watchdog runs the
    node program ``stacks`` (written beside it) for its ranks' stacks. Its stderr (torch's warnings
    about the store) goes to ``$CTL/watch.log``, its own lines to the job's log."""
    w = f'"$CTL/{WATCH}"'
    start = [
        f"(umask 077 && mkdir -p {w} && : >> \"$CTL/watch.log\" && cat > {w}/watch.py) <<'CDDP_WATCH'",
        node_source("watch").rstrip("\n"),
        "CDDP_WATCH",
        f"(umask 077 && cat > {w}/stacks.py) <<'CDDP_STACKS'",
        node_source("stacks").rstrip("\n"),
        "CDDP_STACKS",
        f'{q(python)} {w}/watch.py "$CTL" {q(json.dumps(args, sort_keys=True))} 2>>"$CTL/watch.log" </dev/null &',
        "CDDP_WATCH_PID=$!",
    ]
    end = [
        "cddp_rc=$?",
        f'if [ -e "$CTL/{HANG}" ]; then  # the watchdog found the run stalled and ends the job: exit 1 once it has',
        '  wait "$CDDP_WATCH_PID"; cddp_rc=1',
        'else kill "$CDDP_WATCH_PID" 2>/dev/null; fi',
    ]
    return start, end


SAMPLER = "sampler"  # in a node's control folder: the metrics sampler's programs (node programs sampler and watch)
SAMPLES = "metrics.jsonl"  # in a node's control folder: the sampler's samples (clusterddp.metrics.samples reads them)


def sampler_lines(python: str, args: dict) -> list[str]:
    """The metrics sampler (on unless ``up --metrics-interval 0``): the lines that start the node program
    ``sampler`` beside the job, in the background (``args``: its JSON argument; the node program ``watch``
    written beside it, whose line reader it uses), and end it when launch.sh exits (a trap on EXIT: its last
    sample taken, the exit code unchanged). Its stderr goes to ``$CTL/sampler.log``. It runs without
    site-packages (``-S``) unless it must reach the run's store (a run-wide idle policy: torch's client)."""
    d = f'"$CTL/{SAMPLER}"'
    site = "" if args.get("store") else "-S "  # the run's store (a run-wide idle policy): torch, from site-packages
    return [
        f"(umask 077 && mkdir -p {d} && : >> \"$CTL/sampler.log\" && cat > {d}/sampler.py) <<'CDDP_SAMPLER'",
        node_source("sampler").rstrip("\n"),
        "CDDP_SAMPLER",
        f"(umask 077 && cat > {d}/watch.py) <<'CDDP_WATCH'",
        node_source("watch").rstrip("\n"),
        "CDDP_WATCH",
        f'{{ exec {q(python)} {site}{d}/sampler.py "$CTL" {q(json.dumps(args, sort_keys=True))}; }} '
        '2>>"$CTL/sampler.log" </dev/null &',
        "CDDP_SAMPLER_PID=$!",
        "trap 'kill \"$CDDP_SAMPLER_PID\" 2>/dev/null' EXIT  # the sampler ends with the job",
    ]


WHERE = "where"  # in a node's control folder: the rank sampler's programs (node programs where, stacks, watch)
WHERE_SAMPLES = "where.jsonl"  # in a node's control folder: where each rank was, by sample (clusterddp.stragglers)
WHERE_ARGS = {"interval": 2.0, "most": 1 << 20}  # the rank sampler's: seconds between samples, bytes kept


def where_lines(python: str, args: dict) -> tuple[list[str], list[str]]:
    """The rank sampler (``clusterddp.stragglers``): the lines that start the node program ``where``
    beside the job, in the background (``args``: its JSON argument; the node programs ``stacks`` and ``watch``
    written beside it), and the line right after the job that ends it and leaves ``$?`` the job's. A node where it
    cannot be written runs the job anyway; its stderr goes to ``$CTL/where.log``."""
    d = f'"$CTL/{WHERE}"'
    start = [
        f"(umask 077 && mkdir -p {d} && : >> \"$CTL/where.log\" && cat > {d}/where.py) <<'CDDP_WHERE' "
        "2>/dev/null || true",
        node_source("where").rstrip("\n"),
        "CDDP_WHERE",
        f"(umask 077 && cat > {d}/stacks.py) <<'CDDP_WHERE_STACKS' 2>/dev/null || true",
        node_source("stacks").rstrip("\n"),
        "CDDP_WHERE_STACKS",
        f"(umask 077 && cat > {d}/watch.py) <<'CDDP_WHERE_WATCH' 2>/dev/null || true",
        node_source("watch").rstrip("\n"),
        "CDDP_WHERE_WATCH",
        f'{q(python)} -S {d}/where.py "$CTL" {q(json.dumps(args, sort_keys=True))} 2>>"$CTL/where.log" </dev/null &',
        "CDDP_WHERE_PID=$!",
    ]
    end = ['cddp_job_rc=$?; kill "$CDDP_WHERE_PID" 2>/dev/null; (exit "$cddp_job_rc")  # the rank sampler ends']
    return start, end


# ---- finding a job's processes ----

# ``cddp_marked WORD``: the pids of every process whose environment holds the line WORD
# (``CLUSTERDDP_JOB=<run>/<host>``); status, teardown and prune all find a job's processes by it.
MARKED_FN = 'cddp_marked() { grep -lzxF "$1" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3; }'


def marker_word(marker: str) -> str:
    """The ``CLUSTERDDP_JOB=marker`` line of a job's environment, as one quoted word."""
    return q(f"{MARKER}={marker}")


# ---- the torchrun line, for every backend (moved from plan.py) ----

class _Probed(str):
    """An argv word of clusterddp's own whose value launch.sh finds on the node: rendered in double
    quotes so it expands. Only these words expand; every user word (a script argument that reads
    ``$NPROC`` included) is an ordinary ``str`` and is quoted to stay literal."""


NPROC, LOCAL_ADDR = _Probed("$NPROC"), _Probed("$LOCAL_ADDR")
TORCHRUN_SOURCE = _Probed(f"${TORCHRUN_VAR}")  # nodescript.torchrun_lines
# torchrun's --log-dir: where each worker's TORCHELASTIC_ERROR_FILE goes (clusterddp.node.diagnose reads them).
ERRORS_DIR = _Probed("$CTL/errors")


def probes(argv: Iterable[str], word: _Probed) -> bool:
    return any(isinstance(a, _Probed) and a == word for a in argv)


def worker_command(python: str, script: str, args: Iterable[str], local_rank_arg: str | None = None
                   ) -> tuple[str, ...]:
    """The command line of one worker process: ``python -u SCRIPT ARGS``, as torchrun runs it; with
    ``local_rank_arg`` (``--local_rank`` or ``--local-rank``) the node program ``worker`` first, which
    puts ``--local_rank=<LOCAL_RANK>`` (``SLURM_LOCALID`` under srun) before ARGS and execs that.

    The words are argv, not shell text: a launcher that writes them into a script quotes each one
    with :func:`q`. A Slurm backend that starts workers with srun, without torchrun, runs this."""
    if local_rank_arg is None:
        return (python, "-u", script, *args)
    # -c and its source as one word: torchrun names a failed job by the first word after the python
    # that does not start with "-", which is then the script, not 40 lines of source.
    return (python, "-S", "-c" + node_source("worker"), local_rank_arg, script, *args)


def torchrun_start(python: str) -> tuple[str, ...]:
    """The start of a node's torchrun command line, before its options (SSH and Slurm runs alike):
    torchrun's module run by the script that :func:`~clusterddp.nodescript.torchrun_lines` puts in
    launch.sh (node.sh) first. A node that does not serve the run's rendezvous store runs it after
    :func:`store_wait`."""
    return (python, "-c", TORCHRUN_SOURCE, "torch.distributed.run")


def store_wait(where: str) -> str:
    """The assignment that goes before the torchrun command line of a node that does not serve the
    run's rendezvous store at ``where`` (``HOST:PORT``, a shell word, already quoted)."""
    return f"{STORE_WAIT}={where}"


def shell_word(word: str) -> str:
    """An argv word as launch.sh (node.sh) writes it: clusterddp's own expanded words (:class:`_Probed`)
    in double quotes, every other word quoted to stay literal."""
    return f'"{word}"' if isinstance(word, _Probed) else q(word)


def torchrun_entry(python: str, script: str, args: Iterable[str], local_rank_arg: str | None = None
                   ) -> tuple[str, ...]:
    """The end of a torchrun command line, after its options: the script and its arguments, or, with
    ``local_rank_arg``, ``--no-python`` and :func:`worker_command`, which torchrun then runs as is."""
    if local_rank_arg is None:
        return (script, *args)
    return ("--no-python", *worker_command(python, script, args, local_rank_arg))
