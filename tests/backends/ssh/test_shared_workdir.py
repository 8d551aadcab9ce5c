"""Hosts whose workdirs are one shared folder (an NFS home), and nodes whose python has torch but no
clusterddp. The first tests run the node commands with real bash and tar on this machine; the
integration tests run real jobs on the test bed, whose nodes share one filesystem, so giving two
hosts the same workdir path is exactly a shared home folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import threading
import time
import venv
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from clusterddp import inventory, plan
from clusterddp.node import probe
from clusterddp.runspec import RunSpec
from clusterddp.store import new_run_id
from helpers import REPO, cddp, eventually, job_pids, job_script, record, resolved, run_id_of

# ---- the node commands, with real bash and tar ----

SLOW_TAR_S = 1.0


def shared_plan(workdir: Path) -> plan.LaunchPlan:
    """Two hosts, one workdir: one run folder, a control folder each."""
    base = inventory.local(python=sys.executable).hosts[0]
    hosts = tuple(replace(base, name=n, workdir=str(workdir)) for n in ("a", "b"))
    inv = inventory.Inventory("t", "t", hosts, inventory.Master("a", "127.0.0.1", 29500))
    return plan.build_plan(inv, resolved(RunSpec("t.py"), inv), new_run_id())


def bash(command: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def upload_to_both(p: plan.LaunchPlan, tarball: bytes) -> None:
    for n in p.nodes:
        assert bash(plan.prepare_command(n)).returncode == 0
        r = subprocess.run(["bash", "-c", plan.upload_command(n.control_dir + "/source.tar.gz")], input=tarball,
                           capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr


def unpack_at_once(p: plan.LaunchPlan, tmp_path: Path) -> list[tuple[subprocess.CompletedProcess, float]]:
    """Both hosts' unpack commands at the same moment, through a `tar` that logs each call and
    waits SLOW_TAR_S before running the real one (so the second host arrives mid-unpack)."""
    shim = tmp_path / "bin"
    shim.mkdir()
    real = subprocess.run(["bash", "-c", "command -v tar"], capture_output=True, text=True).stdout.strip()
    # `tar --help` (the unpack asks whether tar has --skip-old-files) is no unpack: not logged, not slowed
    (shim / "tar").write_text(f'#!/bin/bash\n[ "$1" = --help ] && exec {real} "$@"\n'
                              f'echo "$PWD" >> {tmp_path}/tar.calls\nsleep {SLOW_TAR_S}\nexec {real} "$@"\n')
    (shim / "tar").chmod(0o755)
    env = {"PATH": f"{shim}:{os.environ['PATH']}"}
    results: list = [None, None]
    go = threading.Barrier(2)

    def one(i: int) -> None:
        go.wait()
        t0 = time.monotonic()
        results[i] = (bash(plan.unpack_command(p.nodes[i]), env), time.monotonic() - t0)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def tarball_of(files: dict[str, bytes]) -> bytes:
    import io
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_two_hosts_unpacking_into_one_run_folder_at_once_unpack_it_once_and_both_wait_for_it(tmp_path):
    p = shared_plan(tmp_path / "home")
    a, b = p.nodes
    assert a.run_dir == b.run_dir and a.control_dir != b.control_dir
    upload_to_both(p, tarball_of({"train.py": b"print(1)\n", "data/x.txt": b"x" * 100000}))
    (ra, ta), (rb, tb) = unpack_at_once(p, tmp_path)
    assert ra.returncode == rb.returncode == 0, (ra.stderr, rb.stderr)
    assert (tmp_path / "tar.calls").read_text().count("\n") == 1  # unpacked once, by one of them
    run = Path(a.run_dir)
    assert (run / "train.py").read_bytes() == b"print(1)\n" and (run / "data" / "x.txt").stat().st_size == 100000
    assert (run / ".clusterddp" / "unpack" / "by").read_text().strip() in ("a", "b")
    # the other host waited for the unpack to finish rather than start a job on half a folder
    assert min(ta, tb) >= SLOW_TAR_S
    for n in p.nodes:  # each removed its own tarball; the other's control folder was left alone
        assert sorted(os.listdir(n.control_dir)) == []


def test_when_the_unpacking_host_fails_the_other_host_says_which_and_why(tmp_path):
    p = shared_plan(tmp_path / "home")
    upload_to_both(p, b"not a tarball")
    results = unpack_at_once(p, tmp_path)
    assert [r.returncode for r, _ in results] == [1, 1]
    by = (Path(p.nodes[0].run_dir) / ".clusterddp" / "unpack" / "by").read_text().strip()
    waiter = next(r for (r, _), n in zip(results, p.nodes, strict=True) if n.host.name != by)
    assert waiter.stderr.strip() == f"{by} failed to unpack the script folder into this shared run folder"


def test_hosts_probing_a_new_workdir_at_once_all_read_one_marker(tmp_path):
    work = tmp_path / "new" / "work"
    facts: list[dict] = [{} for _ in range(8)]
    go = threading.Barrier(len(facts))

    def one(i: int) -> None:
        go.wait()
        probe._workdir_marker(facts[i], str(work))
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(facts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    ids = {f.get("workdir_id") for f in facts}
    assert len(ids) == 1 and None not in ids, facts
    assert os.listdir(work) == [probe.WORKDIR_MARKER]  # no temporary file left behind
    other: dict = {}
    probe._workdir_marker(other, str(tmp_path / "elsewhere"))
    assert other["workdir_id"] not in ids


# ---- on the test bed ----

HOLD = r'''
import os, time
os.write(1, f"rank {os.environ['RANK']} ready\n".encode())
time.sleep(600)
'''


def write_inventory(bed, path: Path, per_host: dict[str, dict], **extra) -> Path:
    """The bed's inventory with host entries changed by ``per_host`` (by node name)."""
    bed.write_inventory(path, extra=extra)
    doc = yaml.safe_load(path.read_text())
    for h in doc["hosts"]:
        h.update(per_host.get(h["name"], {}))
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def checks(stdout: str) -> dict[str, dict[str, dict]]:
    return {h["host"]: {c["check"]: c for c in h["checks"]} for h in json.loads(stdout)["hosts"]}


