"""Pure planning for `slurm:` inventories: inventory + run spec -> the batch script and the node script.

Slurm allocates, starts and kills; clusterddp renders, submits and follows. The run lives in
``<shared_dir>/runs/<run_id>/`` (the script's folder is staged there, and every node runs in it)
with a control folder ``.clusterddp/`` holding ``job.sbatch`` (given to ``sbatch``), ``node.sh``
(what each node runs: it holds the env values, so both are 0600 in a 0700 folder), ``node.log``
(the batch step's own output) and, per node, ``nodes/<host>/`` with its ``node.log``, ``exit_code``
and ``errors/`` (torchrun's ``--log-dir``), as an SSH node's control folder has them.

A detached run with webhooks to tell (``notify``) also has ``notify.py`` (the node program) and
``notify.json`` (its request: the webhook URLs, a secret, so 0600 too) there: the batch script, on
the allocation's first node (node 0), tells the run's end itself once its srun step has ended
(:func:`notify_lines`), so no launcher need be attached.

Inside the job one ``srun`` step with one task per node runs node.sh, which starts torchrun with
c10d rendezvous (id = the job id) hosted on the allocation's first host; the master's address is
Slurm's ``NodeAddr`` for it, resolved on the node, and each node finds the interface that routes
there as in SSH mode. Quoting, setup lines and exports, the interface choice, the exit-code function and
the shipped clusterddp.train come from :mod:`clusterddp.nodescript`, the same as launch.sh.
Nothing here touches the network, the clock or the filesystem.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, replace

from ... import nodescript as kit
from ... import runspec
from ...inventory import Inventory
from ...node import notify as node_notify
from ...nodescript import shell_word, store_wait, torchrun_entry, torchrun_start
from ...runspec import ResolvedSpec, RunSpec
from .section import SlurmSettings, settings_of

BATCH = "job.sbatch"
NODE_SCRIPT = "node.sh"
NODES = "nodes"  # <control>/nodes/<host>/: each node's own folder, apart from node.log whatever a host is called
BATCH_LOG = "node.log"  # the name collect reads as the log of the pseudo-host `shared`
NOTIFY_PROGRAM = "notify.py"  # the node program `notify`, staged for a detached run with webhooks
NOTIFY_LOG = "notify.log"  # what the batch script's notifier said: one line per target
ENV_PROGRAM = "envbuild.py"  # the node program `envbuild`, staged for a run with `packages:`
ENV_REQUEST = "env.json"  # its build request (the environment's id, the wheels, the lock's versions)
# Without --master-port, each job's rendezvous port comes from its id: two jobs sharing a node
# (Slurm may pack them) do not collide.
_PORT_FROM_JOB = "$((20000 + SLURM_JOB_ID % 20000))"


@dataclass(frozen=True)
class EnvStep:
    """`packages:`: the environment the job's first step makes ready on every node (built, or found ready),
    as :mod:`.envs` planned it from the login host's look; the job's step then runs its python."""

    env_id: str
    root: str                    # where it lives: <shared_dir>/envs, or slurm.envs_dir on each node
    python: str                  # <root>/<env_id>/bin/python
    lock_sha256: str
    request: str                 # the node program's build request (JSON), staged as env.json


@dataclass(frozen=True)
class SlurmPlan:
    run_id: str
    inventory: Inventory
    spec: ResolvedSpec
    settings: SlurmSettings
    run_dir: str                 # <shared_dir>/runs/<run_id>: the staged code; where the script runs
    control_dir: str
    batch_script: str            # the text of job.sbatch
    node_script: str             # the text of node.sh
    collect: tuple[str, ...]
    notify: bool = False         # the batch script tells the run's end (a detached run with webhooks)
    env: EnvStep | None = None   # `packages:`: the environment a first step makes ready on every node

    @property
    def batch_path(self) -> str:
        return posixpath.join(self.control_dir, BATCH)


IDLE = "idle.json"  # in a node's own folder: the sampler found the run idle (clusterddp.metrics.idle)
ATTEMPT_FILE = "attempt"  # in a node's own folder: the attempt (1, 2, ...) whose samples metrics.jsonl holds


def keep_samples_lines() -> list[str]:
    """A requeued job runs again in the same node folders: the sample file of the attempt this node ran
    before is moved aside to ``<host>@attempt-N/`` beside its folder, as an SSH host's earlier attempt's
    control folder is (so :func:`clusterddp.metrics.samples.fetch_command` brings back both alike), N
    from the ``attempt`` file that attempt left (a node need not have run every attempt)."""
    return [
        "# an earlier attempt's samples (a requeue) kept as <host>@attempt-N/ beside this node's folder",
        f'cddp_att=$(head -c 16 "$CTL/{ATTEMPT_FILE}" 2>/dev/null | tr -cd 0-9)',
        f'if [ -n "$cddp_att" ] && [ -f "$CTL/{kit.SAMPLES}" ]; then',
        f'  (umask 077 && mkdir -p "$CTL@attempt-$cddp_att" && mv -f "$CTL/{kit.SAMPLES}" "$CTL@attempt-$cddp_att/")',
        "fi",
        f'rm -f "$CTL/{IDLE}"  # the idle policy\'s word on an earlier attempt is not this one\'s',
        f'echo "$((${{SLURM_RESTART_COUNT:-0}} + 1))" > "$CTL/{ATTEMPT_FILE}"',
    ]


def node_control(control_dir: str, host: str) -> str:
    """``host``'s own control folder in a run's shared control folder: its log, exit code and torchrun's
    error files, named as in an SSH node's control folder (``node.log``, ``exit_code``, ``errors/``)."""
    return posixpath.join(control_dir, NODES, host)


