"""Notifications through the real CLI: `up local` (real torchrun) telling a real HTTP server and a
command how the run ended, a receiver answering 500 leaving the exit code as it was, `notify test`,
a schedule's skipped firing, and the URL never printed."""

from __future__ import annotations

import fcntl
import json

from clusterddp import schedule as schedules
from clusterddp.runspec import RunSpec
from helpers import cddp, run_id_of
from test_notify import TOKEN, Receiver


def url_file(tmp_path, r: Receiver, name: str = "hook.url"):
    f = tmp_path / name
    f.write_text(r.url + "\n")
    f.chmod(0o600)
    return f


def test_up_tells_each_target_once_how_the_run_ended_and_a_500_changes_nothing(tmp_path, receiver):
    """(The succeeded end, through a command target: test_cli's test_up_local_runs_real_torchrun.)"""
    ok, broken = receiver(), receiver(500)
    (tmp_path / "fails.py").write_text("import os\nif os.environ['RANK'] == '0':\n    1 / 0\n")
    got = tmp_path / "got.json"
    r = cddp("up", "local", "fails.py", "--gpus", "1", "--runs-dir", "runs", "--notify", f"@{url_file(tmp_path, ok)}",
             "--notify", f"@{url_file(tmp_path, broken, 'broken.url')}", "--notify", f"command:cat > {got}",
             cwd=tmp_path, check_rc=1)
    assert len(ok.posts) == 1 and len(broken.posts) == 3  # one POST per event; the 500 tried three times
    ev = ok.posts[0]["body"]
    assert ev == json.loads(got.read_text())  # the same event to every target
    assert (ev["event"], ev["status"], ev["failed_host"], ev["exit_code"]) == ("failed", "failed", "local", 1)
    assert ev["run_id"] == run_id_of(r.stdout) and ev["hosts"] == ["local"]
    assert "ZeroDivisionError" in ev["summary"] and ev["text"].startswith(f"clusterddp: run {ev['run_id']} failed")
    assert "ZeroDivisionError" in ev["text"] and ev["failure"]["host"] == "local"
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("notify:")]
    assert line.startswith("notify: webhook 127.0.0.1 (--notify) was not told of failed") and "HTTP 500" in line
    assert TOKEN not in r.stderr + r.stdout
    assert (tmp_path / "runs" / ev["run_id"] / "notify.log").read_text().endswith(line + "\n")


def test_a_url_is_never_printed_nor_taken_from_the_command_line(tmp_path, receiver):
    inv = tmp_path / "lab.yaml"
    inv.write_text("hosts:\n  - {name: node-1, address: 192.0.2.1}\n"
                   f"notify:\n  - webhook: http://127.0.0.1:9/services/{TOKEN}\n")
    (tmp_path / "t.py").write_text("print(1)\n")
    r = cddp("up", str(inv), "t.py", "--dry-run", "--runs-dir", "runs", cwd=tmp_path, check_rc=0)
    assert TOKEN not in r.stdout + r.stderr
    r = cddp("up", "local", "t.py", "--notify", f"https://hooks.slack.com/services/{TOKEN}", "--runs-dir", "runs",
             cwd=tmp_path, check_rc=2)
    assert "secret" in r.stderr and TOKEN not in r.stderr and "Traceback" not in r.stderr
    loose = url_file(tmp_path, receiver())
    loose.chmod(0o640)
    r = cddp("up", "local", "t.py", "--notify", f"@{loose}", "--runs-dir", "runs", cwd=tmp_path, check_rc=2)
    assert "mode 0640" in r.stderr and f"chmod 600 {loose}" in r.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").glob("2*"))  # refused before any run


def test_notify_test_sends_to_every_target_and_says_what_each_answered(tmp_path, receiver):
    ok, broken = receiver(), receiver(500)
    got = tmp_path / "got.json"
    inv = tmp_path / "lab.yaml"
    inv.write_text("name: lab\nhosts:\n  - {name: node-1}\nnotify:\n"
                   f"  - {{webhook_file: {url_file(tmp_path, ok).name}, on: [failed]}}\n"
                   f"  - {{command: 'cat > {got}', on: [hang]}}\n")
    r = cddp("notify", "test", str(inv), cwd=tmp_path, check_rc=0)
    assert r.stdout.splitlines() == [f"told webhook 127.0.0.1 ({inv}: notify[0]): HTTP 200",
                                     f"told command ({inv}: notify[1]): exit 0"]
    (post,) = ok.posts
    assert post["body"]["event"] == "test" and post["body"]["text"].startswith("clusterddp: a test notification "
                                                                               "for lab from ")
    assert json.loads(got.read_text())["event"] == "test"
    r = cddp("notify", "test", str(inv), "--notify", f"@{url_file(tmp_path, broken, 'b.url')}", cwd=tmp_path,
             check_rc=1)
    assert "HTTP 500" in r.stderr and TOKEN not in r.stdout + r.stderr and len(ok.posts) == 2
    bare = tmp_path / "bare.yaml"
    bare.write_text("hosts:\n  - {name: node-1}\n")
    r = cddp("notify", "test", str(bare), cwd=tmp_path, check_rc=2)
    assert "nothing to test" in r.stderr


def test_a_skipped_firing_is_told(tmp_path):
    got = tmp_path / "got.json"
    inv = tmp_path / "lab.yaml"
    inv.write_text(f"hosts:\n  - {{name: node-1}}\nnotify:\n  - {{command: 'cat > {got}', on: [skipped]}}\n")
    spec = schedules.ScheduleSpec(
        name="nightly",
        cron="0 2 * * *",
        launch_dir=str(tmp_path),
        runs_dir=str(tmp_path / "runs"),
        executable=("/bin/false",),
        bin_dir="/bin",
        inventory=str(inv),
        run=RunSpec(script=str(tmp_path / "t.py")),
        hosts=(),
        agent_socket=None,
    )
    schedules.save_spec(spec)
    with open(spec.lock_path, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        r = cddp("schedule", "fire", spec.spec_path, cwd=tmp_path, check_rc=schedules.LOCK_HELD_EXIT)
    ev = json.loads(got.read_text())
    assert (ev["event"], ev["schedule"]) == ("skipped", "nightly") and "still holds" in ev["text"], r.stderr


def test_an_interrupted_up_is_told_once_as_interrupted(tmp_path):
    import signal

    from helpers import cddp_popen, wait_for_line
    got = tmp_path / "got.json"
    (tmp_path / "sleeps.py").write_text("import time\nprint('started', flush=True)\ntime.sleep(120)\n")
    p = cddp_popen("up", "local", "sleeps.py", "--gpus", "1", "--runs-dir", "runs",
                   "--notify", f"command:cat >> {got}", cwd=tmp_path)
    try:
        wait_for_line(p, "started")
        p.send_signal(signal.SIGTERM)  # as Ctrl-C
        out, _ = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 130, out
    (ev,) = [json.loads(line) for line in got.read_text().splitlines()]  # once
    assert (ev["event"], ev["status"], ev["exit_code"]) == ("interrupted", "stopped", 130), ev
