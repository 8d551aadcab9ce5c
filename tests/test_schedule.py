"""Scheduled runs, the pure part: the rendered crontab line, cron's rules, editing crontab text.

No crontab is touched here (tests/test_schedule_cron.py does that); the rendered command is
run through a real /bin/sh with a stand-in clusterddp that records what it was given.
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from clusterddp import schedule as S
from clusterddp.errors import UsageError
from clusterddp.plan import RunSpec
from clusterddp.record import RunStatus
from clusterddp.store import RunStore
from helpers import make_record

NOW = datetime(2026, 11, 29, 18, 15, tzinfo=timezone.utc)


def spec(**over) -> S.ScheduleSpec:
    run = RunSpec(script="/home/ann/proj dir/train.py", script_args=("--fmt", "%Y-%m", "it's"), name="nightly eval",
                  gpus=2, master_port=29600, env=(("NCCL_DEBUG", "INFO"),), collect=("checkpoints/**",),
                  max_restarts=1)
    base = dict(name="nightly", cron="0 2 * * *", workdir="/home/ann/proj dir", runs_dir="/srv/runs",
                executable=("/venv/bin/clusterddp",), bin_dir="/venv/bin", inventory="/home/ann/inv.yaml", run=run,
                hosts=("gpu-01", "gpu-02"), agent_socket=None)
    base.update(over)
    return S.ScheduleSpec(**base)


GOLDEN = (
    "0 2 * * * R=/srv/runs C=/venv/bin/clusterddp ; mkdir -p \"$R/schedules\" && { cd '/home/ann/proj dir' && "
    "export PATH=/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin && "
    "flock -E 75 -n \"$R/schedules/nightly.lock\" \"$C\" up /home/ann/inv.yaml '/home/ann/proj dir/train.py' "
    "--runs-dir \"$R\" --schedule nightly --name 'nightly eval' --hosts gpu-01,gpu-02 --gpus 2 --master-port 29600 "
    "-e NCCL_DEBUG=INFO --collect 'checkpoints/**' --max-restarts 1 -- --fmt \\%Y-\\%m 'it'\"'\"'s' ; rc=$? ; "
    "[ $rc -ne 75 ] || \"$C\" schedule _skipped nightly --runs-dir \"$R\" ; } "
    ">> \"$R/schedules/nightly.log\" 2>&1 ; exit $rc # clusterddp:nightly"
)


def test_rendered_line_is_golden():
    assert S.render_line(spec()) == GOLDEN


def test_agent_socket_is_exported_and_system_bin_not_repeated():
    line = S.render_line(spec(agent_socket="/run/user/0/agent sock", bin_dir="/usr/bin"))
    assert ("export PATH=/usr/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/sbin:/bin "
            "SSH_AUTH_SOCK='/run/user/0/agent sock' && flock") in line


def test_without_a_console_script_python_runs_the_module():
    line = S.render_line(spec(executable=("/opt/py/bin/python3", "-m", "clusterddp")))
    assert " C=/opt/py/bin/python3 ; " in line
    assert '"$C" -m clusterddp up /home/ann/inv.yaml' in line and '"$C" -m clusterddp schedule _skipped' in line


def test_an_entry_cron_would_refuse_as_too_long_is_a_usage_error():
    many = RunSpec(script="/p/t.py", script_args=tuple(f"--opt{i}" for i in range(200)))
    with pytest.raises(UsageError, match="cron refuses more than 998") as e:
        S.render_line(spec(run=many))
    assert "shorter paths" in e.value.hint


def test_minimal_spec_has_no_optional_flags():
    run = RunSpec(script="/p/t.py")
    argv = S.up_argv(spec(run=run, hosts=(), inventory="local"))
    assert argv == ["/venv/bin/clusterddp", "up", "local", "/p/t.py", "--runs-dir", "/srv/runs",
                    "--schedule", "nightly"]


@pytest.mark.parametrize("bad", ["a\nb", "x\r"])
def test_newline_cannot_enter_a_one_line_entry(bad):
    with pytest.raises(UsageError, match="one line"):
        S.render_line(spec(run=RunSpec(script="/p/t.py", script_args=(bad,))))


TRICKY = ["%", "50%", "\\%", "a\\\\%b", "%%d", "it's", 'say "hi"', "$HOME", "`id`", "a;b", "*", "~", "é ü",
          "", " lead", "--", "\\", "trail\\"]


def _fake_clusterddp(tmp_path: Path) -> Path:
    exe = tmp_path / "bin" / "clusterddp"
    exe.parent.mkdir()
    exe.write_text(f"#!{sys.executable}\n"
                   "import json, os, sys\n"
                   f"with open({str(tmp_path / 'calls.jsonl')!r}, 'a') as f:\n"
                   "    f.write(json.dumps({'argv': sys.argv[1:], 'cwd': os.getcwd(), 'env': dict(os.environ)}) + '\\n')\n"
                   "print('fake clusterddp ran', sys.argv[1])\n"
                   "sys.exit(int(os.environ.get('FAKE_RC', '0')))\n")
    exe.chmod(0o755)
    return exe


def _run_as_cron(line: str, home: Path, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    """What cron does with a line: strip the time fields, apply its % rules, sh -c in a bare environment."""
    entry = S.parse_line(line)
    assert entry is not None
    command, stdin = S.cron_command(entry.command)
    env = {"HOME": str(home), "LOGNAME": "x", "SHELL": "/bin/sh", "PATH": S.CRON_PATH, **(extra_env or {})}
    return subprocess.run(["/bin/sh", "-c", command], env=env, cwd=home, input=stdin, capture_output=True,
                          text=True, timeout=30)


def _calls(tmp_path: Path) -> list[dict]:
    p = tmp_path / "calls.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


@pytest.mark.parametrize("module", [False, True])
def test_shell_receives_every_word_exactly_through_cron(tmp_path, module):
    exe = _fake_clusterddp(tmp_path)
    work = tmp_path / "work dir %x"
    work.mkdir()
    runs = tmp_path / "runs 50%"
    executable = (str(exe), "-m", "clusterddp") if module else (str(exe),)
    s = spec(workdir=str(work), runs_dir=str(runs), executable=executable, bin_dir=str(exe.parent),
             run=RunSpec(script=str(work / "t.py"), script_args=tuple(TRICKY), env=(("V", "x%y 'z'"),)))
    line = S.render_line(s)
    assert "\n" not in line and all(line[i - 1] == "\\" for i, c in enumerate(line) if c == "%")
    r = _run_as_cron(line, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and r.stderr == ""  # everything went to the schedule's log
    (call,) = _calls(tmp_path)
    assert call["argv"] == S.up_argv(s)[1:]
    assert call["cwd"] == str(work)
    assert call["env"]["PATH"].split(":")[0] == str(exe.parent)
    assert (runs / "schedules" / "nightly.log").read_text() == f"fake clusterddp ran {call['argv'][0]}\n"


def test_exit_code_of_the_run_is_the_exit_code_of_the_line(tmp_path):
    exe = _fake_clusterddp(tmp_path)
    s = spec(runs_dir=str(tmp_path / "runs"), workdir=str(tmp_path), executable=(str(exe),), bin_dir=str(exe.parent))
    r = _run_as_cron(S.render_line(s), tmp_path, {"FAKE_RC": "1"})
    assert r.returncode == 1
    assert [c["argv"][0] for c in _calls(tmp_path)] == ["up"]  # a failed run is not a skip


def test_held_lock_skips_the_run_and_calls_skipped(tmp_path):
    exe = _fake_clusterddp(tmp_path)
    runs = tmp_path / "runs"
    s = spec(runs_dir=str(runs), workdir=str(tmp_path), executable=(str(exe),), bin_dir=str(exe.parent))
    (runs / "schedules").mkdir(parents=True)
    with open(s.lock_path, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        r = _run_as_cron(S.render_line(s), tmp_path)
    assert r.returncode == S.SKIP_EXIT
    assert [c["argv"] for c in _calls(tmp_path)] == [["schedule", "_skipped", "nightly", "--runs-dir", str(runs)]]
    r = _run_as_cron(S.render_line(s), tmp_path)  # lock free again: the run starts
    assert r.returncode == 0 and _calls(tmp_path)[-1]["argv"][0] == "up"


# ---- names and expressions ----

@pytest.mark.parametrize("expr, norm", [
    ("* * * * *", "* * * * *"), ("  0   2 * * *  ", "0 2 * * *"), ("*/15 9-17 * * mon-fri", "*/15 9-17 * * mon-fri"),
    ("0 0 1 jan,jul *", "0 0 1 jan,jul *"), ("@daily", "@daily"), ("@HOURLY", "@hourly"), ("0 0 29 2 *", "0 0 29 2 *"),
])
def test_valid_expressions(expr, norm):
    assert S.check_cron(expr, NOW) == norm


@pytest.mark.parametrize("expr, words", [
    ("", "expected 5 fields"), ("* * * *", "got 4"), ("* * * * * *", "got 6"),  # cron would run "*" as the command
    ("61 * * * *", "not a valid cron"), ("*/0 * * * *", "not a valid cron"), ("0 0 L * *", "day of month field 'L'"),
    ("0 0 * * 5#3", "day of week field"), ("0 0 ? * *", "day of month field"), ("0 0 * * jan", "day of week field"),
    ("@reboot", "unsupported keyword"), ("@often", "unsupported keyword"), ("0 0 31 2 *", "never fires"),
])
def test_invalid_expressions_are_usage_errors(expr, words):
    with pytest.raises(UsageError, match="--cron") as e:
        S.check_cron(expr, NOW)
    assert words in e.value.message and e.value.exit_code == 2


@pytest.mark.parametrize("name, ok", [("nightly", True), ("eval-1.b_2", True), ("a b", False), ("", False),
                                      ("x/y", False), ("n;rm", False), ("é", False)])
def test_names(name, ok):
    if ok:
        assert S.check_name(name) == name
    else:
        with pytest.raises(UsageError):
            S.check_name(name)


def test_next_runs_from_a_fixed_clock():
    assert [t.isoformat() for t in S.next_runs("0 2 * * *", 3, NOW)] == [
        "2026-11-30T02:00:00+00:00", "2026-12-01T02:00:00+00:00", "2026-12-02T02:00:00+00:00"]


# ---- cron's rules ----

@pytest.mark.parametrize("command, shell, stdin", [
    ("echo a", "echo a", ""), ("echo \\%d", "echo %d", ""), ("echo a\\b", "echo a\\b", ""),
    ("cat %line1%line2", "cat ", "line1\nline2"), ("echo \\\\%x", "echo \\\\", "x"),
])
def test_cron_command_follows_cron(command, shell, stdin):
    assert S.cron_command(command) == (shell, stdin)


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
    out = S.with_line(FOREIGN, "nightly", "0 2 * * * x # clusterddp:nightly")
    assert out == FOREIGN + "0 2 * * * x # clusterddp:nightly\n"
    assert [e.name for e in S.entries(out)] == ["nightly"]  # the commented-out one is not an entry


def test_odd_characters_in_foreign_lines_survive():
    text = "0 1 * * * echo a\rb\x0cc\x85d\u2028e\r\n@daily true\n"
    out = S.with_line(text, "n", "1 * * * * y # clusterddp:n")
    assert out == text + "1 * * * * y # clusterddp:n\n" and S.without_line(out, "n") == text


def test_with_line_adds_a_final_newline_cron_needs():
    assert S.with_line("@daily true", "n", "1 * * * * y # clusterddp:n") == "@daily true\n1 * * * * y # clusterddp:n\n"
    assert S.with_line("", "n", "1 * * * * y # clusterddp:n") == "1 * * * * y # clusterddp:n\n"


def test_existing_name_needs_replace_and_is_replaced_in_place():
    text = S.with_line(FOREIGN, "a", "0 2 * * * x # clusterddp:a") + "@hourly tail\n"
    with pytest.raises(UsageError, match="already exists") as e:
        S.with_line(text, "a", "5 5 * * * y # clusterddp:a")
    assert "--replace" in str(e.value)
    out = S.with_line(text, "a", "5 5 * * * y # clusterddp:a", replace=True)
    assert out == FOREIGN + "5 5 * * * y # clusterddp:a\n@hourly tail\n"


def test_without_line_removes_only_the_entry():
    text = S.with_line(S.with_line(FOREIGN, "a", "0 2 * * * x # clusterddp:a"), "b", "0 3 * * * y # clusterddp:b")
    assert S.without_line(text, "a") == FOREIGN + "0 3 * * * y # clusterddp:b\n"
    assert S.without_line(S.without_line(text, "a"), "b") == FOREIGN
    with pytest.raises(UsageError, match="no schedule 'c'"):
        S.without_line(text, "c")


def test_parse_line_reads_back_name_expression_and_runs_dir():
    (e,) = S.entries("MAILTO=x\n" + GOLDEN + "\n")
    assert (e.name, e.cron, e.index, e.runs_dir) == ("nightly", "0 2 * * *", 1, "/srv/runs")
    assert e.log_path == "/srv/runs/schedules/nightly.log"
    assert e.command == GOLDEN[len("0 2 * * * "):]
    (k,) = S.entries("@daily  echo hi   # clusterddp:k")
    assert (k.cron, k.runs_dir) == ("@daily", None)
    assert S.entries("X=1 # clusterddp:y\n#0 2 * * * a # clusterddp:z\n") == []


def test_cron_environment_is_cron_s_own_plus_the_lines_above():
    text = FOREIGN + "0 2 * * * x # clusterddp:a\nLATER=1\n"
    entry = S.find(text, "a")
    user = pwd.getpwuid(os.getuid())
    env = S.cron_environment(text, entry, user)
    assert env == {"HOME": "/tmp/x", "LOGNAME": user.pw_name, "SHELL": "/bin/sh", "PATH": "/usr/bin:/bin",
                   "MAILTO": ""}


# ---- the store's schedule queries ----

def test_store_last_run_and_skips(tmp_path):
    store = RunStore(tmp_path / "runs")
    assert store.last_run("n") is None and store.skips("n") == []
    assert not (tmp_path / "runs").exists()  # reading creates nothing
    for rid, started, sched in [("r1", "2026-11-29T01:00:00+00:00", "n"), ("r2", "2026-11-29T02:00:00+00:00", "n"),
                                ("r3", "2026-11-29T03:00:00+00:00", "other"), ("r4", "2026-11-29T04:00:00+00:00", None)]:
        store.create(make_record(rid, (), status=RunStatus.SUCCEEDED, started_at=started, schedule=sched))
    assert store.last_run("n")["run_id"] == "r2" and store.last_run("zzz") is None
    store.record_skip("n", "busy", holder="r2")
    store.record_skip("n", "busy again")
    assert [(s["reason"], s["holder"]) for s in store.skips("n")] == [("busy again", None), ("busy", "r2")]
    assert store.skips("other") == []
    assert [r["run_id"] for r in store.list()] == ["r4", "r3", "r2", "r1"]  # skips are not runs


def test_cli_import_loads_no_cron_library():
    code = ("import sys, clusterddp.cli.app; "
            "print(sorted(m for m in ('croniter', 'crontab', 'pydantic', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
