"""`clusterddp up local t.py --gpus 1` against bare `torchrun --standalone --nproc-per-node 1 t.py`.

t.py only initialises and destroys a gloo process group, so the figure is the launcher's own
overhead (CLI start, plan, run record, detached start, log following, collect). Goal: within 15%.

    python bench/up_local.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import compare, run  # noqa: E402

SCRIPT = """import torch.distributed as dist
dist.init_process_group("gloo")
dist.destroy_process_group()
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        Path(d, "t.py").write_text(SCRIPT)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        clusterddp = [sys.executable, "-m", "clusterddp", "up", "local", "t.py", "--gpus", "1", "--runs-dir", "runs"]
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", "t.py"]
        run(torchrun, cwd=d, env=env)  # warm the page cache for torch
        compare("clusterddp up local", lambda: run(clusterddp, cwd=d, env=env),
                "torchrun", lambda: run(torchrun, cwd=d, env=env), args.rounds)


if __name__ == "__main__":
    main()
