"""`clusterddp collect` from a test-bed node, against `scp` (and `tar | ssh`) of the same files.

Starts a one-node network-namespace test bed (root needed), runs a job that writes the files, then,
in interleaved rounds (who goes first alternates), deletes the local copies and fetches them each
way. Two cases, both by default:

  one large file     a 256 MiB checkpoint (``--mib``): `collect` against `scp`
  many small files   1,000 files of 64 KiB (``--files``, ``--kib``): `collect` against `scp -r`
                     of their folder and `ssh NODE tar -c ... | tar -x`

Also times a re-collect of a run whose artifacts are already whole, and reports, for each command,
the CPU of this machine's side (the launcher, or scp/ssh/tar) and of the node's side (its sshd's
sessions), with the load average. `--floor` adds what collect does and scp does not, measured on
their own: a sha256 of the large file (collect hashes it once on each end, to verify the copy), and
the launcher's start (python and the imports a collect needs). Goal (issue 45): collect <= 1.0x scp.

clusterddp is byte-compiled first, as an installed copy is (an editable checkout under
PYTHONDONTWRITEBYTECODE=1 compiles every module at each start, about 0.09 s of every run here).

    python bench/collect_speed.py [--rounds 7] [--mib 256] [--files 1000] [--kib 64] [--only large|small] [--floor]
"""

from __future__ import annotations

import argparse
import compileall
import hashlib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from _common import STOCK_BASHRC, run, timed  # noqa: E402
from testbed import TestBed, session_slot  # noqa: E402
from up_ssh import sshd_children_cpu  # noqa: E402

WRITER = """import os
if os.environ["RANK"] == "0":
    os.makedirs("checkpoints", exist_ok=True)
    with open("checkpoints/big.pt", "wb") as f:
        for _ in range({mib}):
            f.write(os.urandom(1 << 20))
    os.makedirs("shards", exist_ok=True)
    for i in range({files}):
        with open("shards/s%05d.bin" % i, "wb") as f:
            f.write(os.urandom({kib} << 10))
"""


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def rounds_of(tools: dict[str, Callable[[], object]], rounds: int, clean: Callable[[], object],
              bed: TestBed) -> dict[str, list[tuple[float, float, float]]]:
    """Every tool once per round (the order reversed every other round), ``clean`` untimed before each:
    (wall, this machine's CPU, the node's sshd sessions' CPU) of each run."""
    out: dict[str, list[tuple[float, float, float]]] = {k: [] for k in tools}
    for f in tools.values():  # warm up: page cache, sshd's first fork
        clean()
        f()
    for i in range(rounds):
        for k in (list(tools) if i % 2 == 0 else list(tools)[::-1]):
            clean()
            c0, n0 = children_cpu(), sshd_children_cpu(bed)
            t = timed(tools[k])
            c1 = children_cpu()
            deadline = time.monotonic() + 3  # the node's sshd reaps its session a moment after the client left
            n1 = sshd_children_cpu(bed)
            while time.monotonic() < deadline:
                time.sleep(0.1)
                again = sshd_children_cpu(bed)
                if again == n1 and again > n0:
                    break
                n1 = again
            out[k].append((t, c1 - c0, n1 - n0))
    return out


def report(title: str, res: dict[str, list[tuple[float, float, float]]], loads: tuple[float, float]) -> None:
    base = next(iter(res))
    med = {k: statistics.median(x[0] for x in v) for k, v in res.items()}
    print(f"\n{title} (load average before {loads[0]:.1f}, after {loads[1]:.1f}; {os.cpu_count()} cores)")
    print(f"| command | median | ratio to {base} | per-round ratio (median) | CPU here | CPU on the node | runs |")
    print("|---|---|---|---|---|---|---|")
    for k, v in res.items():
        per = statistics.median(x[0] / y[0] for x, y in zip(v, res[base], strict=True))
        print(f"| {k} | {med[k]:.3f} s | **{med[k] / med[base]:.3f}x** | {per:.3f} | "
              f"{statistics.median(x[1] for x in v):.2f} s | {statistics.median(x[2] for x in v):.2f} s | "
              f"{', '.join(f'{x[0]:.2f}' for x in v)} |")


