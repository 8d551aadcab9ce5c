"""Env values on nodes, for real: never on a process's command line, only in a 0600 launch.sh in
a 0700 control folder and in the job's environment, whatever the node's umask."""

from __future__ import annotations

import json
import secrets
import stat
from pathlib import Path

import pytest

from helpers import cddp_popen, eventually

pytestmark = pytest.mark.integration

# What a job writes: its env values, and a file of its own (whose mode shows the umask it ran with).
JOB = r'''
import json, os, sys, time
if os.environ["RANK"] == "0":
    with open("seen.json", "w") as f:
        json.dump({k: os.environ.get(k) for k in ("SECRET", "CLI_SECRET")}, f)
go = sys.argv[1]
while not os.path.exists(go):  # held, so the test can look at the node while the job runs
    time.sleep(0.05)
'''


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def command_lines(bed, node) -> dict[int, bytes]:
    """Every process of the node's namespace and its command line (a process gone meanwhile is skipped)."""
    out = {}
    for pid in bed.ns_pids(node):
        try:
            out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            pass
    return out


def scan_while(bed, node, seen: bytes, token: str) -> list[bytes]:
    """Once some process of the node has ``seen`` in its command line, every process's command
    line there; asserts none holds ``token``."""
    lines = eventually(lambda: (c := command_lines(bed, node)) and any(seen in v for v in c.values()) and c, 60)
    assert lines, f"no process on {node.name} ran {seen!r}"
    leaked = [v.replace(b"\0", b" ")[:200] for v in lines.values() if token.encode() in v]
    assert not leaked, f"an env value is on {len(leaked)} command line(s) on {node.name}: {leaked}"
    return list(lines.values())


def test_env_values_stay_off_command_lines_and_control_files_are_private(bed, tmp_path):
    node = bed.nodes[0]
    token = "tok-" + secrets.token_hex(8)
    value = token + " two words it's \"dq\" $(touch /tmp/cddp-pwned) a;b|c&d naïve ✓ * \\n `x` %s"
    cli_value = "-e " + token + " 'q' $HOME"
    hold, go = tmp_path / "hold", tmp_path / "go"
    # sshd makes its sessions' umask at least 022; the setup lines (in launch.sh, the probe and exec)
    # open it wide. The second holds a probe or exec while `hold` exists, so the test can look at the node.
    inv = bed.write_inventory(tmp_path / "inv.yaml", [node], defaults_extra={
        "env": {"SECRET": value}, "gpus": 1,
        "setup": ["umask 000", f"while [ -e {hold} ]; do sleep 0.05; done"]})

    # check's probe: held in its setup line, its shell's command line is there to read.
    hold.touch()
    p = cddp_popen("check", str(inv))
    try:
        scan_while(bed, node, b"CLUSTERDDP_PROBE", token)
    finally:
        hold.unlink()
    out, _ = p.communicate(timeout=120)
    assert "node1" in out and "setup line failed" not in out, out

    # exec: the user's command runs (held) with the value, and finds its stdin empty.
    got, stdin = tmp_path / "exec.txt", tmp_path / "stdin.txt"
    p = cddp_popen("exec", str(inv), "--",
                   f"cat > {stdin}; printf '%s' \"$SECRET\" > {got}; while [ ! -e {go} ]; do sleep 0.05; done")
    try:
        scan_while(bed, node, str(go).encode(), token)
    finally:
        go.touch()
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0, out
    assert got.read_bytes() == value.encode() and stdin.read_bytes() == b""
    go.unlink()

    # up: the job runs held; its launcher's preflight probe ran first, with the -e value too.
    job = tmp_path / "job"
    job.mkdir()
    (job / "job.py").write_text(JOB)
    runs = tmp_path / "runs"
    p = cddp_popen("up", str(inv), str(job / "job.py"), "-e", f"CLI_SECRET={cli_value}", "--runs-dir", str(runs),
                   "--", str(go))
    try:
        run_dir = eventually(lambda: p.poll() is not None or next(
            (d for d in (Path(node.workdir) / "runs").glob("*") if (d / "seen.json").exists()), None), 120)
        assert isinstance(run_dir, Path), "the job never started:\n" + (p.stdout.read() if p.poll() is not None else "")
        scan_while(bed, node, b"torch.distributed.run", token)
        ctl = run_dir / ".clusterddp" / node.name
        assert mode(ctl) == mode(ctl.parent) == 0o700
        assert {f: mode(ctl / f) for f in ("launch.sh", "node.log", "pid")} == dict.fromkeys(
            ("launch.sh", "node.log", "pid"), 0o600)
        assert token in (ctl / "launch.sh").read_text()  # where the values are kept on the node
        # the run folder and the job's own files keep the node's modes (sshd's 022, the setup's 000)
        assert mode(run_dir) == 0o755 and mode(run_dir / "seen.json") == 0o666
    finally:
        go.touch()
    out, _ = p.communicate(timeout=180)
    assert p.returncode == 0, out
    assert mode(ctl / "exit_code") == 0o600 and (ctl / "exit_code").read_text() == "0\n"
    files = ("launch.sh", "node.log", "pid", "exit_code", "lease-go")  # lease-go: the lease holder's word to start
    # errors/: torchrun's per-rank error files (which can quote a secret), private like the rest
    # stacks/: the stack hook and each python's dump file (`clusterddp stacks`), private too
    # flight/: where torch writes its flight recorder dumps (clusterddp.flight): the script's frames
    # sampler/, where/: the job's samplers' programs, their samples and logs (metrics*.json*, where.*,
    # *.log), private too: every file 0600, every folder 0700, whatever a later feature adds
    seen = {f.name: mode(f) for f in ctl.iterdir()}
    assert {n: m for n, m in seen.items() if m != (0o700 if (ctl / n).is_dir() else 0o600)} == {}, seen
    assert {**dict.fromkeys(files, 0o600), "errors": 0o700, "stacks": 0o700, "flight": 0o700,
            "sampler": 0o700, "where": 0o700, "metrics.jsonl": 0o600, "where.jsonl": 0o600}.items() <= seen.items()
    # (what the job's own pythons add inside it, such as the hook's __pycache__, has the job's umask:
    # unreachable for others all the same, behind stacks/'s 0700)
    assert {mode(f) for f in (ctl / "stacks").rglob("*") if "__pycache__" not in f.parts} <= {0o600, 0o700}
    assert json.loads((run_dir / "seen.json").read_text()) == {"SECRET": value, "CLI_SECRET": cli_value}
    assert not Path("/tmp/cddp-pwned").exists()
