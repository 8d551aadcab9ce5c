"""bench/gpu_check.sh refuses cleanly where there is no GPU (exit 2 and why), as on this machine; its step 4
(the flight recorder) parses, its Python compiles, and its verifier passes and fails the runs it should."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

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


# ---- step 4 (the flight recorder), as far as a machine without a GPU can check it ----

def heredocs() -> list[str]:
    """The Python the script writes or runs (its ``<<'PY'`` blocks), in order."""
    text = (REPO / "bench" / "gpu_check.sh").read_text()
    return [block.split("\nPY\n", 1)[0] for block in text.split("<<'PY'")[1:]]


def test_the_script_parses_and_its_python_compiles():
    subprocess.run(["bash", "-n", str(REPO / "bench" / "gpu_check.sh")], check=True, timeout=60)
    blocks = heredocs()
    assert len(blocks) == 3  # the all_reduce job, the flight job, the flight verifier
    for i, block in enumerate(blocks):
        compile(block.split("\n", 1)[1], f"gpu_check.sh heredoc {i}", "exec")


def verify(tmp_path: Path, n: int, code: int, flight: dict | None,
           dumps: dict[str, bytes]) -> subprocess.CompletedProcess:
    """Step 4's verifier on a run folder made here (what `up local` leaves of the GPU job)."""
    run = tmp_path / "runs" / "20261202-000000-abcd"
    (run / "flight" / "local").mkdir(parents=True)
    for name, data in dumps.items():
        (run / "flight" / "local" / name).write_bytes(data)
    (run / "run.json").write_text(json.dumps({"failure": {"flight": flight} if flight else {}}))
    return subprocess.run([sys.executable, "-", str(tmp_path / "runs"), str(n), str(code)], input=heredocs()[2].split(
        "\n", 1)[1], capture_output=True, text=True, timeout=120, cwd=REPO)


def nccl_dump(*entries: tuple[int, str]) -> bytes:
    import pickle
    return pickle.dumps({"version": "2.10", "entries": [
        {"record_id": i, "collective_seq_id": seq, "is_p2p": False, "state": state, "profiling_name": "nccl:all_reduce",
         "process_group": ("0", "default_pg")} for i, (seq, state) in enumerate(entries)]})


def test_the_flight_verifier_passes_a_named_skipping_rank_and_fails_what_is_not(tmp_path):
    from clusterddp import flight
    dumps = {"rank0": nccl_dump((1, "completed"), (2, "scheduled")), "rank1": nccl_dump((1, "completed"))}
    got = flight.read([("local", int(k[4:]), v, "") for k, v in dumps.items()])
    assert got is not None
    ok = verify(tmp_path / "a", 2, 1, got.to_json(), dumps)
    assert ok.returncode == 0 and "flight recorder check: ok" in ok.stdout, ok
    one = flight.read([("local", 0, dumps["rank0"], "")])
    assert one is not None
    assert verify(tmp_path / "b", 1, 1, one.to_json(), {"rank0": dumps["rank0"]}).returncode == 0
    bad = verify(tmp_path / "c", 2, 0, {**got.to_json(), "behind": []}, {"rank0": b"junk"})
    assert bad.returncode == 1 and bad.stdout.count("FAIL:") == 3, bad  # exit 0, rank0 unread, nobody named
    assert verify(tmp_path / "d", 2, 1, None, {}).returncode == 1
