"""The SSH plan: inventory + run spec -> one :class:`NodeLaunch` per host, and every command an
SSH run (``up`` over SSH, and ``up local``) sends to its nodes: make the run folder, upload and
unpack, start (or tell the lease holder to start), follow, status, teardown, collect, the
postmortem's looks, node 0's notifier, ``--dry-run``'s text.

What is not the SSH plan lives elsewhere: the run spec every backend reads in
:mod:`clusterddp.runspec`; quoting (the one place), the node-script pieces and the torchrun line
in :mod:`clusterddp.nodescript`; each feature's own node command in its module (``check``'s probe,
``exec``, ``prune``, ``top``, the leases, ``check --collective``, ``check --diff``, the mirror's
seed). Nothing in this module touches the network, the clock or the filesystem (beyond reading
the node programs' source from this package): the run id and facts are passed in, so
``--dry-run`` shows exactly what a real run executes and tests compare it to golden files.

On each node a run lives in ``<workdir>/runs/<run_id>/`` (the script's folder is
unpacked there, once, even when several hosts' workdirs are one shared folder) with a control
folder ``.clusterddp/<host>/`` holding ``launch.sh``,
``node.log`` (all output), ``pid`` and, once the job ends, ``exit_code``: the folders 0700 and
its files 0600 whatever the node's umask (launch.sh holds the env values), while the job itself
keeps the node's umask. Env values never appear on a command line, where every user of the
node could read them in ``/proc/PID/cmdline``: launch.sh is uploaded over stdin. The job
runs in its own session, detached from SSH, and every process of it carries the
environment marker ``CLUSTERDDP_JOB=<run_id>/<host>``, which is how teardown finds
exactly this node's processes (torchrun puts its workers in sessions of their own,
so a process group alone would miss them).
"""
from __future__ import annotations

import json
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from . import flight
from .inventory import Host, Inventory, RunNode
from .node import notify as node_notify
from .node import reply as node_reply
from .nodescript import (
    CONTROL,
    ERRORS_DIR,
    LOCAL_ADDR,
    MARKED_FN,
    MARKER,
    NPROC,
    STOP_TRAP,
    WHERE_ARGS,
    exit_function,
    iface_lines,
    marker_word,
    preamble,
    probes,
    python_command,
    q,
    qpath,
    sampler_lines,
    setup_failed,
    shell_word,
    ship_train_lines,
    stack_hook_lines,
    store_wait,
    torchrun_entry,
    torchrun_lines,
    torchrun_start,
    watch_lines,
    where_lines,
)
from .runspec import ResolvedSpec, RunSpec, sampler_args, watch_args
from .runspec import nproc as runspec_nproc

DEFAULT_GRACE = 10.0


H = TypeVar("H", bound=RunNode, covariant=True)  # a frozen value: a NodeLaunch[Host] is a NodeLaunch[RunNode]


@dataclass(frozen=True)
class NodeLaunch(Generic[H]):
    """Everything one node runs, as data. ``host``: the inventory's Host (an SSH or local run), or the
    Node a backend reaches through the run (a Slurm node; such a node is reached through
    :mod:`clusterddp.backends`' ``reach`` only, never by a connection of its own)."""

    host: H                       # NodeLaunch[Host]: an SSH run's; NodeLaunch[Node]: a Slurm node's
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
    spec: ResolvedSpec
    nodes: tuple[NodeLaunch[Host], ...]
    master_addr: str
    master_port: int
    collect: tuple[str, ...]
    upload: bool                  # copy the script's folder to each node (not in local mode)
    local: bool = field(default=False)
    leased: bool = False          # each node's slots are leased: its lease holder starts the job (go_command)
    train_lookup: bool = True     # launch.sh looks for the node's clusterddp.train (ship_train_lines)
    attempt: int = 1              # the run's attempt this plan starts (backends/ssh/attempts.py)

    @property
    def nnodes(self) -> int:
        return len(self.nodes)


