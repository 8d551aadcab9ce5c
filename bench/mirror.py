"""What the checkpoint mirror costs a run: `clusterddp up` of a training job on 2 test-bed nodes (gloo,
1 process each) that saves a 256 MiB checkpoint (``clusterddp.train.save_checkpoint``) every 30 s,
with the mirror (its default interval, 10 s) against the same run without it
(``CLUSTERDDP_MIRROR_INTERVAL=0``), in interleaved rounds. Goal (issue 26): slowed by less than 5%.

The job trains for a fixed time and counts its steps (each a forward, backward and all_reduce of a
small model, a few ms of CPU), so the cost shows as steps lost: the ratio is steps without the
mirror / steps with it (1.0x: no cost; 1.05x: 5% slower). Each run's checkpoint saves are part of
both. The node and this launcher share the same cores on the test bed, so the mirror's receiving end
(paramiko's decryption, the sha256 here) takes CPU from the job too: on separate machines it costs
the job less. Root needed (network namespaces).

On a machine other work loads, steps vary more between rounds than the mirror costs, so the CPU the
mirror takes is counted too, which load does not change: this launcher's (the `up` process) and the
nodes' (the CPU of every SSH session's processes, reaped into each node's sshd listener; the job
itself runs detached and is not in it), with the mirror minus without it, as a share of the CPU the
run had (2 nodes x 1 process for its length): the slowdown it can cause where it competes with the
job for every core, as on this bed.

    python bench/mirror.py [--rounds 3] [--seconds 95] [--every 30] [--mib 256] [--plain]

``--plain``: rank 0 saves with a plain ``torch.save`` of ``snapshot.pt``, overwritten in place (the PyTorch
DDP tutorial's way), which the default checkpoint rule takes (issue 39).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from _common import STOCK_BASHRC  # noqa: E402
from testbed import TestBed, session_slot  # noqa: E402

JOB = """import sys, time
import torch
import torch.distributed as dist
from clusterddp import train

