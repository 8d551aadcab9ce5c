"""`clusterddp check` on a `slurm:` inventory: will Slurm run this job?

On the login host (this machine, or one reached over SSH): Slurm's commands answer, the partition
exists and is up, it has the nodes and GPUs the inventory asks for, the shared dir can be written.
Then one small probe job on one compute node: the shared dir is visible there (it reads a token
written from the login host), and the python and torch versions there. The answer is a
:class:`clusterddp.check.Report`, printed as for SSH inventories.
"""

from __future__ import annotations

import posixpath
import re
import secrets
from dataclasses import replace

from ...check import FAIL, OK, Finding, HostReport, Report
from ...envs.lock import Lock
from ...errors import HostError, SlurmAnswerError, UsageError
from ...inventory import Inventory
from ...sizes import human_size
from . import answers
from . import envs as slurm_envs
from . import job as slurm
from . import plan as slurm_plan
from .login import Login, open_login
from .section import SlurmSettings, settings_of

CHECKS = ("slurm", "partition", "nodes", "gpus", "shared_dir", "python", "torch")
PROBE_WAIT_S = 60  # srun --immediate: a probe that cannot start within this is reported, not waited for
_UP_STATES = ("idle", "mixed", "allocated", "completing", "planned")


def _partition(login: Login, s: SlurmSettings) -> tuple[str | None, list[list[str]]]:
    """The partition (the default one when the inventory names none) and sinfo's rows for it:
    [availability, node count, state, gres]."""
    out = slurm.checked(login, ["sinfo", "-h", "-o", "%P|%a|%D|%T|%G"])
    rows = [line.split("|") for line in out.splitlines() if line.count("|") == 4]
    if s.partition is None:
        name = next((r[0].rstrip("*") for r in rows if r[0].endswith("*")), None)
    else:
        name = s.partition
    return name, [r[1:] for r in rows if r[0].rstrip("*") == name]


def _gpus(gres: str) -> int:
    m = re.search(r"gpu(?::[^:(,]+)?:(\d+)(?=[(,]|$)", gres)  # the whole count: not the 5 of "gpu:5." or "gpu:5e3"
    return answers.count(m.group(1), f"sinfo: GPUs in gres {answers.shown(gres, 40)}") if m else 0


def _login_findings(login: Login, s: SlurmSettings) -> tuple[list[Finding], str | None]:
    try:
        version = slurm.checked(login, ["sinfo", "--version"]).strip()
        name, rows = _partition(login, s)
    except SlurmAnswerError as e:
        return [Finding("slurm", FAIL, "bad answer", e.message, e.hint)], None
    except slurm.SlurmError as e:
        return [Finding("slurm", FAIL, "unreachable", str(e),
                        "run check on a Slurm login host; is slurmctld up?")], None
    found = [Finding("slurm", OK, version.replace("slurm ", ""))]
    if not rows:
        found.append(Finding("partition", FAIL, "missing", f"no partition {name or '(default)'}",
                             "set slurm.partition to one `sinfo` lists"))
        return found, None
    avail = {r[0] for r in rows}
    found.append(Finding("partition", OK, f"{name} up") if avail == {"up"} else
                 Finding("partition", FAIL, f"{name} {'/'.join(sorted(avail))}", f"partition {name} is not up",
                         "ask the cluster's admins, or choose another partition"))
    try:
        usable = sum(answers.count(r[1], "sinfo: node count") for r in rows
                     if r[2].rstrip("*~#!%$@^-") in _UP_STATES)
        have = max((_gpus(r[3]) for r in rows), default=0) if s.request_gpus else 0
    except SlurmAnswerError as e:
        return [*found, Finding("nodes", FAIL, "bad answer", e.message, e.hint)], None
    want = s.nodes[0]
    found.append(Finding("nodes", OK, f"{usable} usable") if usable >= want else
                 Finding("nodes", FAIL, f"{usable} usable", f"the job needs {want} node(s); {name} has {usable} up",
                         "lower slurm.nodes, or choose another partition"))
    if not s.request_gpus:
        found.append(Finding("gpus", OK, "not requested"))
    else:
        found.append(Finding("gpus", OK, f"{have} per node") if have >= s.gpus_per_node else
                     Finding("gpus", FAIL, f"{have} per node", f"gpus_per_node is {s.gpus_per_node}; nodes of {name} "
                             f"offer {have}", "lower slurm.gpus_per_node, or set request_gpus: false on CPU nodes"))
    return found, name


