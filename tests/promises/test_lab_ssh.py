"""What users of a shared lab and of other launchers expect, on real sshd hosts with real torchrun:
`top` on a detached run, `--local_rank` scripts, DeepSpeed/MPI hostfiles and `--exclude`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from helpers import cddp, eventually, job_pids, job_script, record, run_id_of

pytestmark = pytest.mark.integration

# Prints a progress line, with an escape sequence a terminal would obey, ten times a second
# per rank until the stop file appears.
STEPPER = r'''
import os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
i = 0
while not os.path.exists(sys.argv[1]) and i < 6000:
    os.write(1, f"rank {dist.get_rank()} step {i} loss 0.5 \x1b[2J\n".encode())
    i += 1
    time.sleep(0.1)
dist.barrier()
dist.destroy_process_group()
'''

# In the style of torch.distributed.launch scripts (the reference repository's distributed.py).
LOCAL_RANK = r'''
import argparse, json, os, sys
parser = argparse.ArgumentParser()
parser.add_argument('--local_rank', '--local-rank', type=int, default=-1)
parser.add_argument('--epochs', type=int, default=1)
parser.add_argument('rest', nargs='*')
args = parser.parse_args()
# one write per line: ranks share torchrun's stdout, and `python -u` print writes the newline apart
sys.stdout.write("LR " + json.dumps({"local_rank": args.local_rank, "env": os.environ["LOCAL_RANK"],
                                     "argv": sys.argv[1:], "epochs": args.epochs, "rest": args.rest}) + "\n")
sys.stdout.flush()
'''


def node_log(bed, node, run_id: str) -> str:
    p = Path(node.workdir) / "runs" / run_id / ".clusterddp" / node.name / "node.log"
    return p.read_text(errors="replace") if p.exists() else ""


def test_top_once_json_reports_every_node_of_a_detached_run(bed, tmp_path):
    runs, stop = tmp_path / "runs", tmp_path / "stop-now"
    inv = bed.write_inventory(tmp_path / "inv.yaml")
    script = job_script(tmp_path, "stepper.py", STEPPER)
    r = cddp("up", str(inv), str(script), "--runs-dir", str(runs), "--detach", "--", str(stop), check_rc=0)
    run_id = run_id_of(r.stdout)
    try:
        assert eventually(lambda: all("step 5 " in node_log(bed, n, run_id) for n in bed.nodes), 120), \
            [node_log(bed, n, run_id)[-300:] for n in bed.nodes]
        # looks 3 s apart: 30 steps per rank at 10/s, so a loaded machine still shows progress between them
        one = cddp("top", run_id[:12], "--once", "--json", "--interval", "3", "--runs-dir", str(runs), check_rc=0)
        every = cddp("top", "--once", "--json", "--interval", "3", "--runs-dir", str(runs), check_rc=0)
        table = cddp("top", run_id, "--once", "--runs-dir", str(runs), check_rc=0)
    finally:
        stop.touch()
    for out in (one.stdout, every.stdout):
        snap = json.loads(out)
        assert [run["run_id"] for run in snap["runs"]] == [run_id], out
        nodes = snap["runs"][0]["nodes"]
        assert [(n["host"], n["node_rank"]) for n in nodes] == [("node1", 0), ("node2", 1)]
        for n in nodes:
            assert n["state"] == "running" and n["error"] is None, n
            assert n["last_line"].startswith("rank ") and "\x1b[2J" in n["last_line"], n  # JSON keeps the bytes
            assert n["step"] >= 5 and n["steps_per_sec"] > 0, n  # two looks, 3 s apart
            assert n["procs"] >= 3, n  # launch.sh, torchrun and 2 workers, found by the run's marker
            assert n["cpu_percent"] is not None and n["rss_bytes"] > 0, n
            assert n["node_mem_total_bytes"] > n["node_mem_used_bytes"] > 0, n
            assert n["gpus"] is None, n  # no nvidia-smi on the test bed
            # no stall timeout: since the log's last write, on the node's clock; it prints 10 lines a second
            assert n["progress_from"] == "log" and 0 <= n["since_progress"] < 30 and not n["stalled"], n
    # the table shows the escape sequence a node printed as text, never obeys it
    assert "\x1b" not in table.stdout and "\\x1b[2J" in table.stdout, table.stdout
    assert "node1" in table.stdout and "node2" in table.stdout and "running" in table.stdout
    assert eventually(lambda: record(runs, run_id)["status"] != "running" or not job_pids(run_id), 60)


def test_a_local_rank_script_gets_its_rank_on_2_nodes_x_2_processes(bed, tmp_path):
    runs = tmp_path / "runs"
    inv = bed.write_inventory(tmp_path / "inv.yaml")
    script = job_script(tmp_path, "distributed.py", LOCAL_RANK)
    r = cddp("up", str(inv), str(script), "--runs-dir", str(runs), "--local-rank-arg=--local_rank",
             "--", "--epochs", "3", "a b", "$HOME", check_rc=0)
    seen = [(line.partition("]")[0].strip("[ "), json.loads(line.partition("LR ")[2]))
            for line in r.stdout.splitlines() if "] LR " in line]
    assert len(seen) == 4, r.stdout
    for host in ("node1", "node2"):
        assert sorted(p["local_rank"] for h, p in seen if h == host) == [0, 1], seen
    for _, p in seen:
        assert p["local_rank"] == int(p["env"]), p
        assert p["argv"] == [f"--local_rank={p['env']}", "--epochs", "3", "a b", "$HOME"], p  # before the user's
        assert p["epochs"] == 3 and p["rest"] == ["a b", "$HOME"], p
    assert "--local_rank" not in r.stderr  # the option is on: no warning

    # Without the option: a warning, and every rank gets the default (what torchrun alone gives).
    work = script.parent
    r = cddp("up", "local", "distributed.py", "--gpus", "2", "--runs-dir", str(runs), cwd=work, check_rc=0)
    assert "distributed.py:4 parses --local_rank" in r.stderr and "--local-rank-arg=--local_rank" in r.stderr
    assert sorted(json.loads(line.partition("LR ")[2])["local_rank"]
                  for line in r.stdout.splitlines() if "] LR " in line) == [-1, -1], r.stdout
    # A local run, in the other spelling.
    r = cddp("up", "local", "distributed.py", "--gpus", "2", "--runs-dir", str(runs), "--local-rank-arg", "local-rank",
             cwd=work, check_rc=0)
    got = [json.loads(line.partition("LR ")[2]) for line in r.stdout.splitlines() if "] LR " in line]
    assert sorted(p["local_rank"] for p in got) == [0, 1] and all(p["argv"][0].startswith("--local-rank=")
                                                                  for p in got), r.stdout


def test_a_hostfile_inventory_runs_and_exclude_leaves_hosts_out(bed, tmp_path):
    runs = tmp_path / "runs"
    common = (f"user=root identity_file={bed.identity_file} known_hosts={bed.known_hosts} python={sys.executable}")
    n1, n2 = bed.nodes
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# a DeepSpeed hostfile, with clusterddp's host fields\n\n"
                        f"node1 slots=1 address={n1.address} workdir={n1.workdir} {common}\n"
                        f"node2   slots=2 max_slots=4 address={n2.address} workdir={n2.workdir} {common}  # two\n")
    script = job_script(tmp_path, "distributed.py", LOCAL_RANK)
    r = cddp("up", str(hostfile), str(script), "--runs-dir", str(runs), "--exclude", "node1",
             "--local-rank-arg=--local_rank", check_rc=0)
    run_id = run_id_of(r.stdout)
    lines = [line for line in r.stdout.splitlines() if "] LR " in line]
    assert len(lines) == 2 and all(line.startswith("[node2]") for line in lines), r.stdout  # slots=2 on node2
    assert [n["host"] for n in record(runs, run_id)["nodes"]] == ["node2"]

    # Unknown names are refused, named, before anything starts; the same for exec and check.
    for verb in (["up", str(hostfile), str(script), "--runs-dir", str(runs)], ["exec", str(hostfile)],
                 ["check", str(hostfile)]):
        bad = cddp(*verb, "--exclude", "node1,gpu-9,gpu-7", *(["--", "true"] if verb[0] == "exec" else []),
                   check_rc=2)
        assert "--exclude names gpu-9, gpu-7, not in the inventory" in bad.stderr, bad.stderr
        assert "Traceback" not in bad.stderr
    ex = cddp("exec", str(hostfile), "--exclude", "node2", "--", "hostname", check_rc=0)
    assert ex.stdout.splitlines() == ["[node1] node1"], ex.stdout