def _helper(node: NodeLaunch, program: str, *args: str) -> str:
    """A node program run by a job's launcher after the host's setup lines (quietly, failures
    ignored), without the job's env: a PYTHONPATH there could shadow the modules it imports."""
    lines = preamble(node.host, (), stdout_to=">/dev/null 2>&1", on_fail=lambda line: "true")
    return "\n".join([*lines, python_command(node.host.python, program, args)])


# ---- the plan ----


def static_local(spec: RunSpec) -> bool:
    """An ``up local`` run meets on a static rendezvous at a port chosen before it starts
    (jobs.local_port); with restarts it keeps ``--standalone`` (see :func:`build_plan`)."""
    return spec.max_restarts == 0


def build_plan(inventory: Inventory, spec: ResolvedSpec, run_id: str, *, local_run_dir: str | None = None,
               local_control_dir: str | None = None,
               grants: Mapping[str, tuple[int, ...]] | None = None, train_lookup: bool = True,
               attempt: int = 1) -> LaunchPlan:
    """Plan a run. Local mode (``up local``: run in place, one node on 127.0.0.1) is chosen by
    passing the absolute launch directory and the control folder. ``grants``: the slots each node's
    lease holds (:mod:`clusterddp.leases`), one process per slot, ``CUDA_VISIBLE_DEVICES`` set to them.
    ``train_lookup`` False: no file of the script's folder names clusterddp, so launch.sh does not look
    for the node's clusterddp.train (a python start before torchrun), unless the job's env sets PYTHONPATH.
    ``attempt``: the run's attempt (2, 3, ... after a failed one, on other hosts): its c10d rendezvous
    has an id of its own, so a lost host whose old torchrun comes back never joins the new attempt's."""
    local = local_run_dir is not None
    rdzv_id = run_id if attempt == 1 else f"{run_id}.attempt-{attempt}"
    master_port = spec.master_port
    assert master_port is not None, "a resolved spec has its master port"
    nodes = []
    for rank, host in enumerate(inventory.ranked()):  # the master is node 0 wherever it is listed
        if local:
            assert local_run_dir and local_control_dir, "local mode needs a run and a control folder"
            run_dir, control_dir = local_run_dir, local_control_dir
            script = spec.script
        else:
            run_dir = posixpath.join(host.workdir, "runs", run_id)
            # Per host, so hosts whose workdirs are one shared folder (an NFS home) never share a
            # pid, log or exit code; the run folder itself, with the code, may well be shared.
            control_dir = posixpath.join(run_dir, CONTROL, host.name)
            script = posixpath.basename(spec.script)
        nproc: int | str = runspec_nproc(spec, host)
        # With restarts, torchrun's shared rendezvous store hands restarted workers the previous
        # attempt's addresses and gloo's connectFullMesh is refused (pytorch/pytorch#135712):
        # workers get a store of their own instead. The inventory or -e may still set it.
        restart_env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"} if spec.max_restarts > 0 else {}
        lease_env, order_env = {}, {}
        if grants is not None:
            nproc = len(grants[host.name])
            lease_env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, grants[host.name]))}
            # Slots are numbered as nvidia-smi lists GPUs (by PCI bus); CUDA's own default order is
            # fastest first, which on a mixed machine would put a rank on another run's GPU.
            order_env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        node_env = tuple({**restart_env, **order_env, **dict(host.env), **dict(spec.env), **lease_env}.items())
        torchrun = list(torchrun_start(host.python))
        if local and static_local(spec):
            # A static rendezvous on this machine: 3 ms, where --standalone's c10d one takes 0.2-0.4 s
            # (a random 0-0.3 s sleep before its first round, each step recorded through
            # inspect.stack()). The port is free (jobs.prepare); restarts need c10d's rounds (below).
            torchrun += ["--nnodes", "1", "--node-rank", "0", "--master-addr", inventory.master.addr,
                         "--master-port", str(master_port)]
        elif local:
            torchrun += ["--standalone", "--nnodes", "1"]
        elif spec.max_restarts > 0:
            # Static rendezvous does not restart nodes together: a restarted node would meet the
            # others' previous attempt. c10d rendezvous runs each restart as a new round on every
            # node; torch then assigns node ranks itself. is_host and --local-addr spare torch from
            # resolving the node's own hostname, which need not resolve.
            is_host = int(host.name == inventory.master.host)
            torchrun += ["--nnodes", str(len(inventory.hosts)), "--rdzv-backend", "c10d",
                         "--rdzv-endpoint", f"{inventory.master.addr}:{master_port}", "--rdzv-id", rdzv_id,
                         "--rdzv-conf", f"is_host={is_host}", "--local-addr", LOCAL_ADDR]
        else:
            torchrun += ["--nnodes", str(len(inventory.hosts)), "--node-rank", str(rank),
                         "--master-addr", inventory.master.addr, "--master-port", str(master_port)]
        torchrun += ["--nproc-per-node", NPROC if nproc == "auto" else str(nproc),
                     "--max-restarts", str(spec.max_restarts), "--log-dir", ERRORS_DIR,
                     *torchrun_entry(host.python, script, spec.script_args, spec.local_rank_arg)]
        marker = f"{run_id}/{host.name}"
        node = NodeLaunch(host, rank, nproc, run_dir, control_dir, marker, node_env, tuple(torchrun), "")
        watch = watch_args(spec, len(inventory.hosts), inventory.master.addr, master_port)
        nodes.append(_with_script(node, run_id, len(inventory.hosts), inventory.master.addr, master_port, local,
                                  watch, train_lookup,
                                  sampler_args(spec, len(inventory.hosts), inventory.master.addr, master_port)))
    return LaunchPlan(run_id, inventory, spec, tuple(nodes), inventory.master.addr, master_port,
                      spec.collect, upload=not local, local=local, leased=grants is not None,
                      train_lookup=train_lookup, attempt=attempt)


