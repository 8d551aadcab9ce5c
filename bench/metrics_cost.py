"""What the metrics sampler costs a job (issue 43: below 1% of the job's CPU time).

The node program ``sampler`` runs as launch.sh runs it (``python -S $CTL/sampler/sampler.py CTL JSON``, the
watchdog's source beside it) beside a stand-in job: one process that keeps a CPU busy, as a training rank
does, and prints a ``step N loss X`` line ten times a second into node.log, which the sampler reads with a
metrics regex. A stand-in ``nvidia-smi`` (a shell script printing two GPUs' CSV) is first on PATH. After
``--seconds``, the job ends, then the sampler (SIGTERM, as launch.sh's EXIT trap does); each one's CPU time
(user + system, its children included: the nvidia-smi calls) comes from ``wait4``.

    python bench/metrics_cost.py [--seconds 60] [--interval 5]

A real nvidia-smi costs more CPU than the stand-in (it loads NVML: about 20-40 ms a call on a GPU node);
RESULTS-metrics.md adds that to the measured figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
JOB = r"""
import sys, time
end = time.monotonic() + float(sys.argv[1])
step, loss, nxt = 0, 3.0, 0.0
while time.monotonic() < end:
    x = 0
    for i in range(20000):  # busy, as a rank is
        x += i * i
    if time.monotonic() >= nxt:
        step += 1
        loss *= 0.999
        print("step %d loss %.5f" % (step, loss), flush=True)
        nxt = time.monotonic() + 0.1
"""
SMI = """#!/bin/sh
echo "0, 97, 30512, 81559, 312.45, 66, 1980, 0x0000000000000000"
echo "1, 95, 30400, 81559, 305.10, 64, 1980, 0x0000000000000000"
"""


def cpu(ru) -> float:
    return ru.ru_utime + ru.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--interval", type=float, default=5.0)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="metrics-cost-"))
    try:
        ctl, fake = tmp / "ctl", tmp / "bin"
        (ctl / "sampler").mkdir(parents=True)
        fake.mkdir()
        for name in ("sampler", "watch"):
            shutil.copy(REPO / "clusterddp" / "node" / f"{name}.py", ctl / "sampler" / f"{name}.py")
        (fake / "nvidia-smi").write_text(SMI)
        os.chmod(fake / "nvidia-smi", 0o755)
        log = open(ctl / "node.log", "ab")
        env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "CLUSTERDDP_HOST": "bench"}
        args = {"interval": a.interval, "regex": r"loss (?P<loss>[0-9.]+)", "most": 2 << 20}
        sampler = subprocess.Popen([sys.executable, "-S", str(ctl / "sampler" / "sampler.py"), str(ctl),
                                    json.dumps(args)], stdout=log, stderr=subprocess.DEVNULL, env=env)
        job = subprocess.Popen([sys.executable, "-c", JOB, str(a.seconds)], stdout=log, env=env)
        _, _, job_ru = os.wait4(job.pid, 0)
        time.sleep(0.2)
        sampler.send_signal(signal.SIGTERM)
        _, _, s_ru = os.wait4(sampler.pid, 0)
        samples = sum(1 for _ in open(ctl / "metrics.jsonl")) - 1
        size = (ctl / "metrics.jsonl").stat().st_size
        print(f"{a.seconds:.0f} s, interval {a.interval:g} s: {samples} samples, {size} bytes")
        print(f"job CPU {cpu(job_ru):.2f} s; sampler CPU {cpu(s_ru):.3f} s "
              f"({100 * cpu(s_ru) / cpu(job_ru):.2f}% of the job's); "
              f"{1000 * cpu(s_ru) / max(samples, 1):.1f} ms a sample; "
              f"{100 * cpu(s_ru) / a.seconds:.2f}% of one busy CPU (a rank that keeps its CPU busy)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