def floor(path: Path, env: dict) -> None:
    """What collect adds to scp's work, each part measured alone (least of 5: load only adds)."""
    def least(fn: Callable[[], object]) -> float:
        best = float("inf")
        for _ in range(5):
            t = time.process_time()
            fn()
            best = min(best, time.process_time() - t)
        return best

    def sha() -> None:
        h, buf = hashlib.sha256(), memoryview(bytearray(1 << 20))
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                h.update(buf[:n])

    def start() -> None:
        subprocess.run([sys.executable, "-c", "import clusterddp.cli.app, clusterddp.cli.collect, "
                        "clusterddp.transport.ssh, clusterddp.artifacts"], env=env, check=True)
    size = path.stat().st_size >> 20
    print(f"\nwhat collect does that scp does not, CPU seconds (least of 5; load {os.getloadavg()[0]:.1f}):")
    print(f"  sha256 of the {size} MiB file, read from the page cache: {least(sha):.3f} (collect does it on each end)")
    c = float("inf")
    for _ in range(5):
        c0 = children_cpu()
        start()
        c = min(c, children_cpu() - c0)
    print(f"  the launcher's start (python, the CLI, paramiko and Fabric, the collect modules): {c:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--mib", type=int, default=256, help="the large file's size")
    ap.add_argument("--files", type=int, default=1000, help="how many small files")
    ap.add_argument("--kib", type=int, default=64, help="each small file's size")
    ap.add_argument("--only", choices=["large", "small"], help="one case only")
    ap.add_argument("--floor", action="store_true", help="also measure the hash and the launcher's start alone")
    ap.add_argument("--node-bashrc", choices=["stock", "machine"], default="stock",
                    help="the node's ~/.bashrc: a stock one (default) or this machine's own")
    args = ap.parse_args()
    compileall.compile_dir(str(HERE.parent / "clusterddp"), quiet=1)
    root = Path(tempfile.mkdtemp(prefix="cddp-bench-"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "XDG_STATE_HOME": str(root / "state")}  # not this machine's quarantine
    cli = [sys.executable, "-m", "clusterddp"]
    try:
        with TestBed(1, root / "bed", prefix=f"cd{session_slot()}c", subnet=f"10.{100 + session_slot()}.251",
                     login_rc=STOCK_BASHRC if args.node_bashrc == "stock" else None) as bed:
            node = bed.nodes[0]
            (root / "job").mkdir()
            small = 0 if args.only == "large" else args.files
            mib = 0 if args.only == "small" else args.mib
            (root / "job" / "w.py").write_text(WRITER.format(mib=mib, files=small, kib=args.kib))
            runs = root / "runs"
            invs = {what: bed.write_inventory(root / f"inv-{what}.yaml", extra={"collect": [glob]})
                    for what, glob in (("large", "checkpoints/**"), ("small", "shards/**"))}
            out = subprocess.run(cli + ["up", str(invs["large"]), str(root / "job" / "w.py"), "--gpus", "1",
                                        "--runs-dir", str(runs)], env=env, capture_output=True, text=True, check=True)
            run_id = out.stdout.split()[1]
            remote = Path(node.workdir) / "runs" / run_id
            arts = runs / run_id / "artifacts" / node.name
            ssh = ["-i", str(bed.identity_file), "-o", f"UserKnownHostsFile={bed.known_hosts}",
                   "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"]
            dest = root / "copy"
            where = f"root@{node.address}"

            def clean() -> None:
                shutil.rmtree(arts, ignore_errors=True)
                shutil.rmtree(dest, ignore_errors=True)
                dest.mkdir()
            collect = cli + ["collect", run_id, "--runs-dir", str(runs)]
            print(f"rounds: {args.rounds}; node ~/.bashrc: {args.node_bashrc}; clusterddp byte-compiled")
            if args.only != "small":
                l0 = os.getloadavg()[0]
                res = rounds_of({"scp": lambda: run(["scp", "-q", *ssh, f"{where}:{remote}/checkpoints/big.pt",
                                                     str(dest / "big.pt")]),
                                 "clusterddp collect": lambda: run(collect, env=env)}, args.rounds, clean, bed)
                report(f"one file of {args.mib} MiB", res, (l0, os.getloadavg()[0]))
                big = "checkpoints/big.pt"
                assert (arts / big).read_bytes() == (remote / big).read_bytes()
            if args.only != "large":
                # collect's default (no --glob) is the inventory's globs: the small files' inventory
                small_collect = cli + ["collect", run_id, "--runs-dir", str(runs), "--glob", "shards/**"]
                tar = (f"ssh {' '.join(ssh)} {where} tar -C {remote} -cf - shards | tar -C {dest} -xf -")
                l0 = os.getloadavg()[0]
                res = rounds_of({"scp -r": lambda: run(["scp", "-q", "-r", *ssh, f"{where}:{remote}/shards",
                                                        str(dest)]),
                                 "tar | ssh": lambda: run(["bash", "-o", "pipefail", "-c", tar]),
                                 "clusterddp collect": lambda: run(small_collect, env=env)}, args.rounds, clean, bed)
                report(f"{args.files} files of {args.kib} KiB", res, (l0, os.getloadavg()[0]))
                got = sorted(p.name for p in (arts / "shards").iterdir())
                assert len(got) == args.files, f"{len(got)} of {args.files} small files collected"
            clean()
            run(collect, env=env)
            t = timed(lambda: run(collect, env=env))
            print(f"\nre-collect of a whole run: {t:.2f}s (no download; load {os.getloadavg()[0]:.1f})")
            if args.floor and args.only != "small":
                floor(remote / "checkpoints" / "big.pt", env)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
