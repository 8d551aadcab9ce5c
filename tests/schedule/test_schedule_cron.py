"""Scheduled runs on the real system cron: root's crontab through `crontab`, and the cron daemon.

Every test saves root's crontab first and puts it back afterwards. Runs are real `up local`
runs of a one-process script. Only one test waits for the daemon itself (it fires once a
minute), so it carries every hostile word; the others start entries with `schedule run` (the
project's copy of cron's rules), which goes through the same line and `schedule fire`.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clusterddp import schedule as schedules
from clusterddp.store import RunStore
from helpers import cddp, eventually, record

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("crontab"),
                       reason="needs root and Debian's cron package (scripts/install-system-deps.sh)"),
]

# Foreign lines that must survive every edit byte for byte (the odd spacing, the %, the env lines).
FOREIGN = """# root's own jobs, not clusterddp's
MAILTO=""
CDDP_TEST_FOREIGN=1
0  0 1 1 *   echo   'a%b' \\% x > /dev/null   # keep me
@yearly /bin/true
"""

SCRIPT = """\
import os, sys
import torch.distributed as dist
dist.init_process_group("gloo")
print("cwd", os.getcwd(), flush=True)
print("path0", os.environ["PATH"].split(":")[0], flush=True)
print("leak", os.environ.get("CDDP_LEAK"), "foreign", os.environ.get("CDDP_TEST_FOREIGN"), flush=True)
print("args", sys.argv[1:], flush=True)
dist.barrier()
dist.destroy_process_group()
"""

# Holds its run open until the file named by argv[1] exists (at most a minute).
HOLD = """\
import os, sys, time
deadline = time.time() + 60
while not os.path.exists(sys.argv[1]) and time.time() < deadline:
    time.sleep(0.1)