def node_log(control_dir: str, host: str) -> str:
    """Where node.sh writes ``host``'s output, in a run's control folder in the shared dir."""
    return posixpath.join(node_control(control_dir, host), "node.log")


def exit_code_file(control_dir: str, host: str) -> str:
    """Where node.sh writes ``host``'s exit code, beside its log."""
    return posixpath.join(node_control(control_dir, host), "exit_code")


def procs(s: SlurmSettings, spec: RunSpec) -> int:
    """Processes per node: --gpus over ``slurm.gpus_per_node`` (as :func:`clusterddp.runspec.nproc` has it for
    a host's entry: the flag wins; every node of the job is alike)."""
    return spec.gpus or s.gpus_per_node


def build(inventory: Inventory, spec: ResolvedSpec, run_id: str, shared_dir: str, notify: bool = False,
          env: EnvStep | None = None) -> SlurmPlan:
    """Plan a Slurm run; ``shared_dir`` is the inventory's, with ``~`` already expanded by the caller.
    ``notify``: the batch script tells the run's end (:func:`notify_lines`; `up --detach` with webhooks).
    ``env``: the job's environment (`packages:`), made ready by a first step (:func:`env_lines`)."""
    s = settings_of(inventory)
    run_dir = posixpath.join(shared_dir, "runs", run_id)
    ctl = posixpath.join(run_dir, kit.CONTROL)
    node = _node_script(s, spec, run_id, run_dir, ctl, env)
    batch = _batch_script(s, spec, run_id, ctl, notify, env is not None)
    return SlurmPlan(run_id, inventory, spec, s, run_dir, ctl, batch, node, spec.collect, notify, env)


def env_lines(s: SlurmSettings, ctl: str) -> list[str]:
    """node.sh's part for the job's first step (`packages:`), after the setup lines: the node program
    ``envbuild build`` (staged as envbuild.py, its request as env.json) with the base python, which
    checks that this node's Python is the one the environment was planned for, then builds it or finds
    it ready (another node or job building it: waited for, under its lock); its words in the node's log.
    A failure is this node's exit code (the job's step then does not start)."""
    program, request = kit.q(posixpath.join(ctl, ENV_PROGRAM)), kit.q(posixpath.join(ctl, ENV_REQUEST))
    return [
        'if [ "${2:-}" = env ]; then  # the first step: this node\'s environment (packages:), then nothing else',
        f'  {kit.q(s.python)} -S {program} build "$(cat {request})" say || cddp_exit $?',
        "  exit 0",
        "fi",
    ]


