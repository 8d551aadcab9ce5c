"""`clusterddp check` on a `slurm:` inventory: will Slurm run this job?

On this machine (the login host): Slurm's commands answer, the partition exists and is up, it has
the nodes and GPUs the inventory asks for, the shared dir can be written. Then one small probe job
on one compute node: the shared dir is visible there (it reads a token written here), and the
python and torch versions there. The answer is a :class:`clusterddp.check.Report`, printed as for
SSH inventories.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
from pathlib import Path

from . import slurm
from . import slurm_plan as SP
from .check import FAIL, OK, Finding, HostReport, Report
from .inventory import Inventory, SlurmSettings

CHECKS = ("slurm", "partition", "nodes", "gpus", "shared_dir", "python", "torch")
PROBE_WAIT_S = 60  # srun --immediate: a probe that cannot start within this is reported, not waited for
_UP_STATES = ("idle", "mixed", "allocated", "completing", "planned")


def _partition(s: SlurmSettings) -> tuple[str | None, list[list[str]]]:
    """The partition (the default one when the inventory names none) and sinfo's rows for it:
    [availability, node count, state, gres]."""
    out = slurm.checked(["sinfo", "-h", "-o", "%P|%a|%D|%T|%G"])
    rows = [line.split("|") for line in out.splitlines() if line.count("|") == 4]
    if s.partition is None:
        name = next((r[0].rstrip("*") for r in rows if r[0].endswith("*")), None)
    else:
        name = s.partition
    return name, [r[1:] for r in rows if r[0].rstrip("*") == name]


def _gpus(gres: str) -> int:
    m = re.search(r"gpu(?::[^:(,]+)?:(\d+)", gres)
    return int(m.group(1)) if m else 0


def _login_findings(s: SlurmSettings) -> tuple[list[Finding], str | None]:
    try:
        version = slurm.checked(["sinfo", "--version"]).strip()
        name, rows = _partition(s)
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
    usable = sum(int(r[1]) for r in rows if r[2].rstrip("*~#!%$@^-") in _UP_STATES)
    want = s.nodes[0]
    found.append(Finding("nodes", OK, f"{usable} usable") if usable >= want else
                 Finding("nodes", FAIL, f"{usable} usable", f"the job needs {want} node(s); {name} has {usable} up",
                         "lower slurm.nodes, or choose another partition"))
    if not s.request_gpus:
        found.append(Finding("gpus", OK, "not requested"))
    else:
        have = max((_gpus(r[3]) for r in rows), default=0)
        found.append(Finding("gpus", OK, f"{have} per node") if have >= s.gpus_per_node else
                     Finding("gpus", FAIL, f"{have} per node", f"gpus_per_node is {s.gpus_per_node}; nodes of {name} "
                             f"offer {have}", "lower slurm.gpus_per_node, or set request_gpus: false on CPU nodes"))
    return found, name


def _probe(s: SlurmSettings, partition: str | None) -> tuple[str, list[Finding]]:
    """One compute node's name and findings, from a one-node probe job."""
    base = Path(os.path.expanduser(s.shared_dir))
    folder = base / ".clusterddp-check" / secrets.token_hex(4)
    try:
        folder.mkdir(parents=True, mode=0o700)
        token = folder / "token"
        token.write_text("ok\n")
        script = folder / "probe.sh"
        fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(SP.probe_script(s, str(token)))
    except OSError as e:
        return "slurm", [Finding("shared_dir", FAIL, "not writable", f"{base}: {e.strerror or e}",
                                 "set slurm.shared_dir to a folder this machine and the nodes share")]
    try:
        opts = [f"--{k}={v}" for k, v in (("partition", partition), ("account", s.account), ("qos", s.qos),
                                          ("constraint", s.constraint)) if v]
        r = slurm.run_cmd(["srun", "-N1", "-n1", f"--immediate={PROBE_WAIT_S}", "--time=5", *opts,
                           "bash", str(script)], timeout=PROBE_WAIT_S + 120)
    except slurm.SlurmError as e:
        return "slurm", [Finding("shared_dir", FAIL, "no probe", str(e))]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    out = r.stdout.decode(errors="replace")
    facts = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    node = facts.get("node", "compute node")
    if r.returncode != 0 and "node" not in facts:
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


def run_slurm_checks(inv: Inventory) -> Report:
    s = inv.slurm
    assert s is not None
    login, partition = _login_findings(s)
    hosts = [HostReport("slurm", s.login, tuple(login))]
    if all(f.status != FAIL for f in login):
        node, found = _probe(s, partition)
        hosts.append(HostReport(node, node, tuple(found)))
    return Report(tuple(hosts), CHECKS)
