"""Submit-to-first-step on Slurm: `clusterddp up` with a `slurm:` inventory, against a hand-written
sbatch script that runs the same torchrun (srun, one task per node, c10d on the first host).

Starts the Slurm test bed (tests/slurmbed.py: two namespace nodes, root needed). Each round runs
both, alternately; the time measured is from the command's start to the moment rank 0 of the
training script starts (it writes time.time() to a file), so what clusterddp adds before the job
(planning, staging the folder, sbatch, the node script's probes) is what is compared. Goal: <= 1.1x.

    python bench/slurm_submit.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "tests"))
from slurmbed import SlurmBed  # noqa: E402
from testbed import TestBed, session_slot  # noqa: E402

SCRIPT = """import os, sys, time
if os.environ.get("RANK") == "0":
    with open(sys.argv[1], "w") as f:
        f.write(repr(time.time()))
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
"""

# What a user would write by hand: the same srun + torchrun (c10d on the first host's address; is_host
# and --local-addr because the nodes' names do not resolve, as clusterddp's node script does).
HAND = """#!/usr/bin/env bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --partition=main
#SBATCH --output={out}
master=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
addr=$(scontrol show node "$master" | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')
srun bash -c 'export GLOO_SOCKET_IFNAME=eth0; h=0; [ "$SLURMD_NODENAME" = '"$master"' ] && h=1
  cd {job} && exec {py} -m torch.distributed.run --nnodes 2 --rdzv-conf is_host=$h \\
  --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint '"$addr"':29400 --rdzv-id "$SLURM_JOB_ID" \\
  --local-addr $(ip -o -4 addr show dev eth0 | awk "NR==1{{split(\\$4, a, \\"/\\"); print a[1]}}") t.py {mark}'
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    slot = session_slot()
    root = Path(tempfile.mkdtemp(prefix="cddp-bench-slurm-"))
    job = root / "job"
    job.mkdir()
    (job / "t.py").write_text(SCRIPT)
    with TestBed(2, root / "bed", prefix=f"cd{slot}m", subnet=f"10.{100 + slot}.250") as bed, \
            SlurmBed(bed, slot) as slurm:
        env = {**__import__("os").environ, **slurm.env(), "OMP_NUM_THREADS": "1"}
        inv = root / "cluster.yaml"
        inv.write_text(f"slurm:\n  partition: main\n  nodes: 2\n  gpus_per_node: 2\n  request_gpus: false\n"
                       f"  shared_dir: {root / 'shared'}\n  python: {sys.executable}\n")
        mark = root / "mark"

        def first_step(cmd: list[str]) -> float:
            mark.unlink(missing_ok=True)
            t0 = time.time()
            subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           cwd=root)
            return float(mark.read_text()) - t0

        hand = root / "hand.sbatch"
        hand.write_text(HAND.format(out=root / "hand.log", job=job, py=sys.executable, mark=mark))
        ours = [sys.executable, "-m", "clusterddp", "up", str(inv), str(job / "t.py"), "--runs-dir",
                str(root / "runs"), "--", str(mark)]
        a, b = [], []
        for _ in range(args.rounds):
            a.append(first_step(ours))
            b.append(first_step(["sbatch", "--wait", str(hand)]))
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"clusterddp up (slurm): median {ma:.2f}s  (runs: {', '.join(f'{x:.2f}' for x in a)})")
        print(f"hand-written sbatch:   median {mb:.2f}s  (runs: {', '.join(f'{x:.2f}' for x in b)})")
        print(f"ratio: {ma / mb:.3f}")


if __name__ == "__main__":
    main()