print("released", flush=True)
"""


CRON_PID = Path("/run/crond.pid")


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def crontab_l() -> str:
    r = subprocess.run(["crontab", "-l"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.fixture
def crontab():
    """Root's crontab set to FOREIGN for the test; whatever was there before comes back after.

    Test sessions running at once on this machine take turns (there is one root crontab); the
    wait has a deadline below the test's own timeout, and its error names the session holding it.
    """
    with open("/tmp/clusterddp-tests-crontab.lock", "a+") as turn:
        schedules.lock_within(turn.fileno(), turn.name, 240, "another test session is using root's crontab")
        yield from _foreign_crontab()


def _foreign_crontab():
    saved = subprocess.run(["crontab", "-l"], capture_output=True, text=True)
    assert saved.returncode == 0 or "no crontab for" in saved.stderr, saved.stderr
    subprocess.run(["crontab", "-"], input=FOREIGN, text=True, check=True)
    try:
        yield
    finally:
        if saved.returncode == 0:
            subprocess.run(["crontab", "-"], input=saved.stdout, text=True, check=True)
        else:
            subprocess.run(["crontab", "-r"], check=True)


@pytest.fixture
def work(tmp_path) -> Path:
    """The folder `schedule add` runs in, with the training scripts."""
    w = tmp_path / "work"
    w.mkdir()
    (w / "t.py").write_text(SCRIPT)
    (w / "hold.py").write_text(HOLD)
    return w


def add(work: Path, name: str, *args: str, cron: str = "0 2 * * *", rc: int = 0) -> subprocess.CompletedProcess:
    return cddp("schedule", "add", name, "--cron", cron, *args, cwd=work, check_rc=rc, timeout=60)


def test_add_list_replace_remove_keep_foreign_lines(crontab, work):
    r = add(work, "nightly", "local", "t.py", "--gpus", "1", "--runs-dir", "runs", "--", "--lr", "0.1")
    assert r.stdout.startswith("added schedule nightly: 0 2 * * *\n  next:  ")
    tab = crontab_l()
    assert tab.startswith(FOREIGN)
    (line,) = tab[len(FOREIGN):].splitlines()
    bin_dir, runs = Path(sys.executable).parent, work / "runs"
    spec_file = runs / "schedules" / "nightly.json"
    assert line == (f"0 2 * * * {{ cd {work} && PATH={schedules.search_path(str(bin_dir))} {bin_dir / 'clusterddp'} "
                    f"schedule fire {spec_file} ; }} >> {runs / 'schedules' / 'nightly.log'} 2>&1 # clusterddp:nightly")
    spec = schedules.load_spec(str(spec_file))
    assert schedules.up_argv(spec) == [
        str(bin_dir / "clusterddp"),
        "up",
        "local",
        str(work / "t.py"),
        "--runs-dir",
        str(runs),
        "--schedule",
        "nightly",
        "--gpus",
        "1",
        "--",
        "--lr",
        "0.1",
    ]
    assert (spec.cron, spec.launch_dir, spec.bin_dir) == ("0 2 * * *", str(work), str(bin_dir))
    assert f"  spec:  {spec_file}\n" in r.stdout

    r = add(work, "nightly", "local", "t.py", cron="5 * * * *", rc=2)
    assert "schedule 'nightly' already exists" in r.stderr and "--replace" in r.stderr
    assert crontab_l() == tab and schedules.load_spec(str(spec_file)) == spec  # neither line nor spec touched

    r = add(work, "nightly", "local", "t.py", "--replace", cron="30 4 * * 1")
    assert r.stdout.startswith("replaced schedule nightly: 30 4 * * 1\n")
    add(work, "weekly", "local", "t.py", cron="@weekly")
    tab = crontab_l()
    assert tab.startswith(FOREIGN)
    lines = tab[len(FOREIGN):].splitlines()
    assert [x.split(" { cd ")[0] for x in lines] == ["30 4 * * 1", "@weekly"]  # replaced in place
    assert (
        schedules.load_spec(str(spec_file)).run.script_args == ()
        and schedules.load_spec(str(spec_file)).cron == "30 4 * * 1"
    )

    r = cddp("schedule", "list", check_rc=0, timeout=60)
    out = r.stdout.splitlines()
    assert re.match(r"NAME +CRON +NEXT RUNS \(\w+\) +LAST FIRED +OUTCOME +RUN +SKIPS$", out[0])
    date = r"\d{4}-\d\d-\d\d \d\d:\d\d"
    assert re.match(rf"nightly +30 4 \* \* 1 +({date}  ){{2}}{date} +- +- +- +0$", out[1]), out[1]
    assert re.match(rf"weekly +@weekly +({date}  ){{2}}{date} +- +- +- +0$", out[2]), out[2]
    assert len(out) == 3 and all(" 04:30" in d for d in re.findall(date, out[1]))

    assert cddp("schedule", "remove", "nightly", check_rc=0).stdout == "removed schedule nightly\n"
    assert crontab_l() == FOREIGN + lines[1] + "\n"
    assert sorted(p.name for p in (runs / "schedules").iterdir()) == ["weekly.json"]  # its spec went with it
    cddp("schedule", "remove", "weekly", check_rc=0)
    assert crontab_l() == FOREIGN
    r = cddp("schedule", "remove", "weekly", check_rc=2)
    assert "no schedule 'weekly'" in r.stderr


def test_ssh_inventory_without_key_warns_that_cron_has_no_agent(crontab, work):
    (work / "inv.yaml").write_text("hosts:\n  - {name: gpu-01, address: gpu-01.invalid}\n"
                                   "  - {name: gpu-02, address: gpu-02.invalid, identity_file: ~/.ssh/lab}\n")
    r = add(work, "a", "inv.yaml", "t.py", "--runs-dir", "runs")
    assert "cron runs without your ssh-agent, and gpu-01 has no identity_file" in r.stderr
    assert "--agent-socket" in r.stderr and "gpu-02" not in r.stderr
    spec = schedules.load_spec(str(work / "runs" / "schedules" / "a.json"))
    assert (spec.inventory, spec.run.script, spec.agent_socket) == (str(work / "inv.yaml"), str(work / "t.py"), None)
    r = add(work, "b", "inv.yaml", "t.py", "--hosts", "gpu-02", "--runs-dir", "runs")
    assert "ssh-agent" not in r.stderr  # the chosen host has a key
    r = add(work, "c", "inv.yaml", "t.py", "--runs-dir", "runs", "--agent-socket", "agent.sock")
    assert "ssh-agent" not in r.stderr and "is not a socket now" in r.stderr
    assert schedules.load_spec(str(work / "runs" / "schedules" / "c.json")).agent_socket == str(work / "agent.sock")
    assert [p.name for p in (work / "runs").iterdir()] == ["schedules"]  # adding plans a run but starts none


@pytest.mark.parametrize("args, words", [
    (["n", "--cron", "* * * * * *", "local", "t.py"], "expected 5 fields"),
    (["n", "--cron", "61 * * * *", "local", "t.py"], "minute field: '61' is out of range"),
    (["n", "--cron", "0 0 31 2 *", "local", "t.py"], "never fires"),
    (["n", "--cron", "@reboot", "local", "t.py"], "unsupported keyword"),
    (["n", "--cron", "0 0 L * *", "local", "t.py"], "not valid for cron"),
    (["bad name", "--cron", "@daily", "local", "t.py"], "schedule name 'bad name'"),
    (["n", "--cron", "@daily", "local", "missing.py"], "script missing.py: no such file"),
    (["n", "--cron", "@daily", "nope.yaml", "t.py"], "nope.yaml: no such file"),
    (["n", "--cron", "@daily", "local", "t.py", "-e", "NOEQUALS"], "NOEQUALS: not set in this environment"),
    (["n", "--cron", "@daily", "local", "t.py", "--gpus", "0"], "--gpus"),
])
def test_bad_input_exits_2_and_writes_nothing(crontab, work, args, words):
    r = cddp("schedule", "add", *args, "--runs-dir", "runs", cwd=work, timeout=60)
    assert r.returncode == 2 and words in r.stderr, r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert crontab_l() == FOREIGN and not (work / "runs").exists()


@pytest.mark.parametrize("args", [["run", "nope"], ["remove", "nope"], ["run", "a/b"]])
def test_unknown_schedule_exits_2(crontab, args):
    r = cddp("schedule", *args, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "error:" in r.stderr, r.stderr
    assert crontab_l() == FOREIGN


def test_schedule_run_runs_the_entry_as_cron_would(crontab, work, tmp_path):
    add(work, "nightly", "local", "t.py", "--gpus", "1", "-e", "OMP_NUM_THREADS=1", "--runs-dir", "runs",
        "--", "%d 100%", "it's")
    # From another folder, with a variable cron would not have: neither may reach the run.
    r = cddp("schedule", "run", "nightly", cwd=tmp_path, env={"CDDP_LEAK": "1"}, check_rc=0)
    run_id = re.search(r"^run (\S+)$", r.stdout, re.M).group(1)
    assert f"[local] cwd {work}\n" in r.stdout
    assert f"[local] path0 {Path(sys.executable).parent}\n" in r.stdout
    assert "[local] leak None foreign 1\n" in r.stdout  # the crontab's own NAME=value lines do apply
    assert "[local] args ['%d 100%', \"it's\"]\n" in r.stdout
    rec = record(work / "runs", run_id)
    assert rec["status"] == "succeeded" and rec["schedule"] == "nightly"
    log = (work / "runs" / "schedules" / "nightly.log").read_text()
    assert f"run {run_id} succeeded" in log and "[local] leak None" in log

    out = cddp("schedule", "list", check_rc=0).stdout.splitlines()[1]
    assert re.search(rf" \d\d:\d\d +succeeded +{run_id} +0$", out), out
    assert f"schedule nightly: succeeded (run {run_id})" in log  # what the firing came to, last in the log
    runs = cddp("runs", "--runs-dir", str(work / "runs"), check_rc=0).stdout
    assert any(run_id in x and "nightly" in x for x in runs.splitlines()), runs


def test_overlapping_run_is_skipped_and_recorded(crontab, work):
    release = work / "release"
    add(work, "hold", "local", "hold.py", "--gpus", "1", "--runs-dir", "runs", "--", str(release))
    store = RunStore(work / "runs")
    first = subprocess.Popen([sys.executable, "-m", "clusterddp", "schedule", "run", "hold"], text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        holder = eventually(lambda: store.last_run("hold"), timeout=60)
        assert holder and holder["status"] == "running"

        r = cddp("schedule", "run", "hold", timeout=60)
        assert r.returncode == schedules.LOCK_HELD_EXIT == 3, r.stdout + r.stderr  # not 75: the GPU slots' (`up`'s)
        assert "skipped, its previous run still holds the schedule's lock" in r.stderr and "GPU" not in r.stderr
        (skip,) = store.skips("hold")
        assert (skip["outcome"], skip["holder"], skip["run_id"]) == ("skipped: lock held", holder["run_id"], None)
        assert f"schedule hold: skipped: lock held: the previous run {holder['run_id']} still holds" in r.stdout
        assert [x["run_id"] for x in store.list()] == [holder["run_id"]]  # nothing else started
        listed = cddp("schedule", "list", check_rc=0).stdout.splitlines()[1]
        assert re.search(rf" skipped: lock held +{holder['run_id']} +1$", listed), listed  # the run that held it
    finally:
        release.touch()
        out, _ = first.communicate(timeout=120)
    assert first.returncode == 0, out
    assert store.load(holder["run_id"]).status == "succeeded"
    log = (work / "runs" / "schedules" / "hold.log").read_text()
    assert log.count("schedule hold: skipped") == 1 and f"run {holder['run_id']} succeeded" in log
    assert f"schedule hold: succeeded (run {holder['run_id']})" in log

    r = cddp("schedule", "run", "hold", check_rc=0)  # the lock went with the run
    again = re.search(r"^run (\S+)$", r.stdout, re.M).group(1)
    assert again != holder["run_id"] and store.last_run("hold")["status"] == "succeeded"
    assert len(store.skips("hold")) == 1
    assert re.search(rf" succeeded +{again} +1$", cddp("schedule", "list", check_rc=0).stdout, re.M)


def test_an_env_secret_is_in_no_crontab_line_only_in_the_0600_spec_file(crontab, work):
    secret = "hf_" + secrets.token_hex(8)
    add(work, "tok", "local", "t.py", "-e", f"HF_TOKEN={secret}", "--runs-dir", "runs", "--", "--token", secret)
    assert "tok" in crontab_l() and secret not in crontab_l()
    spec_file = work / "runs" / "schedules" / "tok.json"
    assert [p for p in work.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()] == [spec_file]
    assert spec_file.stat().st_mode & 0o777 == 0o600 and spec_file.parent.stat().st_mode & 0o777 == 0o700
    spec = schedules.load_spec(str(spec_file))  # carried, not dropped
    assert ("HF_TOKEN", secret) in spec.run.env and spec.run.script_args == ("--token", secret)


# Words that must reach the script unchanged from `schedule add` through the spec file, cron's
# line and `schedule fire`: cron's `%` (end of command, and `\%` its escape), a backslash right
# before a `%`, the shell's quotes, expansions and operators, a newline (no line could hold one).
HOSTILE = ("50%", "a%b%c", "%", "a\\%b", "\\", "it's", '"dq"', "$(touch /tmp/pwned-cron)",
           "`touch /tmp/pwned-cron`", "a;b|c&d", "*", "", "naïve ü", "two\nlines")
HOSTILE_ENV = tuple((f"W{i}", w) for i, w in enumerate(
    ("50%", "a%b%c", "a\\%b", "it's", '"dq"', "$(touch /tmp/pwned-cron)", "*", "", "\\", "naïve ü", "l1\nl2")))

# Writes the raw bytes of its arguments and of the W<n> (and secret, and agent) variables it received.
SEEN = """\
import json, os, re, sys
env = {k.decode(): v.hex() for k, v in os.environb.items() if re.fullmatch(rb"W[0-9]+|SECRET_TOKEN|SSH_AUTH_SOCK", k)}
with open("seen.json", "w") as f:
    json.dump({"argv": [os.fsencode(a).hex() for a in sys.argv[1:]], "env": env}, f)