def _batch_script(s: SlurmSettings, spec: ResolvedSpec, run_id: str, ctl: str, notify: bool = False,
                  env: bool = False) -> str:
    lo, hi = s.nodes
    opts = [f"--job-name=clusterddp-{run_id}", f"--nodes={lo}" if lo == hi else f"--nodes={lo}-{hi}",
            "--ntasks-per-node=1", f"--output={ctl}/{BATCH_LOG}", f"--chdir={ctl}"]
    opts += [f"--{k}={v}" for k, v in (("partition", s.partition), ("time", s.time), ("account", s.account),
                                        ("qos", s.qos), ("constraint", s.constraint)) if v]
    if s.request_gpus:
        opts.append(f"--gpus-per-node={s.gpus_per_node}")
    opts.append("--requeue" if spec.max_restarts > 0 else "--no-requeue")
    opts += s.sbatch
    # sbatch reads #SBATCH lines verbatim (no shell): a path with spaces would split there, so
    # the control folder's path is also checked by the caller; here each option is one line.
    lines = ["#!/usr/bin/env bash"] + [f"#SBATCH {o}" for o in opts] + [
        f"# clusterddp run {run_id}: one srun step, one task (node.sh) per node",
        f"CTL={kit.q(ctl)}",
        "# The allocation's first host hosts the rendezvous; node.sh finds its address.",
        'cddp_master=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "# --kill-on-bad-exit: one node failing ends the step on every node.",
    ]
    srun = ('srun --kill-on-bad-exit=1 --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 '
            '--ntasks="$SLURM_JOB_NUM_NODES" bash "$CTL/' + NODE_SCRIPT + '" "$cddp_master"')
    step: list[str] = []
    if not notify:
        step += [srun, "rc=$?"]
    else:
        lines += [
            "# `clusterddp stop` (scancel) and the time limit end the job with TERM, then SIGKILL KillWait",
            "# seconds later: TERM is noted (not this script's end), so that it tells the run's end at once.",
            "cddp_term=0",
            "trap 'cddp_term=1' TERM",
        ]
        step += [srun + " &", "cddp_srun=$!", 'wait "$cddp_srun"; rc=$?']
    if env:  # packages: a first step makes the environment ready on every node; the job's step runs only then
        lines += [
            "# packages: the job's Python environment, made ready on every node by a step of its own first",
            f'{srun} env; rc=$?',
            'if [ "$rc" -ne 0 ]; then',
            '  echo "[clusterddp] the environment step failed (exit $rc): the job\'s step does not start"',
            *(["  cddp_srun="] if notify else []),
            "else",
            *("  " + line for line in step),
            "fi",
        ]
    else:
        lines += step
    if spec.max_restarts > 0:
        lines += [
            "# A failed attempt with restarts left goes back to the queue; the script resumes from its checkpoint.",
            f'if [ "$rc" -ne 0 ] && [ "${{SLURM_RESTART_COUNT:-0}}" -lt {spec.max_restarts} ]'
            + (' && [ "$cddp_term" = 0 ]; then' if notify else "; then"),
            '  echo "[clusterddp] attempt $((${SLURM_RESTART_COUNT:-0} + 1)) failed (exit $rc): requeue"',
            # told: only the run's final end (a requeue that Slurm refused falls through to it)
            '  scontrol requeue "$SLURM_JOB_ID"' + (' && exit "$rc"' if notify else ""),
            "fi",
        ]
    if notify:
        lines += notify_lines(s, env)
    lines += ['exit "$rc"', ""]
    return "\n".join(lines)