# ---- launch.sh ----

_NPROC_AUTO = ("NPROC=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); "
               "[ \"${NPROC:-0}\" -gt 0 ] 2>/dev/null || NPROC=1")


def _with_script(node: NodeLaunch, run_id: str, nnodes: int, master_addr: str, master_port: int, local: bool,
                 watch: dict | None = None, train_lookup: bool = True, sampler: dict | None = None) -> NodeLaunch:
    h = node.host
    ctl = node.control_dir
    lines = [
        "#!/usr/bin/env bash",
        f"# clusterddp run {run_id}: node {node.node_rank} of {nnodes} ({h.name})",
        "# A stop signal must not kill this shell before it records the exit code;",
        "# a trap (unlike ignoring the signal) is reset for the children, so torchrun still gets it.",
        STOP_TRAP,
        f"CTL={qpath(ctl)}",
        "# exit_code is written 0600 whatever umask the job runs with (the node's own, or a setup line's).",
        exit_function(),
        f"cd {qpath(node.run_dir)} || cddp_exit 97",
        f"export CLUSTERDDP_RUN_ID={q(run_id)} CLUSTERDDP_HOST={q(h.name)} "
        f"CLUSTERDDP_NODE_RANK={node.node_rank}",
    ]
    lines += preamble(h, node.env, stdout_to="", on_fail=setup_failed())
    lines += flight.env_lines()  # after the user's env, whose values win
    if not local:
        lines += iface_lines({k for k, _ in node.env}, master_addr, probes(node.argv, LOCAL_ADDR))
    if not local and (train_lookup or any(k == "PYTHONPATH" for k, _ in node.env)):
        lines += ship_train_lines(h.python, node.run_dir)
    elif not local:
        lines.append("# no file of the script's folder names clusterddp: its clusterddp.train is not looked for")
    lines += stack_hook_lines()
    if node.nproc == "auto":
        lines.append(_NPROC_AUTO)
    argv = " ".join(map(shell_word, node.argv))
    if not local and node.node_rank > 0:  # the master (node 0) serves the rendezvous store: the others wait for it
        argv = f"{store_wait(q(f'{master_addr}:{master_port}'))} {argv}"
    watch_start, watch_end = watch_lines(h.python, watch) if watch is not None else ([], [])
    where_start, where_end = where_lines(h.python, WHERE_ARGS)  # the rank sampler (clusterddp.stragglers)
    sampler_start = sampler_lines(h.python, sampler) if sampler is not None else []
    lines += torchrun_lines()
    lines += [
        f"echo \"[clusterddp] node {node.node_rank}/{nnodes} on $(hostname)"
        + (" iface=${IFACE:-?}" if not local else "") + "\"",
        *watch_start,
        *sampler_start,
        *where_start,
        argv,
        *where_end,
        *watch_end,
        "cddp_exit " + ("$cddp_rc" if watch is not None else "$?"),
        "",
    ]
    return NodeLaunch(**{**node.__dict__, "launch_script": "\n".join(lines)})


