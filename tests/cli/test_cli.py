"""The CLI contract: exit codes, messages for bad input, dry-run, `up local` with real torchrun."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, cddp, cddp_popen, record, run_id_of

GOOD_INV = "hosts:\n  - {name: gpu-01, address: gpu-01.invalid}\n  - {name: gpu-02, address: gpu-02.invalid}\n"


@pytest.fixture
def script(tmp_path) -> Path:
    s = tmp_path / "t.py"
    s.write_text("print('hi')\n")
    return s


def test_help_is_fast_and_imports_no_heavy_library():
    code = ("import sys, clusterddp.cli.app as a; "
            "print(sorted(m for m in ('paramiko', 'torch', 'pydantic', 'yaml') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_version_is_the_one_in_the_package_and_the_built_metadata():
    import tomllib

    import clusterddp
    r = cddp("--version", check_rc=0)
    assert r.stdout == f"clusterddp {clusterddp.__version__}\n" and r.stderr == ""
    # one place: pyproject.toml reads it from the package, it does not say it again
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "clusterddp.__version__"}
    # the changelog's newest heading names it
    assert f"({clusterddp.__version__})" in (REPO / "CHANGELOG.md").read_text().split("\n## ", 2)[1].splitlines()[0]


def test_quick_exit_flushes_buffered_output_and_keeps_the_exit_code_only_when_asked():
    # exec ends with os._exit (skipping the interpreter's teardown): what sits in stdout's and
    # stderr's buffers must still come out, and the exit status must be the command's.
    def run(body: str) -> subprocess.CompletedProcess:
        code = ("import sys\nfrom clusterddp.cli.common import exit_quickly_when_done, quick_exit\n"
                "for _ in range(7000): sys.stdout.write('x' * 10)\nsys.stderr.write('tail without a newline')\n" + body)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # buffered, as on a pipe
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    r = run("exit_quickly_when_done()\nimport atexit; atexit.register(print, 'atexit ran')\nquick_exit(3)\n"
            "print('not reached')")
    assert (r.returncode, len(r.stdout), r.stderr) == (3, 70000, "tail without a newline")
    r = run("quick_exit(3)\nprint('normal exit')")  # not asked: returns, Python exits as usual
    assert r.returncode == 0 and r.stdout.endswith("normal exit\n")
    r = run("exit_quickly_when_done()\nquick_exit('a message')\nprint('normal exit')")  # not an exit status
    assert r.returncode == 0 and r.stdout.endswith("normal exit\n")


def test_a_finished_up_ends_without_the_interpreters_teardown_and_keeps_everything(tmp_path):
    # Once `up` has recorded, told and printed its run, os._exit ends it: the teardown of paramiko's and
    # the nodes' threads took 0.11-0.14 s after every run. Its output and record must all be there.
    (tmp_path / "t.py").write_text("print('trained')\n")
    code = ("import atexit, sys\natexit.register(print, 'atexit ran')\n"
            "sys.argv = ['clusterddp', 'up', 'local', 't.py', '--gpus', '1', '--runs-dir', 'runs']\n"
            "from clusterddp.cli.app import main\nmain()\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # buffered, as on a pipe
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "atexit ran" not in r.stdout and "trained" in r.stdout and "succeeded" in r.stdout, r.stdout
    assert record(tmp_path / "runs", run_id_of(r.stdout))["status"] == "succeeded"
    bad = subprocess.run([sys.executable, "-c", code.replace("'t.py'", "'missing.py'")], capture_output=True,
                         text=True, cwd=tmp_path, env=env, timeout=300)
    assert bad.returncode == 2 and "atexit ran" in bad.stdout  # bad input: Python exits as usual


@pytest.mark.parametrize("inv_text, words", [
    ("hosts:\n  - name: a\n    gpus: -2\n", "inv.yaml:3: hosts[0].gpus: must be >= 1"),
    ("hosts: [\n", "inv.yaml:2: not valid YAML"),
    ("hosts:\n  - name: a\n    colour: red\n", "hosts[0].colour: unknown key"),
])
def test_bad_inventory_exits_2_with_located_message(tmp_path, script, inv_text, words):
    (tmp_path / "inv.yaml").write_text(inv_text)
    r = cddp("up", "inv.yaml", str(script), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert r.returncode == 2 and words in r.stderr, r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert not (tmp_path / "runs").exists()  # nothing written for bad input


@pytest.mark.parametrize("args, words", [
    (["up", "inv.yaml", "missing.py"], "script missing.py: no such file"),
    (["up", "nope.yaml", "t.py"], "nope.yaml: no such file"),
    (["up", "inv.yaml", "t.py", "-e", "NOEQUALS"], "NOEQUALS: not set in this environment"),
    (["up", "inv.yaml", "t.py", "-e", "@nope.env"], "-e @nope.env: cannot read it"),
    (["up", "inv.yaml", "t.py", "--hosts", "gpu-09"], "--hosts names gpu-09"),
    (["up", "inv.yaml", "t.py", "--gpus", "0"], "--gpus"),
])
def test_bad_arguments_exit_2(tmp_path, script, args, words):
    (tmp_path / "inv.yaml").write_text(GOOD_INV)
    r = cddp(*args, cwd=tmp_path)
    assert r.returncode == 2 and words in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_dry_run_prints_every_node_and_contacts_nobody(tmp_path, script):
    (tmp_path / "inv.yaml").write_text(GOOD_INV)
    r = cddp("up", "inv.yaml", "t.py", "--runs-dir", "runs", "--dry-run", "--", "--lr", "0.1 x", cwd=tmp_path,
             check_rc=0, timeout=30)
    run_id = run_id_of(r.stdout)
    assert "== gpu-01 (node 0, gpu-01.invalid) ==" in r.stdout and "== gpu-02 (node 1" in r.stdout
    assert "--node-rank 1 --master-addr gpu-01.invalid" in r.stdout and "t.py --lr '0.1 x'" in r.stdout
    assert not (tmp_path / "runs").exists() and run_id


def test_up_local_runs_real_torchrun(tmp_path):
    runs = tmp_path / "runs"
    r = cddp("up", "local", str(REPO / "examples" / "ddp_train.py"), "--gpus", "2", "--runs-dir", str(runs),
             "--collect", "checkpoints/**", "--notify", f"command:cat >> {tmp_path / 'told.json'}",
             "--", "--epochs", "1", "--checkpoint-dir", "checkpoints", cwd=tmp_path, check_rc=0)
    run_id = run_id_of(r.stdout)
    assert "[local] done world_size=2" in r.stdout
    (told,) = [json.loads(line) for line in (tmp_path / "told.json").read_text().splitlines()]  # notified once
    assert (told["event"], told["run_id"], told["exit_code"], told["hosts"]) == ("succeeded", run_id, 0, ["local"])
    rec = record(runs, run_id)
    assert rec["status"] == "succeeded" and rec["nodes"][0]["host"] == "local" and rec["nodes"][0]["exit_code"] == 0
    assert (tmp_path / "checkpoints").is_dir()  # ran in the current directory
    assert list((runs / run_id / "artifacts" / "local" / "checkpoints").glob("step-*.pt"))
    assert "done world_size=2" in (runs / run_id / "logs" / "local.log").read_text()


def test_up_local_failure_exits_1_and_names_the_host(tmp_path):
    (tmp_path / "bad.py").write_text("import sys; print('about to fail'); sys.exit(7)\n")
    r = cddp("up", "local", "bad.py", "--gpus", "1", "--runs-dir", "runs", cwd=tmp_path, check_rc=1)
    rec = record(tmp_path / "runs", run_id_of(r.stdout))
    assert rec["status"] == "failed" and rec["failed_host"] == "local"
    assert "local failed first" in r.stderr and "[local] about to fail" in r.stdout


def test_up_local_restarts_a_crashed_rank_from_its_checkpoint(tmp_path):
    r = cddp("up", "local", str(REPO / "examples" / "ddp_train.py"), "--gpus", "2", "--max-restarts", "1",
             "--runs-dir", "runs", "--", "--epochs", "3", "--crash-at-epoch", "2", "--crash-rank", "1",
             cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "rank 1: simulated crash at epoch 2" in r.stdout
    assert "[local] resumed from step" in r.stdout and "[local] done world_size=2" in r.stdout


MEET = """import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
time.sleep(1)  # two runs started together overlap
print(f"met at {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} sum={t.item():.0f}", flush=True)
dist.destroy_process_group()
"""


def test_up_local_runs_at_once_each_meet_on_a_port_of_their_own_and_record_it(tmp_path):
    (tmp_path / "meet.py").write_text(MEET)
    runs = tmp_path / "runs"
    procs = [cddp_popen("up", "local", "meet.py", "--gpus", "2", "--runs-dir", str(runs), cwd=tmp_path)
             for _ in range(2)]
    ports = set()
    for p in procs:
        out, _ = p.communicate(timeout=240)
        assert p.returncode == 0, out
        met = {line.split("met at ")[1] for line in out.splitlines() if "met at " in line}
        assert len(met) == 1, out  # both ranks met at one address
        addr_port, total = met.pop().split()
        assert total == "sum=2"
        rec = record(runs, run_id_of(out))
        assert addr_port == f"127.0.0.1:{rec['master']['port']}"  # the record says where the run met
        ports.add(rec["master"]["port"])
    assert len(ports) == 2


def test_up_local_takes_the_master_port_it_is_given_and_refuses_a_busy_one(tmp_path):
    (tmp_path / "meet.py").write_text(MEET)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        r = cddp("up", "local", "meet.py", "--gpus", "1", "--master-port", port, "--runs-dir", "runs", cwd=tmp_path,
                 check_rc=2)
        assert f"--master-port {port}: cannot listen on it" in r.stderr and "Traceback" not in r.stderr
        assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").glob("*/run.json"))
    r = cddp("up", "local", "meet.py", "--gpus", "1", "--master-port", port, "--runs-dir", "runs", cwd=tmp_path,
             check_rc=0)
    assert f"met at 127.0.0.1:{port} sum=1" in r.stdout


def test_an_empty_hosts_list_and_an_unwritable_runs_dir_are_bad_input(tmp_path, script):
    (tmp_path / "inv.yaml").write_text(GOOD_INV)
    r = cddp("up", "inv.yaml", "t.py", "--hosts", ",", cwd=tmp_path)
    assert r.returncode == 2 and "--hosts ',' names no host" in r.stderr
    (tmp_path / "afile").write_text("not a folder")
    r = cddp("up", "local", "t.py", "--runs-dir", "afile", cwd=tmp_path)
    assert r.returncode == 2 and "cannot create the run folder" in r.stderr and "Traceback" not in r.stderr


def test_a_damaged_run_record_exits_2_naming_file_and_field(tmp_path):
    runs = tmp_path / "runs"
    run_id = "20261129-181500-3f9a"
    (runs / run_id).mkdir(parents=True)
    rec = json.loads((REPO / "tests" / "fixtures" / "run-v0-ssh-status.json").read_text())
    rec["nodes"][1]["node_rank"] = "one"
    (runs / run_id / "run.json").write_text(json.dumps(rec))
    for cmd in ("status", "stop", "logs", "collect"):
        r = cddp(cmd, run_id[:10], "--runs-dir", str(runs), timeout=60)
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)
        assert f"{runs / run_id / 'run.json'}: nodes[1].node_rank: must be an integer, not a string 'one'" \
            in r.stderr, (cmd, r.stderr)
        assert "Traceback" not in r.stderr + r.stdout
    (runs / run_id / "run.json").write_text("{not json")
    r = cddp("status", run_id, "--runs-dir", str(runs), timeout=60)
    assert r.returncode == 2 and "run.json: not valid JSON" in r.stderr and "Traceback" not in r.stderr


def test_hosts_may_pick_each_hosts_gpus():
    from clusterddp.cli.common import host_slots
    from clusterddp.errors import UsageError
    assert host_slots(None) == (None, {})
    assert host_slots("a:1,0,b,c:2") == (["a", "b", "c"], {"a": (0, 1), "c": (2,)})
    assert host_slots("a,7") == (["a", "7"], {})  # a bare number after a host without `:` is a host name
    for bad, words in (("a:x", "'x' is not a GPU number for a"), ("a:0,0", "GPU 0 of a named twice"),
                       ("a:", "'' is not a GPU number")):
        with pytest.raises(UsageError, match=words):
            host_slots(bad)