def notify_lines(s: SlurmSettings, env: bool = False) -> list[str]:
    """The batch script's end for a detached run with webhooks: the node program ``notify ended``
    (staged as ``notify.py``) tells the run's end from node 0's own folder (``nodes/<first host>/``:
    its errors, hang record and log, as an SSH node 0's control folder holds them), with srun's exit
    code and the allocation's hosts; the request (``notify.json``) and the stop mark
    `clusterddp stop` left (``stop``, its time
    kept) moved there first. After the host's setup lines (they may set a proxy), their output
    discarded; the notifier's lines in ``notify.log``; TERM ignored (inherited through exec). Bounded by
    the request's own bound, and by Slurm: after a TERM, what is left of KillWait before its SIGKILL.
    Then srun is waited for, if TERM cut the wait for it short (``env``: if it started: the environment's step
    may have failed first)."""
    n0 = f'"$CTL/{NODES}/$cddp_master"'
    setup = kit.preamble(s, (), stdout_to=">/dev/null 2>&1", on_fail=lambda line: "true")
    start = " ".join([kit.q(s.python), "-S", f'"$CTL/{NOTIFY_PROGRAM}"', "ended", n0, '"$rc"', '"$cddp_hosts"'])
    return [
        "# The run's end, told to its webhooks by this node (node 0): up --detach left the request.",
        'cddp_hosts=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd , -)',
        f'if [ -f "$CTL/{node_notify.REQUEST}" ] && (umask 077 && mkdir -p {n0}); then',
        f'  [ -f "$CTL/{node_notify.STOP_MARK}" ] && cp -p "$CTL/{node_notify.STOP_MARK}" '
        f'{n0}/{node_notify.STOP_MARK}',
        f'  mv -f "$CTL/{node_notify.REQUEST}" {n0}/{node_notify.REQUEST} && (',
        "    trap '' TERM  # a TERM now (a stop just after the job's own end) does not cut the telling short",
        *setup,
        f"    exec {start}",
        f'  ) >> "$CTL/{NOTIFY_LOG}" 2>&1 < /dev/null',
        "fi",
        'if [ "$cddp_term" = 1 ]' + (' && [ -n "$cddp_srun" ]' if env else "")
        + '; then wait "$cddp_srun"; fi  # what TERM left of the step',
    ]