# ---- commands sent to a node (all through `bash -c` / the login shell) ----

def prepare_command(node: NodeLaunch) -> str:
    """Create the run and control folders; refuse to reuse a run folder that already has a job.

    The control folder is made 0700 (it holds launch.sh, with the env values); the run folder,
    where the script runs and writes, keeps the node's usual modes."""
    ctl = qpath(node.control_dir)
    run_ctl = _run_control(node)
    private = f"{qpath(run_ctl)} {ctl}" if run_ctl else ctl
    return (f"mkdir -p {ctl} && chmod 700 {private} && cd {ctl} && "
            f"if [ -e pid ]; then echo 'run folder already holds a job' >&2; exit 3; fi && pwd")


def retire_command(node: NodeLaunch, attempt: int) -> str:
    """Before attempt ``attempt`` of a run on a host that ran the attempt before: move that attempt's
    control folder aside, to ``<host>@attempt-<attempt - 1>`` (``@`` is in no host name), so the new
    attempt starts in an empty one (the old pid, exit code, lease go file and log are the old job's).
    The run folder, with the code and the job's checkpoints, stays as it is."""
    assert attempt >= 2, attempt
    ctl, old = qpath(node.control_dir), qpath(f"{node.control_dir}@attempt-{attempt - 1}")
    return f"if [ -d {ctl} ]; then rm -rf {old} && mv {ctl} {old}; fi"


def _run_control(node: NodeLaunch) -> str | None:
    """The run's own control folder, ``<run folder>/.clusterddp``, which holds each host's control
    folder (and the unpack state, and the shipped clusterddp.train); None when the node's control
    folder is elsewhere (``up local``)."""
    run_ctl = posixpath.join(node.run_dir, CONTROL)
    return run_ctl if posixpath.dirname(node.control_dir) == run_ctl else None


def upload_command(path: str, size: int | None = None) -> str:
    """Write standard input to ``path``, mode 0600 (the source tarball and launch.sh, in the
    control folder). With ``size``: its first ``size`` bytes and no more, what follows them being the
    next step's (``head -c`` reads no further on a pipe); fails when fewer came."""
    p = qpath(path)
    if size is None:
        return f"umask 077 && cat > {p} && chmod 600 {p}"
    return f'umask 077 && head -c {int(size)} > {p} && chmod 600 {p} && [ "$(wc -c < {p})" -eq {int(size)} ]'


UNPACK_WAIT_S = 540  # below the launcher's 600 s for the command, so the node's own message arrives


def unpack_command(node: NodeLaunch) -> str:
    """Unpack the script's folder into the run folder, once per run folder.

    Hosts whose workdir is one shared folder (an NFS home) share the run folder; each has uploaded
    the tarball into its own control folder. The first to create ``.clusterddp/unpack`` (mkdir is
    atomic, on NFS too) unpacks, then writes ``done`` there (``failed`` if tar failed); the others
    wait for either, up to UNPACK_WAIT_S. Each host removes only its own tarball, never a file
    another host may still need. A file already there is kept (GNU tar's ``--skip-old-files``, where
    tar has it): in a new run folder, only a checkpoint the mirror put there before a new attempt
    (:func:`clusterddp.mirror.seed_all`), which a stale copy in the script's folder must not replace."""
    tar = qpath(node.control_dir + "/source.tar.gz")
    u = q(CONTROL + "/unpack")
    by = f"$(cat {u}/by 2>/dev/null)"
    return (f"cd {qpath(node.run_dir)} || exit 3; "
            f"if mkdir {u} 2>/dev/null; then echo {q(node.host.name)} > {u}/by; "
            f"if tar -xzf {tar} $(tar --help 2>/dev/null | grep -q -- --skip-old-files && echo --skip-old-files); "
            f"then rm -f {tar}; : > {u}/done; else : > {u}/failed; exit 1; fi; "
            f"elif [ ! -d {u} ]; then echo \"cannot create $PWD/{CONTROL}/unpack\" >&2; exit 1; "
            f"else rm -f {tar}; i=0; while [ ! -e {u}/done ]; do "
            f"if [ -e {u}/failed ]; then echo \"{by} failed to unpack the script folder into this shared run "
            "folder\" >&2; exit 1; fi; "
            f"i=$((i+1)); if [ $i -gt {UNPACK_WAIT_S * 5} ]; then echo \"{by} has not finished unpacking the script "
            f"folder into this shared run folder after {UNPACK_WAIT_S}s\" >&2; exit 1; fi; sleep 0.2; done; fi")


