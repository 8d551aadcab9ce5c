"""Scheduled runs without a crontab: the spec file, the rendered line, `schedule fire`, cron's
rules and editing crontab text.

No crontab is touched here (tests/schedule/test_schedule_cron.py does that); lines are run through a
real /bin/sh as cron would, with a stand-in clusterddp that records what `up` was given and
hands `schedule fire` to the real one.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import pwd
import re
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from clusterddp import schedule as schedules
from clusterddp.errors import ClusterDDPError, LockTimeout, SpecError, UsageError
from clusterddp.record import RunStatus
from clusterddp.runspec import RunSpec
from clusterddp.schedule import crontab as crontab_mod
from clusterddp.store import RunStore
from helpers import eventually, make_record

NOW = datetime(2026, 11, 29, 18, 15, tzinfo=timezone.utc)


def spec(**over) -> schedules.ScheduleSpec:
    run = RunSpec(script="/home/ann/proj dir/train.py", script_args=("--fmt", "%Y-%m", "it's"), name="nightly eval",
                  gpus=2, master_port=29600, env=(("NCCL_DEBUG", "INFO"),), collect=("checkpoints/**",),
                  max_restarts=1)
    base = dict(name="nightly", cron="0 2 * * *", launch_dir="/home/ann/proj dir", runs_dir="/srv/runs 50%",
                executable=("/venv/bin/clusterddp",), bin_dir="/venv/bin", inventory="/home/ann/inv.yaml", run=run,
                hosts=("gpu-01", "gpu-02"), agent_socket=None)
    base.update(over)
    return schedules.ScheduleSpec(**base)


GOLDEN = (
    "0 2 * * * { cd '/home/ann/proj dir' && "
    "PATH=/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "
    "/venv/bin/clusterddp schedule fire '/srv/runs 50'\\%/schedules/nightly.json ; } "
    ">> '/srv/runs 50'\\%/schedules/nightly.log 2>&1 # clusterddp:nightly"
)


def test_rendered_line_is_golden():
    assert schedules.render_line(spec()) == GOLDEN


def test_the_line_carries_no_value_of_the_run():
    secret = spec(agent_socket="/run/user/0/agent.sock",
                  run=RunSpec(script="/p/train.py", script_args=("--token-file", "/p/tok"),
                              env=(("HF_TOKEN", "hf_s3cret"),), name="my run"))
    line = schedules.render_line(secret)
    for value in ("hf_s3cret", "HF_TOKEN", "--token-file", "/p/tok", "train.py", "agent.sock", "inv.yaml", "my run",
                  "gpu-01", " -e "):
        assert value not in line
    assert schedules.render_line(secret) == schedules.render_line(
        spec()
    )  # the line names the spec file, whatever it says


def test_without_a_console_script_python_runs_the_module():
    line = schedules.render_line(spec(executable=("/opt/py/bin/python3", "-m", "clusterddp")))
    assert " /opt/py/bin/python3 -m clusterddp schedule fire '/srv/runs 50'\\%/schedules/nightly.json ; }" in line


def test_an_entry_cron_would_refuse_as_too_long_is_a_usage_error():
    with pytest.raises(UsageError, match="cron refuses more than 998") as e:
        schedules.render_line(spec(runs_dir="/" + "r" * 400))
    assert "shorter paths" in e.value.hint


def test_minimal_spec_has_no_optional_flags():
    run = RunSpec(script="/p/t.py")
    argv = schedules.up_argv(spec(run=run, hosts=(), inventory="local"))
    assert argv == ["/venv/bin/clusterddp", "up", "local", "/p/t.py", "--runs-dir", "/srv/runs 50%",
                    "--schedule", "nightly"]


def test_a_schedule_with_wait_fires_up_wait_and_older_specs_without_it_still_read(tmp_path):
    s = spec(run=RunSpec(script="/p/t.py"), hosts=(), inventory="local", wait=True)
    assert schedules.up_argv(s)[-3:] == ["--schedule", "nightly", "--wait"]
    assert schedules.spec_from_json(json.loads(json.dumps(s.to_json())), s.spec_path) == s
    old = spec(run=RunSpec(script="/p/t.py"), hosts=(), inventory="local")
    assert "wait" not in old.to_json() and schedules.spec_from_json(old.to_json(), old.spec_path).wait is False
    with pytest.raises(SpecError, match="wait: expected true or false"):
        schedules.spec_from_json({**s.to_json(), "wait": "yes"}, s.spec_path)


@pytest.mark.parametrize("where", ["launch_dir", "runs_dir", "bin_dir"])
def test_a_newline_cannot_enter_the_line(where):
    with pytest.raises(UsageError, match="one line"):
        schedules.render_line(spec(**{where: "/a\nb"}))


def test_the_spec_carries_what_the_line_could_not():
    s = spec(run=RunSpec(script="/p/t.py", script_args=("two\nlines", "x" * 2000, "\udcff raw byte"),
                         env=(("K", "a\r\nb"), ("K", "again"))), agent_socket="/s/agent")
    assert schedules.render_line(s)  # nothing of the run is on the line, so nothing of it is too long or multi-line
    assert schedules.spec_from_json(json.loads(json.dumps(s.to_json())), s.spec_path) == s
    minimal = spec(run=RunSpec(script="/p/t.py"), hosts=(), inventory="local")
    assert schedules.spec_from_json(minimal.to_json(), minimal.spec_path) == minimal


def test_spec_file_is_0600_in_a_0700_folder_and_replaced_by_rename(tmp_path):
    runs = tmp_path / "runs"
    (runs / "schedules").mkdir(parents=True, mode=0o755)  # as versions before spec files left it
    s = spec(runs_dir=str(runs))
    schedules.save_spec(s)
    path = Path(s.spec_path)
    assert oct(path.stat().st_mode & 0o777) == "0o600" and oct((runs / "schedules").stat().st_mode & 0o777) == "0o700"
    assert schedules.load_spec(str(path)) == s
    inode = path.stat().st_ino
    schedules.save_spec(spec(runs_dir=str(runs), cron="@daily"))
    assert path.stat().st_ino != inode  # a new file renamed over the old one: no reader sees half of it
    assert schedules.load_spec(str(path)).cron == "@daily" and oct(path.stat().st_mode & 0o777) == "0o600"
    assert sorted(p.name for p in (runs / "schedules").iterdir()) == ["nightly.json"]  # no temporary left


DROP = object()


def _valid(tmp_path: Path) -> tuple[Path, dict]:
    s = spec(runs_dir=str(tmp_path / "runs"))
    schedules.save_spec(s)
    return Path(s.spec_path), s.to_json()


@pytest.mark.parametrize("change, field, words", [
    ("{", None, "not valid JSON"),
    ("[]", None, "expected a JSON object"),
    ({"schema_version": 2}, "schema_version", "not a version this clusterddp reads"),
    ({"script": None}, "script", "expected a string"),
    ({"script": DROP}, "script", "missing"),
    ({"command": "rm -rf ~"}, "command", "unknown field"),
    ({"name": "../x"}, "name", "not a schedule name"),
    ({"name": "other"}, "name", "does not match the file name nightly.json"),
    ({"runs_dir": "/elsewhere"}, "runs_dir", "but the file lies in"),
    ({"launch_dir": "proj"}, "launch_dir", "'proj' is not an absolute path"),
    ({"executable": []}, "executable", "empty"),
    ({"executable": ["clusterddp"]}, "executable[0]", "not an absolute path"),
    ({"executable": "/bin/sh -c id"}, "executable", "expected a list of strings"),
    ({"inventory": "inv.yaml"}, "inventory", "not an absolute path"),
    ({"script_args": ["a", 1]}, "script_args[1]", "expected a string, got int"),
    ({"script_args": ["a\0b"]}, "script_args[0]", "NUL"),
    ({"env": [["1BAD", "x"]]}, "env[0][0]", "not a variable name"),
    ({"env": [["A"]]}, "env[0]", "expected [NAME, VALUE]"),
    ({"env": {"A": "1"}}, "env", "expected a list"),
    ({"gpus": 0}, "gpus", "out of range"),
    ({"gpus": True}, "gpus", "expected a whole number"),
    ({"master_port": 70000}, "master_port", "out of range"),
    ({"hosts": ["a,b"]}, "hosts[0]", "not a host name"),
    ({"agent_socket": "agent.sock"}, "agent_socket", "not an absolute path"),
])
def test_a_damaged_spec_is_refused_naming_file_and_field(tmp_path, change, field, words):
    path, data = _valid(tmp_path)
    if isinstance(change, str):
        path.write_text(change)
    else:
        data.update(change)
        data = {k: v for k, v in data.items() if v is not DROP}
        path.write_text(json.dumps(data))
    with pytest.raises(SpecError) as e:
        schedules.load_spec(str(path))
    where = f"schedule spec {path}: {field}: " if field else f"schedule spec {path}: "
    assert str(e.value).startswith(where) and words in e.value.message, str(e.value)
    assert e.value.exit_code == 2 and "schedule add" in e.value.hint


@pytest.mark.parametrize("how, words", [
    ("mode", "mode 0666: others may write it"), ("owner", "owned by uid 65534, not by you"),
    ("link", "is a symbolic link"), ("gone", "no such file"), ("folder", "not a plain file"),
])
def test_a_spec_someone_else_could_have_written_is_refused(tmp_path, how, words):
    path, _ = _valid(tmp_path)
    if how == "mode":
        path.chmod(0o666)
    elif how == "owner":
        if os.geteuid() != 0:
            pytest.skip("needs root to give the file away")
        os.chown(path, 65534, 65534)
    elif how == "link":
        real = tmp_path / "elsewhere.json"
        path.rename(real)
        path.symlink_to(real)
    elif how == "gone":
        path.unlink()
    else:
        path.unlink()
        path.mkdir()
    with pytest.raises(SpecError, match=re.escape(f"schedule spec {path}: ") + ".*" + re.escape(words)):
        schedules.load_spec(str(path))


TRICKY = ["%", "50%", "\\%", "a\\\\%b", "%%d", "it's", 'say "hi"', "$HOME", "`id`", "a;b", "*", "~", "é ü",
          "", " lead", "--", "\\", "trail\\", "two\nlines"]


def _fake_clusterddp(tmp_path: Path, name: str = "clusterddp") -> Path:
    """A stand-in that records each `up` it is given (argv, cwd, environment) and hands
    `[-m clusterddp] schedule fire ...` to the real clusterddp, which then runs this `up`."""
    exe = tmp_path / "bin" / name
    exe.parent.mkdir(exist_ok=True)
    exe.write_text(f"#!{sys.executable}\n"
                   "import json, os, sys, time\n"
                   "args = sys.argv[1:]\n"
                   "if ['schedule', 'fire'] in (args[:2], args[2:4]):\n"
                   f"    os.execv({sys.executable!r}, [{sys.executable!r}, '-m', 'clusterddp', "
                   "*args[args.index('schedule'):]])\n"
                   "files = {a[1:]: open(a[1:]).read() for a in args if a.startswith('@/dev/fd/')}\n"
                   f"with open({str(tmp_path / 'calls.jsonl')!r}, 'a') as f:\n"
                   "    f.write(json.dumps({'argv': args, 'cwd': os.getcwd(), 'env': dict(os.environ), 'files': files})"
                   " + '\\n')\n"
                   "print('fake clusterddp ran', args[0], flush=True)\n"
                   "hold = os.environ.get('FAKE_HOLD_UNTIL')\n"
                   "while hold and not os.path.exists(hold):\n"
                   "    time.sleep(0.05)\n"
                   "sys.exit(int(os.environ.get('FAKE_RC', '0')))\n")
    exe.chmod(0o755)
    return exe


def _run_as_cron(line: str, home: Path, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    """What cron does with a line: strip the time fields, apply its % rules, sh -c in a bare environment."""
    entry = schedules.parse_line(line)
    assert entry is not None
    command, stdin = schedules.cron_command(entry.command)
    env = {"HOME": str(home), "LOGNAME": "x", "SHELL": "/bin/sh", "PATH": schedules.CRON_PATH, **(extra_env or {})}
    return subprocess.run(["/bin/sh", "-c", command], env=env, cwd=home, input=stdin, capture_output=True,
                          text=True, timeout=60)


def _inline_env(call: dict) -> list[str]:
    """A recorded up's argv with ``-e @FILE`` replaced by the ``-e NAME=VALUE`` flags the file holds."""
    from clusterddp import envfile
    out: list[str] = []
    for a in call["argv"]:
        if a[1:] in call["files"] and out[-1:] == ["-e"]:
            out.pop()
            with tempfile.NamedTemporaryFile("w") as f:
                f.write(call["files"][a[1:]])
                f.flush()
                for k, v in envfile.read(f.name, lambda warning: None):
                    out += ["-e", f"{k}={v}"]
        else:
            out.append(a)
    return out