@pytest.mark.integration
def test_two_hosts_sharing_one_workdir_run_collect_and_are_stopped_each_on_its_own(bed, tmp_path):
    home = tmp_path / "nfs-home" / "clusterddp"
    runs = tmp_path / "runs"
    inv = write_inventory(bed, tmp_path / "inv.yaml", {n.name: {"workdir": str(home)} for n in bed.nodes},
                          collect=["checkpoints/**"])
    # check: the marker one host wrote is seen by the other, and it says what clusterddp will do
    r = cddp("check", str(inv), "--json", check_rc=0, timeout=180)
    found = checks(r.stdout)
    assert [found[n.name]["workdir"]["value"] for n in bed.nodes] == ["shared (2 hosts)"] * 2
    note = found["node1"]["workdir"]["note"]
    assert note.startswith("node1, node2 share one workdir folder") and ".clusterddp/<host>/" in note
    assert found["node2"]["workdir"]["note"] is None  # said once

    # a whole run: both nodes start from the one copy of the code, log and finish separately (one process
    # per node: what is shared is the folder, whatever runs in it)
    script = tmp_path / "job" / "ddp_train.py"
    script.parent.mkdir()
    script.write_bytes((REPO / "examples" / "ddp_train.py").read_bytes())
    r = cddp("up", str(inv), str(script), "--runs-dir", str(runs), "--gpus", "1", "--", "--epochs", "2", check_rc=0)
    run_id = run_id_of(r.stdout)
    assert "[node1] done world_size=2" in r.stdout
    rec = record(runs, run_id)
    assert [(n["host"], n["state"], n["exit_code"]) for n in rec["nodes"]] == [
        ("node1", "succeeded", 0), ("node2", "succeeded", 0)]
    run_dir = home / "runs" / run_id
    for i, node in enumerate(bed.nodes):
        log = (runs / run_id / "logs" / f"{node.name}.log").read_text()
        assert f"node {i}/2 on {node.name}" in log and f"node {1 - i}/2" not in log
        assert (run_dir / ".clusterddp" / node.name / "exit_code").read_text() == "0\n"
        # the checkpoints are in the shared folder: each host brings them back
        assert sorted((runs / run_id / "artifacts" / node.name / "checkpoints").glob("step-*.pt"))
    st = cddp("status", run_id, "--runs-dir", str(runs), check_rc=0).stdout
    assert "node1: succeeded (exit code 0)" in st and "node2: succeeded (exit code 0)" in st, st

    # a detached run: status and stop reach each node's own job
    hold = job_script(tmp_path, "hold.py", HOLD)
    r = cddp("up", str(inv), str(hold), "--runs-dir", str(runs), "--gpus", "1", "--detach", check_rc=0, timeout=120)
    run_id = run_id_of(r.stdout)
    logs = [home / "runs" / run_id / ".clusterddp" / n.name / "node.log" for n in bed.nodes]
    assert eventually(lambda: all(f"rank {i} ready" in log.read_text() for i, log in enumerate(logs)), 90)
    st = cddp("status", run_id, "--runs-dir", str(runs), check_rc=0).stdout
    assert "node1: running" in st and "node2: running" in st, st
    stop = cddp("stop", run_id, "--runs-dir", str(runs), "--grace", "5", check_rc=0, timeout=120).stdout
    assert "node1: stopped (exit code" in stop and "node2: stopped (exit code" in stop, stop
    assert eventually(lambda: not job_pids(run_id), 15), job_pids(run_id)
    for node in bed.nodes:
        assert eventually(lambda node=node: not bed.ns_pids(node), 15), bed.ns_pids(node)
        assert "ready" in (runs / run_id / "logs" / f"{node.name}.log").read_text()