def start_command(node: NodeLaunch) -> str:
    """Start launch.sh in a new session, detached from this SSH connection; print its pid.

    ``setsid`` is not a process group leader here, so it execs in place and ``$!`` is the
    job's shell. Its output goes to node.log, so the job never depends on the SSH channel.
    node.log and pid are made 0600 in subshells: the job keeps the node's umask for its own files.
    torchrun's ``--log-dir`` (``errors/``: per-rank error files, which can quote secrets) is made 0700
    here too: torchrun would create it with the job's umask.
    """
    return (f"cd {qpath(node.control_dir)} || exit 3; "
            "(umask 077 && : > node.log && chmod 600 node.log && mkdir -p errors && chmod 700 errors) || exit 3; "
            f"{MARKER}={q(node.marker)} setsid bash launch.sh "
            "> node.log 2>&1 < /dev/null & (umask 077 && echo $! > pid); cat pid")


# A node's start is one command (:func:`start_node_command`), whose steps are named here for the error
# when one fails: it exits STEP_EXIT + the index of its first step that failed.
STEP_EXIT = 64


def _steps(commands: Iterable[str]) -> str:
    """``commands`` one after another, each in a subshell (its ``cd`` and ``exit`` stay its own); the
    first that fails ends the whole with exit STEP_EXIT + its index."""
    return "; ".join(f"( {c} ) || exit {STEP_EXIT + i}" for i, c in enumerate(commands))


def failed_step(steps: Sequence[str], exit_code: int) -> str:
    """Which of ``steps`` (:func:`start_node_command`'s) a command that exited ``exit_code`` failed at."""
    i = exit_code - STEP_EXIT
    return steps[i] if 0 <= i < len(steps) else steps[0]


def start_node_command(node: NodeLaunch, upload: bool, leased: bool, script_size: int) -> tuple[str, tuple[str, ...]]:
    """A node's start, in one command (one round trip and one login shell; it was two, and five
    before that: on a loaded node each cost 0.05-0.2 s), and the names of its steps (:func:`failed_step`).

    Standard input is launch.sh (``script_size`` bytes), then, with ``upload``, the script folder's
    tarball. The run folder made (:func:`prepare_command`), launch.sh and the tarball written
    (:func:`upload_command`), the tarball unpacked (:func:`unpack_command`), then the job started:
    by the node's lease holder when ``leased`` (:func:`go_command`, so that it holds the slots'
    locks), else :func:`start_command`; prints the job's pid."""
    steps = [(prepare_command(node), "cannot create the run folder"),
             (upload_command(node.control_dir + "/launch.sh", script_size), "cannot write launch.sh")]
    if upload:
        steps += [(upload_command(node.control_dir + "/source.tar.gz"), "cannot upload the script folder"),
                  (unpack_command(node), "cannot unpack the script folder")]
    steps.append((go_command(node) if leased else start_command(node), "cannot start the job"))
    return _steps(c for c, _ in steps), tuple(why for _, why in steps)


