"""`clusterddp up local t.py --gpus 1` against bare `torchrun --standalone --nproc-per-node 1 t.py`.

t.py only initialises and destroys a gloo process group. Goal (issue 11): at most 1.0x of that
bare torchrun, what a user types by hand. A third command, torchrun with the static rendezvous
flags `up local` itself passes (`--nnodes 1 --node-rank 0 --master-addr 127.0.0.1 --master-port P`),
isolates the launcher's own overhead (CLI start, plan, run record, detached start, log following,
collect) from the rendezvous it chose. Rounds interleave the three; medians.

    python bench/up_local.py [--rounds 9]
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import interleave, run  # noqa: E402
from clusterddp.backends.ssh.launch import local_port  # noqa: E402

SCRIPT = """import torch.distributed as dist
dist.init_process_group("gloo")
dist.destroy_process_group()
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        Path(d, "t.py").write_text(SCRIPT)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        clusterddp = [sys.executable, "-m", "clusterddp", "up", "local", "t.py", "--gpus", "1", "--runs-dir", "runs"]
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", "t.py"]

        def static() -> None:  # on a free port, found as `up local` finds it
            run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--node-rank", "0", "--master-addr",
                 "127.0.0.1", "--master-port", str(local_port(None)), "--nproc-per-node", "1", "t.py"], cwd=d, env=env)
        run(torchrun, cwd=d, env=env)  # warm the page cache for torch
        # torch's bytecode was compiled when it was installed; clusterddp's, in an editable checkout
        # under PYTHONDONTWRITEBYTECODE=1 (set on the team's machines), would be compiled again at
        # every start (0.05 s of CPU, 2026-11-30). An installed clusterddp has it, as does a checkout
        # after its first run without that variable.
        spec = importlib.util.find_spec("clusterddp")
        assert spec is not None and spec.origin is not None
        compileall.compile_dir(str(Path(spec.origin).parent), quiet=1)
        run(clusterddp, cwd=d, env=env)
        print(f"load average before: {os.getloadavg()[0]:.1f}")
        interleave({"torchrun --standalone": lambda: run(torchrun, cwd=d, env=env),
                    "clusterddp up local": lambda: run(clusterddp, cwd=d, env=env),
                    "torchrun, static rendezvous": static}, args.rounds)
        print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