"""


def seen(folder: Path) -> tuple[list[bytes], dict[str, bytes]]:
    d = json.loads((folder / "seen.json").read_text())
    return [bytes.fromhex(a) for a in d["argv"]], {k: bytes.fromhex(v) for k, v in d["env"].items()}


@pytest.mark.slow
@pytest.mark.timeout(330)
def test_cron_daemon_runs_a_schedule_with_hostile_words_byte_for_byte(crontab, tmp_path_factory):
    """The real thing: cron itself fires a `* * * * *` entry (within about a minute), and the
    script gets every argument and -e value exactly, with nothing in them executed."""
    pwned = Path("/tmp/pwned-cron")
    pwned.unlink(missing_ok=True)
    work = tmp_path_factory.mktemp("cron 50%")  # the line names this folder: a space and a % in it
    (work / "seen.py").write_text(SEEN)
    env_args = [a for k, v in HOSTILE_ENV for a in ("-e", f"{k}={v}")]
    add(work, "every-minute", "local", "seen.py", "--gpus", "1", "-e", "OMP_NUM_THREADS=1", *env_args,
        "--runs-dir", "runs", "--", *HOSTILE, cron="* * * * *")
    store = RunStore(work / "runs")
    daemon = None
    if not schedules.cron_daemon_running():
        daemon = subprocess.Popen(["/usr/sbin/cron", "-f"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True)
        # cron writes its pid file once it holds the daemon lock, past the checks that make it quit
        eventually(lambda: daemon.poll() is not None or _read(CRON_PID) == f"{daemon.pid}\n", timeout=30,
                   interval=0.05)
        assert daemon.poll() is None, f"cron did not start: {daemon.communicate()[0]}"
    try:
        run = eventually(lambda: store.last_run("every-minute"), timeout=150, interval=0.25)
        assert run, "cron started no run within 150s"
        cddp("schedule", "remove", "every-minute", check_rc=0)  # no second run next minute
        done = eventually(lambda: store.last_run("every-minute")["status"] != "running", timeout=90, interval=0.25)
        rec = store.load(run["run_id"])
        log_file = work / "runs" / "schedules" / "every-minute.log"
        # the outcome is recorded before the end-of-run collect (issue 40); the log's last line follows it
        said = eventually(lambda: f"run {run['run_id']} succeeded" in log_file.read_text(), timeout=90, interval=0.25)
        log = log_file.read_text()
        assert done and rec.status == "succeeded", f"{rec}\n{log}"
        assert rec.schedule == "every-minute" and rec.launch_dir == str(work)
        assert said, log
        argv, env = seen(work)
        assert argv == [w.encode() for w in HOSTILE]
        assert env == {k: v.encode() for k, v in HOSTILE_ENV}
        assert not pwned.exists()
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait(timeout=10)
        # a run cron may have started meanwhile must end before its folder goes away
        eventually(lambda: all(r["status"] != "running" for r in store.list()), timeout=90, interval=0.25)