def follow_command(node: NodeLaunch, from_line: int = 1, poll: float = 0.1) -> str:
    """Stream node.log from ``from_line`` until the job has ended and its log is drained
    (the node program ``clusterddp/node/follow.py``)."""
    return _helper(node, "follow", qpath(node.control_dir), str(int(from_line)), str(poll))


def follow_status_command(node: NodeLaunch, from_line: int = 1) -> str:
    """:func:`follow_command`, then :func:`status_command` with its answer on standard error (standard
    output is the log): how the job ended comes right after its last output, a round trip and a
    login shell sooner than a status command sent once the log has ended."""
    return f"{follow_command(node, from_line)}\n{{\n{status_command(node)}\n}} 1>&2"


def status_command(node: NodeLaunch) -> str:
    """Print one line, marked (:data:`node_reply.STATUS_MARK`: a login banner may come first):
    ``running``, ``exit N T``, ``lost`` (no process, no exit code) or ``missing``. ``T``: when the job
    ended, by the node's clock (the exit code file's mtime, in epoch seconds: ``cddp_exit`` writes it as
    the job ends), so a run looked at long after it ended records its own end, not the look's."""
    m = node_reply.STATUS_MARK
    return (f"{MARKED_FN}; cd {qpath(node.control_dir)} 2>/dev/null || {{ echo '{m}missing'; exit 0; }}; "
            f"if [ -s exit_code ]; then echo \"{m}exit $(cat exit_code) $(stat -c %Y exit_code 2>/dev/null)\"; "
            f"elif [ -n \"$(cddp_marked {marker_word(node.marker)})\" ]; "
            f"then echo '{m}running'; else echo '{m}lost'; fi")


def teardown_command(node: NodeLaunch, grace: float = DEFAULT_GRACE, mark_stop: bool = False) -> str:
    """End every process of this node's job: SIGTERM, then SIGKILL after ``grace`` seconds.

    Processes are found by their environment marker, so nothing of another run is touched.
    Prints ``clean`` (nothing ran), ``terminated``, ``killed`` or ``survivors <pids>``.
    ``mark_stop`` (`clusterddp stop`): first leave the stop mark in the control folder, so that node 0's
    notifier (:func:`notify_arm_command`) tells the run's end as ``stopped``.
    """
    if not mark_stop:
        return kill_marked_command(node.marker, grace)
    mark = qpath(posixpath.join(node.control_dir, node_notify.STOP_MARK))
    return f"(umask 077 && : > {mark}) 2>/dev/null; " + kill_marked_command(node.marker, grace)


def notify_arm_command(node: NodeLaunch) -> str:
    """Arm node 0 to tell a detached run's end (the node program ``notify send``): its request (the
    webhook URLs: a secret) read from standard input into the control folder, 0600, as launch.sh is
    (:func:`upload_command`); then the notifier started in a session of its own, without the job's marker (`stop` ending
    the job leaves it be), after the host's setup lines (which may set a proxy), its lines in
    ``notify.log``. Prints ``armed``."""
    ctl = qpath(node.control_dir)
    req = node_notify.REQUEST
    lines = preamble(node.host, (), stdout_to=">/dev/null 2>&1", on_fail=lambda line: "true")
    start = python_command(node.host.python, "notify", ["send", '"$PWD"', q(node.marker)])
    return "\n".join([
        f"cd {ctl} || exit 3",
        f"( {upload_command(posixpath.join(node.control_dir, req))} ) || exit 4",
        *lines,
        "(umask 077 && : >> notify.log) || exit 5",
        f"setsid env -u {MARKER} {start} >> notify.log 2>&1 < /dev/null &",
        "echo armed",
    ])


def kill_marked_command(marker: str, grace: float = DEFAULT_GRACE) -> str:
    """:func:`teardown_command` for every process whose environment holds ``CLUSTERDDP_JOB=marker``."""
    steps = max(1, int(grace * 10))
    return (f"{MARKED_FN}; cddp_pids() {{ cddp_marked {marker_word(marker)}; }}; "
            "P=$(cddp_pids); [ -z \"$P\" ] && { echo clean; exit 0; }; "
            "kill -TERM $P 2>/dev/null; "
            f"for i in $(seq {steps}); do sleep 0.1; P=$(cddp_pids); "
            "[ -z \"$P\" ] && { echo terminated; exit 0; }; done; "
            "kill -KILL $P 2>/dev/null; sleep 0.3; P=$(cddp_pids); "
            "if [ -z \"$P\" ]; then echo killed; else echo survivors $P; fi")


