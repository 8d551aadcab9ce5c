"""`clusterddp up` whose nodes' environment is ready (`packages:`, unchanged lock) against `python:` naming
that same ready venv: what the environment step costs a run once nothing is to be sent or built.

Starts a two-node network-namespace test bed (tests/testbed.py; root needed), makes a bare base Python
(no torch), builds the environment of a torch lock once (`clusterddp env build`: the CPU torch wheel is
sent to both nodes), then times, interleaved round by round, a 1-step gloo job:

  python: venv    the inventory's `python:` is the environment's own python (no `packages:`)
  packages:       `packages: requirements.txt` (one look per node finds the environment ready)

Goal (issue 42): packages: <= 1.02x python: venv.

  packages: (DIR) with --before DIR: the same, with the clusterddp of another checkout (e.g. the commit before a
                  change: `git worktree add /tmp/before <commit>`), interleaved in the same rounds

    python bench/envs_up.py [--rounds 5] [--cache DIR] [--before DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "envs"), str(REPO / "bench")]

from _common import STOCK_BASHRC, interleave  # noqa: E402
from envbed import TORCH_LOCK  # noqa: E402
from testbed import TestBed, session_slot  # noqa: E402
from tinywheel import make_wheel  # noqa: E402

JOB = """import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
dist.destroy_process_group()
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cache", help="the launcher's wheel cache (default: a fresh one)")
    ap.add_argument("--before", help="a checkout whose clusterddp runs a third variant, packages: (DIR)")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-envs-"))
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "base")], check=True)
    make_wheel(root / "wheels")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CLUSTERDDP_CACHE": a.cache or str(root / "cache"),
           "PIP_FIND_LINKS": " ".join(x for x in (os.environ.get("PIP_FIND_LINKS", ""), str(root / "wheels")) if x)}
    (root / "requirements.txt").write_text(TORCH_LOCK)
    (root / "job").mkdir()
    (root / "job" / "t.py").write_text(JOB)
    slot = session_slot()
    with TestBed(2, root / "bed", prefix=f"cd{slot}s", subnet=f"10.{100 + slot}.0", login_rc=STOCK_BASHRC) as bed:
        def inventory(name: str, **defaults: str) -> Path:
            inv = bed.write_inventory(root / name, defaults_extra=defaults)
            doc = yaml.safe_load(inv.read_text())
            for i, h in enumerate(doc["hosts"]):
                h["workdir"] = str(root / f"node{i}")
            inv.write_text(yaml.safe_dump(doc, sort_keys=False))
            return inv
        locked = inventory("locked.yaml", python=str(root / "base" / "bin" / "python"), packages="requirements.txt")
        built = subprocess.run([sys.executable, "-m", "clusterddp", "env", "build", str(locked)], env=env,
                               capture_output=True, text=True, check=True)
        print(built.stdout.strip())
        env_python = built.stdout.split(": ", 2)[2].split(" (sent")[0]
        plain = inventory("plain.yaml", python=env_python)

        def up(inv: Path, before: str | None = None) -> None:
            subprocess.run([sys.executable, "-m", "clusterddp", "up", str(inv), str(root / "job" / "t.py"),
                            "--runs-dir", str(root / "runs"), "--gpus", "1", "-q"],
                           env={**env, "PYTHONPATH": before} if before else env, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        variants = {"python: venv": lambda: up(plain), "packages:": lambda: up(locked)}
        if a.before:
            variants[f"packages: ({a.before})"] = lambda: up(locked, a.before)
        interleave(variants, a.rounds)
    subprocess.run(["rm", "-rf", str(root)], check=False)


if __name__ == "__main__":
    main()