def _calls(tmp_path: Path) -> list[dict]:
    p = tmp_path / "calls.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def _saved(s: schedules.ScheduleSpec) -> schedules.ScheduleSpec:
    schedules.save_spec(s)
    return s


@pytest.mark.parametrize("module", [False, True])
def test_cron_line_fires_up_with_every_word_exactly(tmp_path, module):
    exe = _fake_clusterddp(tmp_path)
    work = tmp_path / "work dir %x"
    work.mkdir()
    runs = tmp_path / "runs 50%"
    executable = (str(exe), "-m", "clusterddp") if module else (str(exe),)
    s = _saved(spec(launch_dir=str(work), runs_dir=str(runs), executable=executable, bin_dir=str(exe.parent),
                    agent_socket=str(tmp_path / "agent 50%.sock"),
                    run=RunSpec(script=str(work / "t.py"), script_args=tuple(TRICKY),
                                env=(("V", "x%y 'z'"), ("S", "s3cr\net")))))
    line = schedules.render_line(s)
    assert "\n" not in line and all(line[i - 1] == "\\" for i, c in enumerate(line) if c == "%")
    r = _run_as_cron(line, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and r.stderr == ""  # everything went to the schedule's log
    (call,) = _calls(tmp_path)
    (env_file, lines), = call["files"].items()  # the env's values came in a file, not on the command line
    assert env_file.startswith("/dev/fd/") and call["argv"] == schedules.up_argv(s, env_file)[1:]
    assert "s3cr" not in " ".join(call["argv"]) and "x%y" not in " ".join(call["argv"])
    from clusterddp import envfile
    (tmp_path / "env").write_text(lines)
    assert tuple(envfile.read(str(tmp_path / "env"), lambda warning: None)) == s.run.env
    assert call["cwd"] == str(work)
    assert call["env"]["PATH"] == schedules.search_path(str(exe.parent))
    assert call["env"]["SSH_AUTH_SOCK"] == str(tmp_path / "agent 50%.sock")
    log = (runs / "schedules" / "nightly.log").read_text()
    start = rf"\[clusterddp\] \S+ schedule nightly: starting clusterddp up \(spec {re.escape(s.spec_path)}\)\n"
    end = r"\[clusterddp\] \S+ schedule nightly: succeeded\n"  # what the firing came to (the fake records no run)
    assert re.fullmatch(start + rf"fake clusterddp ran {call['argv'][0]}\n" + end, log), log


def test_exit_code_of_the_run_is_the_exit_code_of_the_line(tmp_path):
    exe = _fake_clusterddp(tmp_path)
    s = _saved(spec(runs_dir=str(tmp_path / "runs"), launch_dir=str(tmp_path), executable=(str(exe),),
                    bin_dir=str(exe.parent)))
    r = _run_as_cron(schedules.render_line(s), tmp_path, {"FAKE_RC": "4"})
    assert r.returncode == 4
    assert [c["argv"][0] for c in _calls(tmp_path)] == ["up"]
    assert RunStore(s.runs_dir).skips("nightly") == []  # a failed run is not a skip
    (firing,) = RunStore(s.runs_dir).firings("nightly")
    assert (firing["outcome"], firing["run_id"]) == ("failed", None)  # no run recorded: none named
    assert "exited 4 before its run was recorded" in firing["reason"]


def test_held_lock_skips_the_run_and_records_it(tmp_path):
    exe = _fake_clusterddp(tmp_path)
    runs = tmp_path / "runs"
    s = _saved(spec(runs_dir=str(runs), launch_dir=str(tmp_path), executable=(str(exe),), bin_dir=str(exe.parent)))
    with open(s.lock_path, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # our own folder: free
        r = _run_as_cron(schedules.render_line(s), tmp_path)
    assert r.returncode == schedules.LOCK_HELD_EXIT == 3, r.stderr
    assert _calls(tmp_path) == []
    (skip,) = RunStore(runs).skips("nightly")
    assert skip["holder"] is None and skip["reason"] == f"the previous run still holds {s.lock_path}"
    assert skip["outcome"] == "skipped: lock held" and skip["run_id"] is None
    assert (runs / "schedules" / "nightly.log").read_text() == (
        f"[clusterddp] {skip['at']} schedule nightly: skipped: lock held: {skip['reason']}\n")
    r = _run_as_cron(schedules.render_line(s), tmp_path)  # lock free again: the run starts
    assert r.returncode == 0 and _calls(tmp_path)[-1]["argv"][0] == "up"


def test_the_run_keeps_the_lock_when_fire_dies_first(tmp_path):
    exe = _fake_clusterddp(tmp_path)
    s = _saved(spec(runs_dir=str(tmp_path / "runs"), launch_dir=str(tmp_path), executable=(str(exe),),
                    bin_dir=str(exe.parent)))
    release = tmp_path / "release"
    # started by hand, from elsewhere and with another PATH: fire still runs `up` as the line would
    fire = subprocess.Popen([sys.executable, "-m", "clusterddp", "schedule", "fire", s.spec_path], cwd="/",
                            env={**os.environ, "FAKE_HOLD_UNTIL": str(release)}, stdout=subprocess.DEVNULL)
    try:
        (call,) = eventually(lambda: _calls(tmp_path), timeout=30) or [None]
        assert call, "up never started"
        assert call["cwd"] == str(tmp_path) and call["env"]["PATH"] == schedules.search_path(str(exe.parent))
        fire.send_signal(signal.SIGKILL)
        fire.wait(timeout=10)
        assert schedules.try_lock(s) is None  # `up` still runs, so it still holds the lock
    finally:
        release.touch()
    fd = eventually(lambda: schedules.try_lock(s), timeout=30)
    assert fd is not None, "the lock was never released after the run ended"
    os.close(fd)


@pytest.mark.parametrize("damage, field", [({"script_args": ["a\0b"]}, "script_args[0]"), ("chmod", None)])
def test_fire_with_a_bad_spec_exits_2_and_starts_nothing(tmp_path, damage, field):
    exe = _fake_clusterddp(tmp_path)
    s = _saved(spec(runs_dir=str(tmp_path / "runs"), launch_dir=str(tmp_path), executable=(str(exe),),
                    bin_dir=str(exe.parent)))
    path = Path(s.spec_path)
    if damage == "chmod":
        path.chmod(0o646)
    else:
        path.write_text(json.dumps({**s.to_json(), **damage}))
    r = subprocess.run([sys.executable, "-m", "clusterddp", "schedule", "fire", str(path)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith(f"error: schedule spec {path}: {field + ': ' if field else ''}")
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert _calls(tmp_path) == [] and not Path(s.lock_path).exists()


def test_a_crontab_cron_refuses_leaves_the_spec_files_as_they_were(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    old = spec(runs_dir=str(tmp_path / "runs"))
    schedules.save_spec(old)
    monkeypatch.setattr(crontab_mod, "read_crontab", lambda: schedules.render_line(old) + "\n")

    def refuse(text):
        raise ClusterDDPError("crontab refused the new table: bad minute")
    monkeypatch.setattr(crontab_mod, "write_crontab", refuse)
    with pytest.raises(ClusterDDPError, match="bad minute"):
        schedules.add(spec(runs_dir=str(tmp_path / "runs"), cron="@daily"), replace=True)
    assert schedules.load_spec(old.spec_path) == old  # the line still names it: it must still say what it said


def test_replacing_a_schedule_leaves_no_spec_of_the_old_line_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    moved = spec(runs_dir=str(tmp_path / "runs1"))
    schedules.save_spec(moved)
    crontab = {"text": FOREIGN + schedules.render_line(moved) + "\n"}
    monkeypatch.setattr(crontab_mod, "read_crontab", lambda: crontab["text"])
    monkeypatch.setattr(crontab_mod, "write_crontab", lambda text: crontab.update(text=text))

    new = spec(runs_dir=str(tmp_path / "runs2"))
    edit = schedules.add(new, replace=True)  # the same name in another runs folder: the old spec goes
    assert edit.replaced and not Path(moved.spec_path).exists() and schedules.load_spec(new.spec_path) == new
    assert [e.spec_path for e in schedules.entries(crontab["text"])] == [new.spec_path]
    assert crontab["text"].startswith(FOREIGN)
    schedules.add(
        dataclasses.replace(new, runs_dir=str(tmp_path / "runs3")), replace=True
    )  # moved to another runs folder
    assert not Path(new.spec_path).exists() and Path(tmp_path / "runs3" / "schedules" / f"{new.name}.json").exists()


def test_crontab_lock_wait_has_a_deadline_that_names_the_holder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    lock = tmp_path / "clusterddp" / "crontab.lock"
    with schedules.editing():
        started = time.monotonic()
        with pytest.raises(LockTimeout) as e:
            with schedules.editing(deadline=0.5):
                pass
        waited = time.monotonic() - started
    assert 0.5 <= waited < 10, waited
    assert str(lock) in e.value.message and f"by pid {os.getpid()} (" in e.value.message
    assert f"kill {os.getpid()}" in e.value.hint
    with schedules.editing(deadline=0.5):  # released with the block
        pass


# ---- names and expressions ----

@pytest.mark.parametrize("expr, norm", [
    ("* * * * *", "* * * * *"), ("  0   2 * * *  ", "0 2 * * *"), ("*/15 9-17 * * mon-fri", "*/15 9-17 * * mon-fri"),
    ("0 0 1 jan,jul *", "0 0 1 jan,jul *"), ("@daily", "@daily"), ("@HOURLY", "@hourly"), ("0 0 29 2 *", "0 0 29 2 *"),
])
def test_valid_expressions(expr, norm):
    assert schedules.check_cron(expr, NOW) == norm


@pytest.mark.parametrize("expr, words", [
    ("", "expected 5 fields"), ("* * * *", "got 4"), ("* * * * * *", "got 6"),  # cron would run "*" as the command
    ("61 * * * *", "minute field: '61' is out of range (0..59"), ("*/0 * * * *", "not a valid cron"),
    ("0 0 L * *", "day of month field 'L'"),
    ("0 0 * * 5#3", "day of week field"), ("0 0 ? * *", "day of month field"), ("0 0 * * jan", "day of week field"),
    ("@reboot", "unsupported keyword"), ("@often", "unsupported keyword"), ("0 0 31 2 *", "never fires"),
])
def test_invalid_expressions_are_usage_errors(expr, words):
    with pytest.raises(UsageError, match="--cron") as e:
        schedules.check_cron(expr, NOW)
    assert words in e.value.message and e.value.exit_code == 2


@pytest.mark.parametrize("name, ok", [("nightly", True), ("eval-1.b_2", True), ("a b", False), ("", False),
                                      ("x/y", False), ("n;rm", False), ("é", False)])
def test_names(name, ok):
    if ok:
        assert schedules.check_name(name) == name
    else:
        with pytest.raises(UsageError):
            schedules.check_name(name)


def test_next_runs_from_a_fixed_clock():
    assert [t.isoformat() for t in schedules.next_runs("0 2 * * *", 3, NOW)] == [
        "2026-11-30T02:00:00+00:00", "2026-12-01T02:00:00+00:00", "2026-12-02T02:00:00+00:00"]


# ---- cron's rules ----

@pytest.mark.parametrize("command, shell, stdin", [
    ("echo a", "echo a", ""), ("echo \\%d", "echo %d", ""), ("echo a\\b", "echo a\\b", ""),
    ("cat %line1%line2", "cat ", "line1\nline2"), ("echo \\\\%x", "echo \\\\", "x"),
])
def test_cron_command_follows_cron(command, shell, stdin):
    assert schedules.cron_command(command) == (shell, stdin)


FOREIGN = """# my own jobs
MAILTO=""
SHELL=/bin/sh
  HOME = '/tmp/x'
*/5  *  * * *   echo   'a%b'  \\% x   # keep me, spacing and all
@daily /usr/bin/true
# 0 1 * * * echo old # clusterddp:nightly
0 3 * * * echo mentions clusterddp:nightly but is not tagged
"""


def test_with_line_appends_and_keeps_every_foreign_line():
    out = schedules.with_line(FOREIGN, "nightly", "0 2 * * * x # clusterddp:nightly")
    assert out == FOREIGN + "0 2 * * * x # clusterddp:nightly\n"
    assert [e.name for e in schedules.entries(out)] == ["nightly"]  # the commented-out one is not an entry


def test_odd_characters_in_foreign_lines_survive():
    text = "0 1 * * * echo a\rb\x0cc\x85d\u2028e\r\n@daily true\n"
    out = schedules.with_line(text, "n", "1 * * * * y # clusterddp:n")
    assert out == text + "1 * * * * y # clusterddp:n\n" and schedules.without_line(out, "n") == text


def test_with_line_adds_a_final_newline_cron_needs():
    assert (
        schedules.with_line("@daily true", "n", "1 * * * * y # clusterddp:n")
        == "@daily true\n1 * * * * y # clusterddp:n\n"
    )
    assert schedules.with_line("", "n", "1 * * * * y # clusterddp:n") == "1 * * * * y # clusterddp:n\n"


def test_existing_name_needs_replace_and_is_replaced_in_place():
    text = schedules.with_line(FOREIGN, "a", "0 2 * * * x # clusterddp:a") + "@hourly tail\n"
    with pytest.raises(UsageError, match="already exists") as e:
        schedules.with_line(text, "a", "5 5 * * * y # clusterddp:a")
    assert "--replace" in str(e.value)
    out = schedules.with_line(text, "a", "5 5 * * * y # clusterddp:a", replace=True)
    assert out == FOREIGN + "5 5 * * * y # clusterddp:a\n@hourly tail\n"


def test_without_line_removes_only_the_entry():
    text = schedules.with_line(
        schedules.with_line(FOREIGN, "a", "0 2 * * * x # clusterddp:a"), "b", "0 3 * * * y # clusterddp:b"
    )
    assert schedules.without_line(text, "a") == FOREIGN + "0 3 * * * y # clusterddp:b\n"
    assert schedules.without_line(schedules.without_line(text, "a"), "b") == FOREIGN
    with pytest.raises(UsageError, match="no schedule 'c'"):
        schedules.without_line(text, "c")


def test_parse_line_reads_back_name_expression_spec_and_runs_dir():
    (e,) = schedules.entries("MAILTO=x\n" + GOLDEN + "\n")
    assert (e.name, e.cron, e.index, e.runs_dir) == ("nightly", "0 2 * * *", 1, "/srv/runs 50%")
    assert e.spec_path == "/srv/runs 50%/schedules/nightly.json"
    assert e.log_path == "/srv/runs 50%/schedules/nightly.log"
    assert e.command == GOLDEN[len("0 2 * * * "):]
    (k,) = schedules.entries("@daily  echo hi   # clusterddp:k")
    assert (k.cron, k.runs_dir, k.spec_path) == ("@daily", None, None)
    assert schedules.entries("X=1 # clusterddp:y\n#0 2 * * * a # clusterddp:z\n") == []


def test_cron_environment_is_cron_s_own_plus_the_lines_above():
    text = FOREIGN + "0 2 * * * x # clusterddp:a\nLATER=1\n"
    entry = schedules.find(text, "a")
    user = pwd.getpwuid(os.getuid())
    env = schedules.cron_environment(text, entry, user)
    assert env == {"HOME": "/tmp/x", "LOGNAME": user.pw_name, "SHELL": "/bin/sh", "PATH": "/usr/bin:/bin",
                   "MAILTO": ""}


# ---- the store's schedule queries ----

def test_store_last_run_and_skips(tmp_path):
    store = RunStore(tmp_path / "runs")
    assert store.last_run("n") is None and store.skips("n") == []
    assert not (tmp_path / "runs").exists()  # reading creates nothing
    for rid, started, sched in [("r1", "2026-11-29T01:00:00+00:00", "n"), ("r2", "2026-11-29T02:00:00+00:00", "n"),
                                ("r3", "2026-11-29T03:00:00+00:00", "other"),
                                ("r4", "2026-11-29T04:00:00+00:00", None)]:
        store.create(make_record(rid, (), status=RunStatus.SUCCEEDED, started_at=started, schedule=sched))
    assert store.last_run("n")["run_id"] == "r2" and store.last_run("zzz") is None
    store.record_firing("n", "skipped: lock held", holder="r2", reason="busy")
    store.record_firing("n", "succeeded", run_id="r2")
    store.record_firing("n", "skipped: slots busy", reason="busy again")
    assert [(s["reason"], s["holder"]) for s in store.skips("n")] == [("busy again", None), ("busy", "r2")]
    assert [f["outcome"] for f in store.firings("n")] == ["skipped: slots busy", "succeeded", "skipped: lock held"]
    assert store.firings("n", 1)[0]["reason"] == "busy again"
    assert store.skips("other") == [] and store.firings("other") == []
    assert [r["run_id"] for r in store.list()] == ["r4", "r3", "r2", "r1"]  # skips are not runs


def test_cli_import_loads_no_cron_library():
    code = ("import sys, clusterddp.cli.app; "
            "print(sorted(m for m in ('croniter', 'crontab', 'pydantic', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_schedule_add_takes_quiet_and_names_the_up_options_it_does_not_take(tmp_path, monkeypatch):
    """`-q/--quiet` is an `up` option like the others (the README says `schedule add` takes them); --detach and
    --dry-run are `up`'s too, and refused as such with why, not called the script's arguments."""
    from typer.testing import CliRunner

    from clusterddp import launch
    from clusterddp.cli.app import app
    from clusterddp.cli.schedule import NOT_SCHEDULED
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    crontab = {"text": FOREIGN}
    monkeypatch.setattr(crontab_mod, "read_crontab", lambda: crontab["text"])
    monkeypatch.setattr(crontab_mod, "write_crontab", lambda text: crontab.update(text=text))
    (tmp_path / "t.py").write_text("print('hi')\n")
    add = ["schedule", "add", "nightly", "local", "t.py", "--cron", "@daily", "--runs-dir", "runs"]
    for quiet in ("-q", "--quiet"):
        r = CliRunner().invoke(app, [*add, quiet, "--replace", "--", "--epochs", "1"])
        assert r.exit_code == 0, r.output
        saved = schedules.load_spec(str(tmp_path / "runs" / "schedules" / "nightly.json"))
        assert dict(saved.up)["quiet"] is True and saved.run.script_args == ("--epochs", "1")
    assert sorted(NOT_SCHEDULED) == sorted(o.name for o in launch.OPTIONS if o.recorded is None)  # each has a why
    before = crontab["text"]
    for given, flag, why in (("--detach", "--detach", "never detached"), ("-d", "-d", "never detached"),
                             ("-qd", "-d", "never detached"),
                             ("--dry-run", "--dry-run", "give `clusterddp up` the same options and --dry-run")):
        r = CliRunner().invoke(app, [*add, given, "--replace"])
        said = r.output
        assert r.exit_code == 2 and f"does not take `up`'s {flag}: " in said, said
        assert why in said and "the script's own arguments go after" not in said, said
    assert crontab["text"] == before  # refused before anything was written
    r = CliRunner().invoke(app, [*add, "--epochs", "1"])  # the script's own option: the usual hint, still
    assert r.exit_code == 2 and "the script's own arguments go after `--`" in r.output, r.output
