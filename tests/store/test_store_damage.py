"""Every command that touches the run store, against every kind of damage to it: a clear message naming
the path and what to do, exit 2, never a traceback; what does not need the damaged part still works;
and `up` leaves no half-made run behind.

The commands run in-process (typer's runner, real SQLite, real files, the local transport's real
shell commands); the read-only runs folder is a real read-only bind mount, so it holds for root too.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clusterddp import store as store_mod
from clusterddp.cli.app import app
from clusterddp.record import NodeState, RunStatus
from clusterddp.store import RunStore
from helpers import make_record

RID = "20261129-100000-aaaa"
REPO = Path(__file__).resolve().parent.parent.parent

# The commands, as the user types them (after `clusterddp`); --runs-dir is added.
COMMANDS = {
    "runs": ["runs"],
    "runs --json": ["runs", "--json"],
    "status": ["status", RID],
    "logs": ["logs", RID],
    "stop": ["stop", RID, "--grace", "0"],
    "collect": ["collect", RID],
    "up local": ["up", "local", "{script}", "--gpus", "1"],
    "schedule list": ["schedule", "list"],
}
LISTERS = {"runs", "runs --json", "schedule list"}      # read runs.db
WRITERS = {"status", "stop", "up local"}  # write runs.db
RECORD_READERS = {"status", "logs", "stop", "collect"}   # read run.json

# damage -> (commands that must refuse, what the message must name besides the path, the path)
DAMAGES = {
    "run.json truncated": (RECORD_READERS, "not valid JSON", "run.json"),
    "run.json odd": (RECORD_READERS, "nodes[0].host: must be a host name", "run.json"),
    "run.json a folder": (RECORD_READERS, "not a regular file", "run.json"),
    "runs.db random bytes": (LISTERS | WRITERS, "move it aside", "runs.db"),
    "runs.db wrong schema": (LISTERS | WRITERS, "has no column", "runs.db"),
    "runs.db locked": (WRITERS, "locked by another process", "runs.db"),
    "run locked": ({"status", "stop"}, "locked by another process", "lock"),
    "runs dir read-only": (WRITERS | {"collect"}, "cannot write", "runs"),
}
CASES = [(d, c) for d in DAMAGES for c in COMMANDS
         if c != "up local" or c in DAMAGES[d][0]]  # `up local` that works runs torchrun: tested elsewhere


def _make_runs(base: Path) -> dict[str, Path]:
    """A runs folder with one finished local run whose node folder is real, a schedule line for it,
    and a script that leaves a marker if it ever runs."""
    runs, work = base / "runs", base / "work"
    (work / ".clusterddp").mkdir(parents=True)
    (work / ".clusterddp" / "node.log").write_text("hello from the node\n")
    (work / ".clusterddp" / "exit_code").write_text("0\n")
    rec = make_record(RID, ("local",), local=True, inventory="local", status=RunStatus.SUCCEEDED,
                      ended_at="2026-11-29T10:01:00+00:00")
    rec = replace(rec, nodes=tuple(replace(n, settings=replace(n.settings, transport="local"), run_dir=str(work),
                                           control_dir=str(work / ".clusterddp"), state=NodeState.SUCCEEDED,
                                           exit_code=0) for n in rec.nodes))
    RunStore(runs).create(rec)
    marker = base / "script-ran"
    script = base / "t.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    return {"runs": runs, "marker": marker, "script": script}


def _damage(kind: str, runs: Path, hold: list) -> None:
    """Damage ``runs`` in the way ``kind`` names; what must stay held goes into ``hold``."""
    record, db = runs / RID / "run.json", runs / "runs.db"
    if kind == "run.json truncated":
        record.write_bytes(record.read_bytes()[:200])
    elif kind == "run.json odd":
        data = json.loads(record.read_text())
        data["nodes"][0]["host"] = "../../elsewhere"
        record.write_text(json.dumps(data))
    elif kind == "run.json a folder":
        record.unlink()
        record.mkdir()
    elif kind == "runs.db random bytes":
        db.write_bytes(os.urandom(4096))
    elif kind == "runs.db wrong schema":
        db.unlink()
        con = sqlite3.connect(db)
        con.execute("CREATE TABLE runs (id INTEGER, what TEXT)")
        con.commit()
        con.close()
    elif kind == "runs.db locked":  # another launcher in the middle of a write, for longer than we wait
        con = sqlite3.connect(db, isolation_level=None)
        con.execute("BEGIN IMMEDIATE")
        hold.append(con)
    elif kind == "run locked":  # another process in the middle of a read-change-write of this run
        f = open(runs / RID / ".run.json.lock", "a")
        fcntl.flock(f, fcntl.LOCK_EX)
        hold.append(f)


def _crontab(runs: Path, monkeypatch) -> None:
    """`schedule list` reads a crontab with one schedule in ``runs``; nothing touches the real one."""
    from clusterddp import schedule as schedules
    from clusterddp.runspec import RunSpec
    spec = schedules.ScheduleSpec(name="nightly", cron="0 2 * * *", launch_dir=str(runs.parent), runs_dir=str(runs),
                          executable=("/venv/bin/clusterddp",), bin_dir="/venv/bin", inventory="local",
                          run=RunSpec(script="/x/t.py"), hosts=(), agent_socket=None)
    monkeypatch.setattr(schedules, "read_crontab", lambda: schedules.render_line(spec) + "\n")
    monkeypatch.setattr(schedules, "write_crontab", lambda text: pytest.fail("the crontab was written"))


def _invoke(command: str, made: dict[str, Path]) -> tuple[int, str, BaseException | None, bool | None]:
    """(exit code, output, exception, whether a process of the run's job survived) of one command."""
    args = [a.format(script=made["script"]) for a in COMMANDS[command]]
    job = None
    if command == "stop":  # a process of the run's job, found by its marker as teardown finds it
        job = subprocess.Popen(["sleep", "600"], env={**os.environ, "CLUSTERDDP_JOB": f"{RID}/local"})
    try:
        r = CliRunner().invoke(app, [*args, "--runs-dir", str(made["runs"])] if command != "schedule list" else args)
        return r.exit_code, r.output, r.exception, None if job is None else job.poll() is None
    finally:
        if job is not None:
            job.kill()
            job.wait()


def _check(damage: str, command: str, rc: int, output: str, exception: BaseException | None, job_alive: bool | None,
           made: dict[str, Path], folders_before: set[str]) -> None:
    refusing, words, what = DAMAGES[damage]
    assert "Traceback" not in output and (exception is None or isinstance(exception, SystemExit)), \
        f"{damage} / {command}: a traceback\n{output}"
    if command not in refusing:
        assert rc == 0, f"{damage} / {command}: should still work, rc={rc}\n{output}"
        return
    path = {"run.json": made["runs"] / RID / "run.json", "runs.db": made["runs"] / "runs.db",
            "lock": made["runs"] / RID / ".run.json.lock", "runs": made["runs"]}[what]
    assert rc == 2, f"{damage} / {command}: rc={rc}\n{output}"
    assert "error: " in output and str(path) in output and words in output and "hint:" in output, output
    if command == "stop":  # refused before ending anything: a job ended unrecorded would stay "running"
        assert job_alive, f"{damage}: stop ended the job, then could not record it"
    if command == "up local":  # nothing started, no run left half-made (it would show as running forever)
        assert not made["marker"].exists()
        assert {p.name for p in made["runs"].iterdir() if p.is_dir()} == folders_before


@pytest.mark.parametrize("damage, command", [c for c in CASES if c[0] != "runs dir read-only"])
def test_a_damaged_store_gives_exit_2_naming_the_path(damage, command, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setattr(store_mod, "DB_TIMEOUT", 0.5)
    monkeypatch.setattr(store_mod, "LOCK_TIMEOUT", 0.5)
    made = _make_runs(tmp_path)
    _crontab(made["runs"], monkeypatch)
    hold: list = []
    _damage(damage, made["runs"], hold)
    before = {p.name for p in made["runs"].iterdir() if p.is_dir()}
    try:
        rc, output, exception, job_alive = _invoke(command, made)
    finally:
        for h in hold:
            h.close()
    _check(damage, command, rc, output, exception, job_alive, made, before)


# Run inside a private mount namespace where the runs folder is a read-only bind mount.
_READ_ONLY_DRIVER = textwrap.dedent("""
    import json, sys
    sys.path[:0] = [{tests!r}, {root!r}]
    import pytest
    from pathlib import Path
    import test_store_damage as T
    made = {{k: Path(v) for k, v in json.loads(sys.argv[1]).items()}}
    mp = pytest.MonkeyPatch()
    T._crontab(made["runs"], mp)
    out = {{}}
    for command in json.loads(sys.argv[2]):
        rc, output, exception, job_alive = T._invoke(command, made)
        out[command] = [rc, output, None if exception is None or isinstance(exception, SystemExit)
                        else repr(exception), job_alive]
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def read_only_results(tmp_path_factory):
    """Every command of the read-only column, run once against a read-only bind mount of the runs folder."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare for a read-only bind mount")
    base = tmp_path_factory.mktemp("ro")
    made = _make_runs(base)
    before = {p.name for p in made["runs"].iterdir() if p.is_dir()}
    r = made["runs"]
    commands = [c for d, c in CASES if d == "runs dir read-only"]
    driver = _READ_ONLY_DRIVER.format(tests=str(Path(__file__).parent), root=str(REPO / "tests"))
    sh = ('mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" "$1" || exit 98; '
          'if touch "$1/probe" 2>/dev/null; then exit 99; fi; shift; exec "$@"')  # really read-only, or no test
    p = subprocess.run(["unshare", "-m", "sh", "-c", sh, "sh", str(r), sys.executable, "-c", driver,
                        json.dumps({k: str(v) for k, v in made.items()}), json.dumps(commands)],
                       capture_output=True, text=True, timeout=240, cwd=REPO,
                       env={**os.environ, "XDG_RUNTIME_DIR": str(base)})
    assert p.returncode == 0, f"rc={p.returncode}\n{p.stdout}\n{p.stderr}"
    return json.loads(p.stdout.splitlines()[-1]), made, before


@pytest.mark.parametrize("command", [c for d, c in CASES if d == "runs dir read-only"])
def test_a_read_only_runs_folder_is_listed_and_refused_for_writes(command, read_only_results):
    results, made, before = read_only_results
    rc, output, exception, job_alive = results[command]
    assert exception is None, f"{command}: {exception}\n{output}"
    _check("runs dir read-only", command, rc, output, None, job_alive, made, before)
    if command == "runs":
        assert RID in output and "succeeded" in output  # listed from runs.db, opened without writing
    if command == "logs":
        assert "hello from the node" in output and "not refreshed" in output


def test_the_real_cli_prints_the_error_on_stderr_with_exit_2(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "runs.db").write_bytes(b"SQLite format 2\0" + os.urandom(2000))
    r = subprocess.run([sys.executable, "-m", "clusterddp", "runs", "--runs-dir", str(tmp_path / "runs")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    db = tmp_path / "runs" / "runs.db"
    assert r.stderr.startswith(f"error: {db}: not a usable clusterddp run index")
    assert f"mv {db} {db}.damaged" in r.stderr
