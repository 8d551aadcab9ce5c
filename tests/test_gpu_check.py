"""bench/gpu_check.sh refuses cleanly where there is no GPU (exit 2 and why), as on this machine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from helpers import REPO


def gpu_check(path: str) -> subprocess.CompletedProcess:
    # A session of its own: should the script not refuse (a regression), its benchmark is ended with it.
    p = subprocess.Popen(["bash", str(REPO / "bench" / "gpu_check.sh")], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True,
                         env={**os.environ, "PATH": path, "PYTHON": sys.executable})
    try:
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None or p.returncode != 2:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.wait()
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def test_no_nvidia_smi_and_a_gpu_torch_cannot_see_are_refused_with_exit_2(tmp_path):
    r = gpu_check("/usr/bin:/bin")
    assert r.returncode == 2 and "no nvidia-smi on PATH" in r.stderr and r.stdout == "", r
    (tmp_path / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-x)'\n")
    (tmp_path / "nvidia-smi").chmod(0o755)
    r = gpu_check(f"{tmp_path}:/usr/bin:/bin")  # listed by nvidia-smi, but this torch is a CPU build
    assert r.returncode == 2 and "torch sees none" in r.stderr and r.stdout == "", r