def _node_script(s: SlurmSettings, spec: ResolvedSpec, run_id: str, run_dir: str, ctl: str,
                 step: EnvStep | None = None) -> str:
    host = s  # its python and setup lines are every node's (nodescript.HostLike)
    env = tuple({**dict(s.env), **dict(spec.env)}.items())
    port = str(spec.master_port) if spec.port_fixed else _PORT_FROM_JOB
    lines = [
        "#!/usr/bin/env bash",
        f"# clusterddp run {run_id}: one node's part, started by srun on every node of the allocation",
        kit.STOP_TRAP,
        "cddp_h=${SLURMD_NODENAME:-$(hostname)}",
        "# Each node's own control folder (0700) in the shared one: its log, exit code and torchrun's",
        "# error files (--log-dir), as an SSH node's control folder holds them.",
        f"CTL={kit.q(posixpath.join(ctl, NODES))}/\"$cddp_h\"",
        '(umask 077 && mkdir -p "$CTL/errors" && : >> "$CTL/node.log") || exit 97',
        'exec >> "$CTL/node.log" 2>&1',
        'rm -f "$CTL/exit_code"',
        kit.exit_function(),
        f"cd {kit.q(run_dir)} || cddp_exit 97",
        f"export {kit.MARKER}={kit.q(run_id + '/')}\"$cddp_h\" CLUSTERDDP_RUN_ID={kit.q(run_id)} "
        "CLUSTERDDP_HOST=\"$cddp_h\" CLUSTERDDP_NODE_RANK=\"$SLURM_NODEID\"",
    ]
    lines += kit.preamble(host, env, stdout_to="", on_fail=kit.setup_failed())
    if step is not None:  # packages: the first step builds with the base python; the job runs the environment's
        lines += env_lines(s, ctl)
        s = replace(s, python=step.python)
    lines += [
        "cddp_master=$1",
        "# Slurm's NodeAddr for the master, resolved here: compute nodes' names need not resolve.",
        'MASTER_ADDR=$(scontrol show node "$cddp_master" 2>/dev/null | sed -n \'s/.*NodeAddr=\\([^ ]*\\).*/\\1/p\')',
        'cddp_a=$(getent ahostsv4 "${MASTER_ADDR:-$cddp_master}" 2>/dev/null | awk \'NR==1{print $1}\')',
        'MASTER_ADDR=${cddp_a:-${MASTER_ADDR:-$cddp_master}}',
    ]
    lines += kit.iface_lines({k for k, _ in env}, None, local_addr=True)
    lines += kit.ship_train_lines(s.python, run_dir)
    lines += kit.stack_hook_lines()
    lines += [
        'cddp_is_host=0; [ "$cddp_h" = "$cddp_master" ] && cddp_is_host=1',
        "# a node that does not serve the rendezvous store waits for it before torchrun connects (nodescript.py)",
        f'cddp_store=; [ "$cddp_is_host" = 1 ] || cddp_store="$MASTER_ADDR:{port}"',
        *kit.torchrun_lines(),
        'echo "[clusterddp] node $SLURM_NODEID/$SLURM_JOB_NUM_NODES on $cddp_h iface=${IFACE:-?} job $SLURM_JOB_ID"',
    ]
    lo, hi = s.nodes
    watch = watch_args(s, spec)
    watch_start, watch_end = kit.watch_lines(s.python, watch) if watch is not None else ([], [])
    if watch is not None:
        # The stall watchdog reaches the run's store where torchrun's c10d rendezvous serves it, found
        # here on the node: given to it alone (exported for it, then not), torchrun's env unchanged.
        lines += ["# the stall watchdog (--stall-timeout): the run's rendezvous store, for it alone",
                  f"export MASTER_ADDR MASTER_PORT={port}", *watch_start, "export -n MASTER_ADDR MASTER_PORT"]
    sampler = runspec.sampler_args(spec, lo)
    if sampler is not None:
        lines += keep_samples_lines()
    if sampler is not None and sampler.get("store"):  # a run-wide idle policy: the run's store, as the watchdog's
        lines += [f"export MASTER_ADDR MASTER_PORT={port}", *kit.sampler_lines(s.python, sampler),
                  "export -n MASTER_ADDR MASTER_PORT"]
    else:
        lines += kit.sampler_lines(s.python, sampler) if sampler is not None else []
    where_start, where_end = kit.where_lines(s.python, kit.WHERE_ARGS)  # the rank sampler (clusterddp.stragglers)
    lines += where_start
    nproc = procs(s, spec)
    argv = [store_wait('"$cddp_store"'), *map(shell_word, torchrun_start(s.python))]
    argv += [kit.q(w) for w in ("--nnodes", str(lo) if lo == hi else f"{lo}:{hi}", "--nproc-per-node", str(nproc),
                               "--rdzv-backend", "c10d")]
    argv += ["--rdzv-endpoint", f'"$MASTER_ADDR:{port}"', "--rdzv-id", '"$SLURM_JOB_ID"',
             "--rdzv-conf", '"is_host=$cddp_is_host"']
    argv += ['${LOCAL_ADDR:+--local-addr "$LOCAL_ADDR"}']
    # Restarts are Slurm's (the batch script requeues the job), not torchrun's: one mechanism, so a
    # restart always starts every node afresh in a new allocation. --log-dir: each rank's error file
    # (TORCHELASTIC_ERROR_FILE), which the diagnosis reads as for SSH runs.
    argv += [kit.q(w) for w in ("--max-restarts", "0")]
    argv += ["--log-dir", '"$CTL/errors"']
    argv += [kit.q(w) for w in torchrun_entry(s.python, posixpath.basename(spec.script), spec.script_args,
                                             spec.local_rank_arg)]
    lines += [" ".join(argv), *where_end, *watch_end,
              "cddp_exit $cddp_rc" if watch is not None else "cddp_exit $?", ""]
    return "\n".join(lines)