def collect_command(node: NodeLaunch) -> str:
    """The node side of ``collect`` (``clusterddp/node/collect.py``): request on stdin, log and files on stdout."""
    return _helper(node, "collect", qpath(node.run_dir), qpath(node.control_dir + "/node.log"))


def diagnose_command(node: NodeLaunch, mode: str, master: tuple[str, int] | None = None) -> str:
    """What the node knows of a failure (``clusterddp/node/diagnose.py``): ``joined`` (did its torchrun
    join the rendezvous; can it reach ``master``) or ``report`` (that, its ranks' error files, kernel
    log lines, an nvidia-smi snapshot). After the host's setup lines, which may put tools on PATH."""
    request = json.dumps({"mode": mode, "master": list(master) if master else None})
    return _helper(node, "diagnose", qpath(node.control_dir), q(request))


def flight_command(node: NodeLaunch) -> str:
    """The flight recorder dumps torch left in the node's control folder (``clusterddp/node/flight.py``)."""
    return _helper(node, "flight", qpath(node.control_dir))


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


def readable_command(argv: Sequence[str]) -> str:
    """A torchrun command line as a person reads it (``--dry-run``'s summary): clusterddp's wrapper
    of torchrun (:func:`torchrun_start`) as ``python -m torch.distributed.run``, and a word of
    clusterddp's own Python source (``--local-rank-arg``'s shim) named, not printed."""
    words = list(argv)
    if len(words) >= 4 and tuple(words[1:4]) == tuple(torchrun_start(words[0])[1:]):
        words[1:4] = ["-m", "torch.distributed.run"]
    return " ".join("<clusterddp's Python: --dry-run --full shows it>" if "\n" in w else shell_word(w) for w in words)


def summary(plan: LaunchPlan) -> str:
    """The short dry-run text: for every node, where it runs, its torchrun command and its env (one
    ``export NAME=VALUE`` line each, quoted as launch.sh has it). :func:`render` has every script."""
    out = [f"run {plan.run_id}: {plan.nnodes} node(s), master {plan.master_addr}:{plan.master_port}"]
    for n in plan.nodes:
        h = n.host
        where = "this machine" if plan.local else f"{h.user + '@' if h.user else ''}{h.address}" + (
            f":{h.port}" if h.port else "")
        procs = ("one per GPU, probed on the node (1 without GPUs)" if n.nproc == "auto" else str(n.nproc))
        out += ["", f"== {h.name} (node {n.node_rank}, {where}) ==", f"run folder: {n.run_dir}",
                f"processes: {procs}", f"command: {readable_command(n.argv)}",
                *(f"setup: {line}" for line in h.setup),
                "env:" + ("" if n.env else " (none set by the inventory or -e)"),
                *(f"  export {k}={q(v)}" for k, v in n.env)]
    if plan.collect:
        out += ["", "collect: " + ", ".join(plan.collect)]
    return "\n".join(out)


# ---- a leased start (the rest of the leases: clusterddp/leases.py) ----

GO_FILE = "lease-go"   # in the control folder: the launcher's word to a node's lease holder to start the job


def go_command(node: NodeLaunch) -> str:
    """Tell the node's lease holder to start the job (it runs :func:`start_command` with the lock
    files open); print the job's pid once it is written, as :func:`start_command` does."""
    return (f"cd {qpath(node.control_dir)} || exit 3; (umask 077 && : > {GO_FILE}) || exit 3; "
            # looked for every 10 ms for its first half second (it takes the holder a few ms), then every 0.1 s
            "for i in $(seq 645); do [ -s pid ] && exec cat pid; if [ $i -le 50 ]; then sleep 0.01; "
            "else sleep 0.1; fi; done; "
            "echo 'the lease holder did not start the job (it ended; is the node overloaded?)' >&2; exit 3")