WHICH_TRAIN = r'''
import clusterddp.train as ct
ctx = ct.init()
print(f"TRAIN rank {ctx.rank} {ct.__file__} own={getattr(ct, 'NODE_OWN_COPY', False)}", flush=True)
ct.save_checkpoint({"rank": ctx.rank}, 1, "checkpoints")
ct.cleanup()
'''


def python_without_clusterddp(root: Path, own_clusterddp: bool = False) -> Path:
    """A venv whose site-packages reach this test environment's packages (torch and its
    dependencies, through links: nothing is installed again) but not its clusterddp. With
    ``own_clusterddp``, it has a clusterddp of its own, whose train.py differs from this one's."""
    venv.EnvBuilder(with_pip=False).create(root)
    site = Path(subprocess.run([str(root / "bin" / "python"), "-c", "import site; print(site.getsitepackages()[0])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    ours = Path(next(p for p in sys.path if p.endswith("site-packages") and (Path(p) / "torch").is_dir()))
    links = root / "linked"
    links.mkdir()
    for entry in ours.iterdir():
        if not entry.name.startswith(("clusterddp", "__editable__", "_clusterddp")) and not entry.name.endswith(
                (".pth", ".egg-link")):
            (links / entry.name).symlink_to(entry)
    (site / "linked.pth").write_text(f"{links}\n")
    if own_clusterddp:
        pkg = site / "clusterddp"
        pkg.mkdir()
        (pkg / "__init__.py").write_text('__version__ = "0.0.1"\n')
        (pkg / "train.py").write_text((REPO / "clusterddp" / "train.py").read_text() + "\nNODE_OWN_COPY = True\n")
    return root / "bin" / "python"


@pytest.mark.integration
def test_a_node_without_clusterddp_gets_it_shipped_and_an_installed_one_is_never_shadowed(bed, tmp_path):
    bare = python_without_clusterddp(tmp_path / "bare")
    own = python_without_clusterddp(tmp_path / "own", own_clusterddp=True)
    # the honest premise: torch is there, clusterddp is not (or is the node's own)
    r = subprocess.run([str(bare), "-c", "import importlib.util as u; print(bool(u.find_spec('torch')), "
                        "u.find_spec('clusterddp'))"], capture_output=True, text=True, cwd=tmp_path)
    assert r.stdout.strip() == "True None", r
    runs = tmp_path / "runs"
    inv = write_inventory(bed, tmp_path / "inv.yaml", {"node1": {"python": str(bare)}, "node2": {"python": str(own)}})

    r = cddp("check", str(inv), "--json", check_rc=0, timeout=180)
    found = checks(r.stdout)
    assert found["node1"]["train"]["status"] == "ok" and found["node1"]["train"]["value"] == "shipped"
    t2 = found["node2"]["train"]
    assert (t2["status"], t2["value"]) == ("warn", "installed, differs")
    assert str(own.parent.parent) in t2["problem"] and "never shadowed" in t2["problem"]

    script = job_script(tmp_path, "which.py", WHICH_TRAIN)
    r = cddp("up", str(inv), str(script), "--runs-dir", str(runs), "--gpus", "1", check_rc=0)
    run_id = run_id_of(r.stdout)
    run_dir = {n.name: Path(n.workdir) / "runs" / run_id for n in bed.nodes}
    shipped = run_dir["node1"] / ".clusterddp" / "lib" / "clusterddp" / "train.py"
    assert f"[node1] TRAIN rank 0 {shipped} own=False" in r.stdout, r.stdout
    assert "[node2] TRAIN rank 1 " in r.stdout and "own=True" in r.stdout.split("[node2] TRAIN rank 1 ")[1]
    log1 = (runs / run_id / "logs" / "node1.log").read_text()
    log2 = (runs / run_id / "logs" / "node2.log").read_text()
    assert "[clusterddp] note" not in log1
    assert "[clusterddp] note: this node's own clusterddp.train (" in log2 and "differs from the launcher's" in log2
    assert (run_dir["node1"] / "checkpoints").is_dir()  # the shipped helpers work: rank 0 saved there


@pytest.mark.integration
def test_prune_keeps_a_shared_run_folder_while_a_host_whose_link_died_still_runs_its_job_there(bed, tmp_path):
    """node2's link died mid-run: `up` recorded it lost while its job goes on (as documented). node1,
    whose job ended, cannot see node2's processes: it must not remove the folder they share."""
    from clusterddp.record import NodeState, RunStatus
    from clusterddp.store import RunStore
    home = tmp_path / "nfs-home" / "clusterddp"
    runs = tmp_path / "runs"
    inv = write_inventory(bed, tmp_path / "inv.yaml", {n.name: {"workdir": str(home)} for n in bed.nodes})
    hold = job_script(tmp_path, "hold.py", HOLD)
    run_id = run_id_of(cddp("up", str(inv), str(hold), "--runs-dir", str(runs), "--gpus", "1", "--detach",
                            check_rc=0, timeout=120).stdout)
    run_dir = home / "runs" / run_id
    logs = [run_dir / ".clusterddp" / n.name / "node.log" for n in bed.nodes]
    assert eventually(lambda: all(f"rank {i} ready" in log.read_text() for i, log in enumerate(logs)), 90)
    def carrying(host: str) -> list[int]:
        marker = f"CLUSTERDDP_JOB={run_id}/{host}".encode()
        out = []
        for pid in job_pids(run_id):
            try:
                if marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    out.append(pid)
            except OSError:
                pass
        return out
    for pid in carrying("node1"):  # node1's job ends; node2's goes on
        os.kill(pid, 9)
    assert eventually(lambda: not carrying("node1"), 30) and carrying("node2")
    RunStore(runs).update(run_id, lambda r: replace(
        r, status=RunStatus.FAILED, ended_at="2026-01-01T00:00:00+00:00",
        nodes=(r.nodes[0].seen(NodeState.FAILED, 137), r.nodes[1].seen(NodeState.LOST, None, "connection lost"))))
    r = cddp("prune", "--keep", "0", "--runs-dir", str(runs), check_rc=1, timeout=120)
    assert f"not removed {run_id} " in r.stderr and "node2 running" in r.stderr, r.stdout + r.stderr
    assert (run_dir / "hold.py").is_file() and (run_dir / ".clusterddp" / "node2" / "pid").is_file()
    assert carrying("node2"), "node2's job died with its folder"
    assert (runs / run_id / "run.json").is_file()
    # once node2's job has ended, prune takes all of it
    cddp("stop", run_id, "--runs-dir", str(runs), "--grace", "2", check_rc=None, timeout=120)
    assert eventually(lambda: not job_pids(run_id), 30)
    r = cddp("prune", "--keep", "0", "--runs-dir", str(runs), check_rc=0, timeout=120)
    assert f"removed {run_id} " in r.stdout, r.stdout + r.stderr
    assert not run_dir.exists() and not (runs / run_id).exists()