def watch_args(s: SlurmSettings, spec: RunSpec) -> dict | None:
    """The stall watchdog's argument in node.sh (None: the run has none): as an SSH run's
    (:func:`clusterddp.runspec.watch_args`), but the store is the one the node script finds
    (``$MASTER_ADDR``/``$MASTER_PORT``: the allocation's first host, the job's port). The node count
    must be fixed (the caller refuses a range): the nodes wait for each other's watchdogs."""
    args = runspec.watch_args(spec, s.nodes[0], "", 0)
    return None if args is None else {**args, "store": None}


def render(p: SlurmPlan) -> str:
    """The dry-run text: where the run goes and both scripts, exactly as they would be written."""
    s = p.settings
    count = str(s.nodes[0]) if s.nodes[0] == s.nodes[1] else f"{s.nodes[0]}-{s.nodes[1]}"
    out = [f"run {p.run_id}: Slurm job, {count} node(s) "
           f"x {procs(s, p.spec)} process(es), partition {s.partition or '(default)'}",
           f"run folder (shared): {p.run_dir}", f"submit: sbatch --parsable {p.batch_path}",
           "", f"== {BATCH} ==", p.batch_script, f"== {NODE_SCRIPT} ==", p.node_script]
    if p.collect:
        out += ["collect: " + ", ".join(p.collect)]
    return "\n".join(out)


def summary(p: SlurmPlan) -> str:
    """The short dry-run text: where the run goes, its ``#SBATCH`` options, the torchrun command every
    node runs (as a person reads it: :func:`clusterddp.plan.readable_command`'s words) and the env (one
    ``export NAME=VALUE`` line each). :func:`render` has both scripts."""
    s = p.settings
    head = render(p).split("\n", 3)[:3]
    command = next((line for line in p.node_script.splitlines() if " torch.distributed.run " in line), "")
    python = p.env.python if p.env else s.python
    wrapped = " ".join(shell_word(w) for w in torchrun_start(python))
    command = command.replace(wrapped, f"{kit.q(python)} -m torch.distributed.run")
    env = tuple({**dict(s.env), **dict(p.spec.env)}.items())
    out = [
        *head,
        "sbatch options: "
        + " ".join(line[len("#SBATCH ") :] for line in p.batch_script.splitlines() if line.startswith("#SBATCH ")),
        *(f"setup: {line}" for line in s.setup),
        f"command (every node, through srun): {command}",
        "env:" + ("" if env else " (none set by the inventory or -e)"),
        *(f"  export {k}={kit.q(v)}" for k, v in env),
    ]
    if p.collect:
        out += ["collect: " + ", ".join(p.collect)]
    return "\n".join(out)


# `check` on a compute node: what it prints, one "key value" line each.
_PROBE_PY = ("import platform, sys\n"
             "print('python', platform.python_version())\n"
             "try:\n    import torch\n    print('torch', torch.__version__)\n"
             "except Exception as e:\n    print('torch missing:', type(e).__name__, str(e)[:200])\n")


def probe_script(s: SlurmSettings, token: str) -> str:
    """What `check` runs on one compute node (as a file in the shared dir: it holds the env values): the
    inventory's setup lines and env, then whether the token written on this machine is visible there,
    and the python and torch versions. Prints ``key value`` lines."""
    host = s  # its python and setup lines are every node's (nodescript.HostLike)
    lines = ["#!/usr/bin/env bash", 'echo "node ${SLURMD_NODENAME:-$(hostname)}"']
    lines += kit.preamble(host, s.env, stdout_to=">&2",
                         on_fail=lambda line: f"echo {kit.q('setup failed: ' + line)}; exit 0")
    lines += [f"if [ -r {kit.q(token)} ]; then echo 'shared ok'; else echo 'shared missing'; fi",
              f"{kit.q(s.python)} -c {kit.q(_PROBE_PY)} 2>&1 || echo 'python failed'", ""]
    return "\n".join(lines)
