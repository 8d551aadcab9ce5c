"""The launcher's reader of node answers (clusterddp/node/reply.py): the marked line among what a
login shell prints, strict bounded JSON, node text kept to one line; and `status` read through it."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from clusterddp import inventory, plan
from clusterddp.node import reply
from clusterddp.node.reply import STATUS_MARK, ReplyError, parse_status
from clusterddp.nodescript import MARKER
from clusterddp.runspec import RunSpec
from clusterddp.store import new_run_id
from helpers import resolved


@pytest.mark.parametrize("text, parsed", [
    ("Welcome to gpu-01!\nLast login: today\n" + STATUS_MARK + "running\n", ("running", None)),
    ("Welcome...\nrunning\n", ("garbled", None)),       # an unmarked answer is no answer
    ("motd\r\n" + STATUS_MARK + "exit 3\r\n", ("exited", 3)),
    ("x " + STATUS_MARK + "running\n", ("garbled", None)),  # the mark inside a banner line is not a mark
    (STATUS_MARK + "running\n" + STATUS_MARK + "exit 0\n", ("garbled", None)),  # two answers: neither trusted
    ("banner\n" * 10_000 + STATUS_MARK + "running\n", ("garbled", None)),  # over the bound
    (STATUS_MARK + "running" + " " * 100, ("garbled", None)),
])
def test_status_is_the_marked_line_whatever_the_login_shell_printed(text, parsed):
    assert parse_status(text) == parsed


def test_the_status_command_run_by_a_shell_that_prints_a_banner_is_read(tmp_path):
    """bash with a banner first, as a login shell's rc file prints it: today read as garbled (lost)."""
    base = inventory.local(python=sys.executable).hosts[0]
    inv = inventory.Inventory("t", "t", (replace(base, name="a", workdir=str(tmp_path)),),
                              inventory.Master("a", "127.0.0.1", 29500))
    node = plan.build_plan(inv, resolved(RunSpec("t.py"), inv), new_run_id()).nodes[0]
    Path(node.control_dir).mkdir(parents=True)
    (Path(node.control_dir) / "exit_code").write_text("7\n")

    def status(cmd: str) -> tuple[str, int | None]:
        out = subprocess.run(["bash", "-c", "echo 'Welcome to node a'; echo; " + cmd], capture_output=True,
                             text=True, timeout=30).stdout
        return parse_status(out)
    assert status(plan.status_command(node)) == ("exited", 7)
    (Path(node.control_dir) / "exit_code").unlink()
    assert status(plan.status_command(node)) == ("lost", None)
    assert status(plan.status_command(replace(node, control_dir=str(tmp_path / "gone")))) == ("missing", None)


def test_marked_finds_the_one_marked_line_and_bounds_it():
    assert reply.marked("a\nM x\r\nb", "M ", 10) == "x"
    assert reply.marked("M x", "M ", 10) == "x" and reply.marked("no mark", "M ", 10) is None
    with pytest.raises(ReplyError, match="over 3"):
        reply.marked("M 1234", "M ", 3)
    with pytest.raises(ReplyError, match="more than one"):
        reply.marked("M 1\nM 2\n", "M ", 3)


def test_deep_json_is_refused_in_linear_time_not_a_recursion_error():
    with pytest.raises(ReplyError, match="nested over"):
        reply.loads("[" * 50_000 + "]" * 50_000)
    inside = '{"a": "' + "[" * 100 + '\\"{"}'
    assert reply.loads(inside) == {"a": "[" * 100 + '"{'}  # brackets in a string nest nothing
    for bad in ("NaN", '{"a": Infinity}', "{", '"\\ud800'):
        with pytest.raises(ReplyError):
            reply.loads(bad)


def test_node_text_is_kept_to_one_line():
    assert reply.one_line("import torch failed\nPASS: all 2 host(s) ready") == \
        "import torch failed\\nPASS: all 2 host(s) ready"
    assert reply.one_line("a\\nb\r") == "a\\\\nb\\r" and reply.one_line("plain") == "plain"


HOLD = r'''
import os, time
os.write(1, f"rank {os.environ['RANK']} ready\n".encode())
time.sleep(600)
'''


@pytest.mark.integration
def test_status_of_a_running_job_on_a_node_whose_login_shell_prints_a_banner(tmp_path_factory, tmp_path):
    """"Welcome...\\nrunning" was read as garbled: the run recorded failed for good, the node lost."""
    from helpers import cddp, eventually, job_pids, job_script, run_id_of
    from testbed import TestBed, require_bed, session_slot
    require_bed()
    slot = session_slot()
    banner = 'echo "Welcome to $(hostname), a node with a banner"\necho\n'
    with TestBed(1, tmp_path_factory.mktemp("bannerbed"), prefix=f"cd{slot}r", subnet=f"10.{100 + slot}.50",
                 login_rc=banner) as bed:
        inv = bed.write_inventory(tmp_path / "inv.yaml")
        runs = tmp_path / "runs"
        hold = job_script(tmp_path, "hold.py", HOLD)
        run_id = run_id_of(cddp("up", str(inv), str(hold), "--runs-dir", str(runs), "--gpus", "1", "--detach",
                                check_rc=0, timeout=180).stdout)
        try:
            assert eventually(lambda: len(job_pids(run_id)) >= 2, 90)
            st = cddp("status", run_id, "--runs-dir", str(runs), check_rc=0, timeout=120).stdout
            assert "node1: running" in st, st
            assert '"status": "running"' in (runs / run_id / "run.json").read_text()
        finally:
            cddp("stop", run_id, "--runs-dir", str(runs), "--grace", "2", timeout=120)
        assert eventually(lambda: not job_pids(run_id), 30)


def test_teardown_reads_its_word_after_a_login_banner(tmp_path):
    """A banner first made the teardown's word "Welcome", so a stopped job did not read as ended."""
    import os

    from clusterddp import nodeops
    from clusterddp.transport import CommandResult
    base = inventory.local(python=sys.executable).hosts[0]
    inv = inventory.Inventory("t", "t", (replace(base, name="a", workdir=str(tmp_path)),),
                              inventory.Master("a", "127.0.0.1", 29500))
    node = plan.build_plan(inv, resolved(RunSpec("t.py"), inv), new_run_id()).nodes[0]
    Path(node.control_dir).mkdir(parents=True)

    class Bannered:
        def run(self, command: str, timeout=None, stdin=None) -> CommandResult:
            p = subprocess.run(["bash", "-c", "echo 'Welcome to node a'; echo; " + command], capture_output=True,
                               timeout=60)
            return CommandResult(p.returncode, p.stdout, p.stderr)
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                           env={**os.environ, MARKER: node.marker})
    try:
        td = nodeops.teardown(Bannered(), node, grace=5)  # type: ignore[arg-type]
    finally:
        job.kill()
        job.wait()
    assert td.word == "terminated" and td.ended_it, td
