"""`clusterddp collect` of a 256 MiB checkpoint from a test-bed node, against `scp` of the same file.

Starts a one-node network-namespace test bed (root needed), runs a job that writes the file,
then alternately deletes the local copy and fetches it both ways. Also times a re-collect of a
run whose artifacts are already whole. Goal: collect <= 1.3x scp.

    python bench/collect_speed.py [--rounds 5] [--mib 256]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from _common import STOCK_BASHRC, interleave, run, timed  # noqa: E402
from testbed import TestBed, session_slot  # noqa: E402

WRITER = """import os
if os.environ["RANK"] == "0":
    os.makedirs("checkpoints", exist_ok=True)
    with open("checkpoints/big.pt", "wb") as f:
        for _ in range({mib}):
            f.write(os.urandom(1 << 20))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--node-bashrc", choices=["stock", "machine"], default="stock",
                    help="the node's ~/.bashrc: a stock one (default) or this machine's own")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="cddp-bench-"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cli = [sys.executable, "-m", "clusterddp"]
    try:
        with TestBed(1, root / "bed", prefix=f"cd{session_slot()}c", subnet=f"10.{100 + session_slot()}.251",
                     login_rc=STOCK_BASHRC if args.node_bashrc == "stock" else None) as bed:
            node = bed.nodes[0]
            (root / "job").mkdir()
            (root / "job" / "w.py").write_text(WRITER.format(mib=args.mib))
            inv = bed.write_inventory(root / "inv.yaml", extra={"collect": ["checkpoints/**"]})
            runs = root / "runs"
            out = subprocess.run(cli + ["up", str(inv), str(root / "job" / "w.py"), "--gpus", "1",
                                        "--runs-dir", str(runs)], env=env, capture_output=True, text=True, check=True)
            run_id = out.stdout.split()[1]
            remote = Path(node.workdir) / "runs" / run_id / "checkpoints" / "big.pt"
            local = runs / run_id / "artifacts" / node.name / "checkpoints" / "big.pt"
            scp_dest = root / "scp.pt"
            scp = ["scp", "-q", "-i", str(bed.identity_file), "-o", f"UserKnownHostsFile={bed.known_hosts}",
                   "-o", "StrictHostKeyChecking=yes", f"root@{node.address}:{remote}", str(scp_dest)]

            def clean() -> None:
                local.unlink(missing_ok=True)
                scp_dest.unlink(missing_ok=True)
            print(f"file: {args.mib} MiB; rounds: {args.rounds}; node ~/.bashrc: {args.node_bashrc}")
            interleave({"scp": lambda: run(scp),
                        "clusterddp collect": lambda: run(cli + ["collect", run_id, "--runs-dir", str(runs)], env=env)},
                       args.rounds, before_each=clean)
            run(cli + ["collect", run_id, "--runs-dir", str(runs)], env=env)
            assert local.read_bytes() == remote.read_bytes()
            t = timed(lambda: run(cli + ["collect", run_id, "--runs-dir", str(runs)], env=env))
            print(f"re-collect of a whole run: {t:.2f}s (no download)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