seconds, every, mib = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
plain = sys.argv[4:] == ["plain"]  # as the PyTorch DDP tutorial: rank 0 torch.saves snapshot.pt in place
ctx = train.init()
torch.manual_seed(0)
model = train.wrap(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
state = torch.zeros(mib << 18)  # the rest of a 256 MiB checkpoint (optimizer state, buffers...)
x, y = torch.randn(64, 256), torch.randn(64, 1)
start = last = time.monotonic()
steps = saves = 0
save_s = 0.0
flag = torch.zeros(2)
while True:
    if steps % 20 == 0:  # rank 0's clock decides for every rank: stop, or checkpoint now
        now = time.monotonic()
        flag[0], flag[1] = float(now - start >= seconds), float(now - last >= every)
        dist.broadcast(flag, src=0)
        if flag[0]:
            break
        if flag[1]:
            t = time.monotonic()
            if not plain:
                train.save_checkpoint({"model": train.unwrap(model).state_dict(), "state": state}, steps, keep=2)
            elif dist.get_rank() == 0:
                torch.save({"model": train.unwrap(model).state_dict(), "state": state, "step": steps}, "snapshot.pt")
            save_s += time.monotonic() - t
            saves += 1
            last = time.monotonic()
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    steps += 1
train.print0(f"bench: steps={steps} saves={saves} save_s={save_s:.2f} seconds={time.monotonic() - start:.2f}")
del model, opt
train.cleanup(barrier=True)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=95.0, help="training time of each run")
    ap.add_argument("--every", type=float, default=30.0, help="seconds between checkpoints")
    ap.add_argument("--mib", type=int, default=256, help="checkpoint size")
    ap.add_argument("--plain", action="store_true", help="a plain torch.save of snapshot.pt, overwritten in place "
                    "by rank 0 (the default checkpoint rule takes it), instead of clusterddp.train.save_checkpoint")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="cddp-bench-mirror-"))
    cli = [sys.executable, "-m", "clusterddp"]
    steps: dict[str, list[int]] = {"without mirror": [], "with mirror": []}
    cpu: dict[str, list[float]] = {k: [] for k in steps}
    nodes_cpu: dict[str, list[float]] = {k: [] for k in steps}
    try:
        with TestBed(2, root / "bed", prefix=f"cd{session_slot()}m", subnet=f"10.{100 + session_slot()}.252",
                     login_rc=STOCK_BASHRC) as bed:
            (root / "job").mkdir()
            (root / "job" / "train.py").write_text(JOB)
            inv = bed.write_inventory(root / "inv.yaml", defaults_extra={"gpus": 1})
            runs = root / "runs"
            print(f"checkpoint: {args.mib} MiB every {args.every:g}s"
                  f"{' (plain torch.save of snapshot.pt, in place)' if args.plain else ''}; runs of {args.seconds:g}s; "
                  f"2 nodes x 1 process; rounds: {args.rounds}; load {os.getloadavg()[0]:.1f}")
            for r in range(args.rounds):
                for name, interval in (("without mirror", "0"), ("with mirror", "")):
                    env = {**os.environ, "OMP_NUM_THREADS": "1", "CLUSTERDDP_MIRROR_INTERVAL": interval}
                    n0 = sshd_cpu(bed)
                    t0 = os.times()
                    out = subprocess.run(cli + ["up", str(inv), str(root / "job" / "train.py"), "--runs-dir",
                                                str(runs), "-q", "--", str(args.seconds), str(args.every),
                                                str(args.mib), *(["plain"] if args.plain else [])],
                                         env=env, capture_output=True, text=True)
                    t1 = os.times()
                    time.sleep(1)  # the run's SSH sessions reaped
                    n1 = sshd_cpu(bed)
                    if out.returncode != 0:
                        raise SystemExit(f"{name}: up failed:\n{out.stdout}\n{out.stderr}")
                    m = re.search(r"bench: steps=(\d+) saves=(\d+) save_s=([\d.]+)", out.stdout)
                    assert m, out.stdout
                    run_id = out.stdout.split()[1]
                    mirrored = ""
                    index = runs / run_id / "mirror.json"
                    if index.exists():
                        held = json.loads(index.read_text())["checkpoints"]
                        mirrored = "; mirrored: " + ", ".join(f["path"] for h in held for f in h["files"])
                    elif interval == "":
                        mirrored = "; mirrored: NOTHING"
                    launcher = (t1.children_user + t1.children_system) - (t0.children_user + t0.children_system)
                    steps[name].append(int(m.group(1)))
                    cpu[name].append(launcher)
                    nodes_cpu[name].append(n1 - n0)
                    print(f"round {r + 1} {name}: {m.group(1)} steps, {m.group(2)} saves ({m.group(3)} s), "
                          f"launcher {launcher:.1f} CPU-s, nodes' SSH sessions {n1 - n0:.1f} CPU-s{mirrored}; "
                          f"load {os.getloadavg()[0]:.1f}", flush=True)
                    shutil.rmtree(runs / run_id, ignore_errors=True)
                    for node in bed.nodes:
                        shutil.rmtree(Path(node.workdir) / "runs" / run_id, ignore_errors=True)
                    time.sleep(2)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base, mirrored = statistics.median(steps["without mirror"]), statistics.median(steps["with mirror"])
    print(f"steps, median: without mirror {base:.0f}, with mirror {mirrored:.0f}: "
          f"slowdown {base / mirrored:.3f}x (per round: "
          + ", ".join(f"{a / b:.3f}x" for a, b in zip(steps["without mirror"], steps["with mirror"], strict=True))
          + f"); launcher CPU-s, median: {statistics.median(cpu['without mirror']):.1f} vs "
          f"{statistics.median(cpu['with mirror']):.1f}")
    extra = (statistics.median(cpu["with mirror"]) + statistics.median(nodes_cpu["with mirror"])
             - statistics.median(cpu["without mirror"]) - statistics.median(nodes_cpu["without mirror"]))
    had = 2 * args.seconds
    print(f"the mirror's CPU (launcher + nodes' sessions, with minus without): {extra:.1f} CPU-s of the run's "
          f"{had:.0f} (2 processes x {args.seconds:g}s): {100 * extra / had:.1f}% -> "
          f"{had / max(had - extra, 1e-9):.3f}x where it competes with the job for every core")


def sshd_cpu(bed: TestBed) -> float:
    """CPU-s of the finished SSH sessions of every node (their processes, reaped into each listener)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for proc in bed._sshd.values():
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[13]) + int(fields[14])) / tick  # cutime, cstime
    return total


if __name__ == "__main__":
    main()
