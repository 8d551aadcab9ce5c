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


# ---- lines that never end ----

def test_a_line_that_never_ends_is_printed_in_bounded_pieces_and_nothing_is_lost():
    """48 MiB without a newline: the printer held all of it and joined it again for every chunk
    (71 s of CPU); now it never holds more than MAX_PARTIAL and prints as it goes."""
    out = io.StringIO()
    p = common.PrefixPrinter(["a"], stream=out)
    limit = common.PrefixPrinter.MAX_PARTIAL
    chunk = b"x" * 32768
    most = 0
    for _ in range(48 * 1024 * 1024 // len(chunk)):
        p("a", chunk)
        most = max(most, p.held("a"))
    assert most <= limit
    assert out.getvalue().count("\n") >= 48 * 1024 * 1024 // limit - 1  # printed while it came
    p.flush()
    lines = out.getvalue().splitlines()
    assert all(line.startswith("[a] ") and len(line) <= limit + 4 for line in lines)
    assert sum(len(line) - 4 for line in lines) == 48 * 1024 * 1024  # every byte, once


def test_a_long_line_is_cut_between_utf8_characters_and_complete_lines_are_unchanged():
    out = io.StringIO()
    p = common.PrefixPrinter(["a"], stream=out)
    text = "é" * common.PrefixPrinter.MAX_PARTIAL  # 2 bytes each
    data = text.encode()
    for i in range(0, len(data), 1000):
        p("a", data[i:i + 1000])
    p("a", b"\nnext line\n")
    lines = out.getvalue().splitlines()
    assert "".join(line[4:] for line in lines[:-1]) == text and "\\x" not in out.getvalue()
    assert lines[-1] == "[a] next line"


def test_progress_bars_redrawn_with_cr_are_shown_as_a_terminal_leaves_them():
    out = io.StringIO()
    now = [0.0]
    p = common.PrefixPrinter(["a", "b"], stream=out, clock=lambda: now[0], redraw_every=10)
    for i in range(100_000):  # a progress bar of one line, redrawn 100,000 times
        p("a", f"\rstep {i:6d}/100000".encode())
        assert p.held("a") <= 32
    assert out.getvalue() == ""
    now[0] = 11.0  # a redraw after a while shows where it is, once
    p("a", b"\rstep 100000/100000")
    p("a", b"\rdone")
    p("b", b"b's own line\r\n")  # a CRLF is a line end, not a redraw
    p("a", b"\r\n")
    assert out.getvalue() == "[a] step 100000/100000\n[b] b's own line\n[a] done\n"


def test_raw_output_keeps_a_progress_bars_bytes_and_is_bounded_too():
    class Terminal(io.StringIO):
        buffer = io.BytesIO()
    raw = Terminal()
    p = common.PrefixPrinter(["a"], stream=raw, raw=True)
    p("a", b"10%\r20%\r")
    p("a", b"30%\r\n")
    assert raw.buffer.getvalue() == b"[a] 10%\r20%\r30%\r\n"
    for _ in range(100):
        p("a", b"\r" * 10_000)
    assert p.held("a") <= common.PrefixPrinter.MAX_PARTIAL


def test_a_node_cannot_print_a_line_of_its_own_in_checks_report(capsys):
    """A probe's torch_error with "\\nPASS: all 2 host(s) ready" printed a fake PASS line."""
    import json

    from clusterddp import inventory
    from clusterddp.check import evaluate
    from clusterddp.cli.check import print_report
    from clusterddp.fleet import HostResult
    from clusterddp.node.probe import MARK
    from clusterddp.transport import CommandResult

    inv = inventory.parse("hosts: [{name: a, address: 10.0.0.1}]\n", "inv.yaml")
    facts = {"python": "3.11", "torch": "2.13.0", "torch_error": "boom\nPASS: all 2 host(s) ready [0.1s]",
             "port_free": True, "disk_free": 100 << 30, "disk_path": "/d", "time": 0}
    out = (MARK + json.dumps(facts) + "\n").encode()
    print_report(evaluate(inv, [HostResult("a", CommandResult(0, out, b""), None, 0, 0)]), 0.1)
    lines = capsys.readouterr().out.splitlines()
    assert not [line for line in lines if line.startswith("PASS")], lines
    assert any("boom\\nPASS: all 2 host(s) ready" in line for line in lines)
