"""Text from nodes never reaches the terminal raw: control characters (all but newline and tab)
are shown as escapes (``\\x1b``) in `up`'s live stream, `logs`, error messages, `check` and
`status`; `--raw` passes the job's own bytes through for colours and pipes; files on disk keep
the raw bytes."""

from __future__ import annotations

import io

import pytest

from clusterddp.cli import common
from helpers import cddp, run_id_of

HOSTILE = "\x1b]0;pwned\x07 retitled, \x1b[2J cleared, \x1b[31mred\x1b[0m"
SHOWN = "\\x1b]0;pwned\\x07 retitled, \\x1b[2J cleared, \\x1b[31mred\\x1b[0m"


def test_visible_escapes_control_characters_but_newline_and_tab():
    assert common.visible(HOSTILE) == SHOWN
    assert common.visible("tab\tand\nnewline, é ü 日本, \x00\x08\x0d\x7f\x85\x9b") == \
        "tab\tand\nnewline, é ü 日本, \\x00\\x08\\x0d\\x7f\\x85\\x9b"
    assert common.visible("\udcff") == "\\udcff"  # a lone surrogate would not even encode
    assert common.visible_bytes(b"bad utf-8 \xff\xfe, \x1b[2J") == "bad utf-8 \\xff\\xfe, \\x1b[2J"


def test_the_prefix_printer_escapes_unless_raw():
    out = io.StringIO()
    p = common.PrefixPrinter(["a", "bb"], stream=out)
    p("a", HOSTILE.encode() + b"\r\n\x1b[2Jpartial")
    p.flush()
    assert out.getvalue() == f"[a ] {SHOWN}\n[a ] \\x1b[2Jpartial\n"

    class Terminal(io.StringIO):
        buffer = io.BytesIO()
    raw = Terminal()
    p = common.PrefixPrinter(["a"], stream=raw, raw=True)
    p("a", HOSTILE.encode() + b"\r\n")
    assert raw.buffer.getvalue() == b"[a] " + HOSTILE.encode() + b"\r\n"


def test_error_messages_are_escaped(capsys):
    from clusterddp.errors import HostError

    @common.handle_errors
    def fails() -> None:
        raise HostError("gpu-01", f"cannot start the job: {HOSTILE}")
    with pytest.raises(Exception) as e:
        fails()
    assert getattr(e.value, "exit_code", None) == 1
    assert capsys.readouterr().err == f"error: gpu-01: cannot start the job: {SHOWN}\n"


def test_check_output_and_status_lines_are_escaped(capsys):
    import json

    from clusterddp import inventory
    from clusterddp.check import evaluate
    from clusterddp.cli.check import print_report
    from clusterddp.cli.runs import _node_line
    from clusterddp.fleet import HostResult
    from clusterddp.node.probe import MARK
    from clusterddp.record import NodeState
    from clusterddp.transport import CommandResult
    from helpers import make_record

    inv = inventory.parse("hosts: [{name: a, address: 10.0.0.1}]\n", "inv.yaml")
    facts = {"python": "3.11\x1b[2J", "torch": "2.13.0", "torch_error": f"import torch failed: {HOSTILE}",
             "iface": "eth0\x1b]0;x\x07", "interfaces": ["eth0\x1b]0;x\x07"], "port_free": False,
             "port_error": HOSTILE, "disk_free": 100 << 30, "disk_path": "/d\x1b[2J", "time": 0}
    out = (MARK + json.dumps(facts) + "\n").encode()
    print_report(evaluate(inv, [HostResult("a", CommandResult(0, out, b""), None, 0, 0)]), 0.1)
    shown = capsys.readouterr().out
    assert "\x1b" not in shown and "\x07" not in shown
    assert f"FAIL a torch: python3: import torch failed: {SHOWN}" in shown
    assert f"FAIL a port: the master port 29500 cannot be bound ({SHOWN})" in shown

    node = make_record("20261129-120000-abcd", ("a",)).nodes[0].seen(NodeState.LOST, None, f"teardown: {HOSTILE}")
    assert _node_line(node) == f"  a: lost - teardown: {SHOWN}"


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    """One `up local` run whose job prints the hostile line (stdout and stderr), as users see it."""
    d = tmp_path_factory.mktemp("hostile")
    (d / "t.py").write_text(f"import sys\nprint({HOSTILE!r}, flush=True)\nprint({HOSTILE!r}, file=sys.stderr)\n")
    r = cddp("up", "local", "t.py", "--gpus", "1", "--runs-dir", "runs", cwd=d, check_rc=0)
    return d, r, run_id_of(r.stdout)


def test_up_and_logs_escape_a_hostile_line_and_the_log_file_keeps_it(hostile_run):
    d, r, run_id = hostile_run
    assert f"[local] {SHOWN}" in r.stdout and "\x1b" not in r.stdout + r.stderr
    assert HOSTILE.encode() + b"\n" in (d / "runs" / run_id / "logs" / "local.log").read_bytes()
    logs = cddp("logs", run_id, "--runs-dir", "runs", cwd=d, check_rc=0)
    assert logs.stdout.count(f"[local] {SHOWN}\n") == 2 and "\x1b" not in logs.stdout


def test_raw_passes_the_jobs_bytes_through(hostile_run):
    d, _, run_id = hostile_run
    logs = cddp("logs", run_id, "--runs-dir", "runs", "--raw", cwd=d, check_rc=0)
    assert logs.stdout.count(f"[local] {HOSTILE}\n") == 2
    r = cddp("up", "local", "t.py", "--gpus", "1", "--runs-dir", "runs", "--raw", cwd=d, check_rc=0)
    assert f"[local] {HOSTILE}\n" in r.stdout
    assert SHOWN not in r.stdout  # nothing escaped with --raw