def _probe(login: Login, s: SlurmSettings, partition: str | None) -> tuple[str, list[Finding]]:
    """One compute node's name and findings, from a one-node probe job."""
    base = login.shared_dir(s)
    folder = posixpath.join(base, ".clusterddp-check", secrets.token_hex(4))
    ctl = posixpath.join(folder, ".clusterddp")
    token, script = posixpath.join(ctl, "token"), posixpath.join(ctl, "probe.sh")
    try:
        login.stage(folder, ctl, None, {"token": "ok\n", "probe.sh": slurm_plan.probe_script(s, token)})
    except UsageError as e:
        return "slurm", [Finding("shared_dir", FAIL, "not writable", f"{base}: {e.message}",
                                 "set slurm.shared_dir to a folder the login host and the nodes share")]
    try:
        opts = [f"--{k}={v}" for k, v in (("partition", partition), ("account", s.account), ("qos", s.qos),
                                          ("constraint", s.constraint)) if v]
        r = login.run(["srun", "-N1", "-n1", f"--immediate={PROBE_WAIT_S}", "--time=5", *opts,
                       "bash", script], timeout=PROBE_WAIT_S + 120)
    except slurm.SlurmError as e:
        return "slurm", [Finding("shared_dir", FAIL, "no probe", str(e))]
    finally:
        login.remove_tree(folder)
    out = r.stdout.decode(errors="replace")
    facts = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    node = facts.get("node", "compute node")
    if r.exit_code != 0 and "node" not in facts:
        said = r.stderr.decode(errors="replace").strip()[-300:]
        return "slurm", [Finding("shared_dir", FAIL, "no probe", f"the one-node probe job failed: {said}",
                                 "see `sinfo`; is the partition accepting jobs?")]
    found = [Finding("shared_dir", OK, "shared") if facts.get("shared") == "ok" else
             Finding("shared_dir", FAIL, "not shared", f"{node} does not see {base}",
                     "set slurm.shared_dir to a folder every compute node mounts")]
    if "setup" in facts:
        found.append(Finding("python", FAIL, "setup failed", f"setup {facts['setup']}", "fix slurm.setup"))
        return node, found
    py = facts.get("python")
    found.append(Finding("python", OK, py) if py else
                 Finding("python", FAIL, "missing", f"{s.python} does not run on {node}", "fix slurm.python"))
    torch = facts.get("torch")
    if torch and not torch.startswith("missing"):
        found.append(Finding("torch", OK, torch))
    else:
        found.append(Finding("torch", FAIL, "missing", f"torch cannot be imported on {node}: {facts.get('torch')}",
                             "install torch in slurm.python's environment (or a setup line that activates it)"))
    return node, found


def _environment(login: Login, s: SlurmSettings, lock: Lock) -> tuple[Finding, SlurmSettings]:
    """`packages:`: the job's environment as `up` would find it (:func:`.envs.prepare`: the login host's look,
    the wheels fetched here; nothing sent), and the settings the probe then runs with (a ready environment's
    python). A package with no wheel for the nodes' Python is a UsageError (exit 2), as for `up`."""
    try:
        env = slurm_envs.prepare(login, s, login.shared_dir(s), lock)
    except HostError as e:
        return Finding("env", FAIL, "no look", f"{s.python} on the login host {login.name}: {e.detail}",
                       "the login host runs slurm.python (after slurm.setup) to learn the nodes' Python and "
                       "platform: make it run there"), s
    value = "ready" if env.plan.ready else f"to build ({human_size(env.plan.to_send)} to send)"
    return (Finding("env", OK, f"{env.step.env_id[:12]} {value}", note=env.says()),
            replace(s, python=env.step.python) if env.plan.ready else s)


def run_slurm_checks(inv: Inventory) -> Report:
    s = settings_of(inv)
    lock = slurm_envs.read_lock(s)  # a lock that is not one: exit 2, naming the file and line
    login = open_login(s.login)
    name, address = (login.host.name, login.host.address) if login.host else ("slurm", "local")
    try:
        found, partition = _login_findings(login, s)
        if lock is not None and all(f.status != FAIL for f in found):
            env, s = _environment(login, s, lock)
            found.append(env)
        hosts = [HostReport(name, address, tuple(found))]
        if all(f.status != FAIL for f in found):
            node, probed = _probe(login, s, partition)
            hosts.append(HostReport(node, node, tuple(probed)))
    except HostError as e:  # the login host cannot be reached (or its host key is refused)
        hosts = [HostReport(name, address, (Finding("slurm", FAIL, "unreachable", f"login host {name}: {e.detail}",
                                                    e.hint),))]
    finally:
        login.close()
    return Report(tuple(hosts), (*CHECKS, "env") if lock is not None else CHECKS)
