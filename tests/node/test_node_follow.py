"""The log follower (clusterddp/node/follow.py), in-process: where it starts, and when it stops.

It must stream until the job has ended and not a moment longer: the end is the exit_code file,
or the job's shell gone or a zombie (which ``tail --pid`` would wait on).
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import threading
from pathlib import Path

from clusterddp.node import follow
from helpers import eventually


class Sink:
    """A binary stdout that the test thread can read while the follower writes."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, b: bytes) -> None:
        self.data += b

    def flush(self) -> None:
        pass


def control(tmp_path: Path, pid: int, log: bytes) -> Path:
    ctl = tmp_path / ".clusterddp"
    ctl.mkdir()
    (ctl / "pid").write_text(f"{pid}\n")
    (ctl / "node.log").write_bytes(log)
    return ctl


def start(ctl: Path, from_line: int, err: io.StringIO | None = None) -> tuple[threading.Thread, Sink, list]:
    out, rc = Sink(), []
    th = threading.Thread(target=lambda: rc.append(follow.main([str(ctl), str(from_line), "0.01"], stdout=out,
                                                               stderr=err or io.StringIO())),
                          daemon=True)
    th.start()
    return th, out, rc


def test_follows_a_running_job_from_a_line_and_stops_at_exit_code(tmp_path):
    ctl = control(tmp_path, os.getpid(), b"one\ntwo\n")  # the job's shell: alive until the test ends
    th, out, rc = start(ctl, 2)
    assert eventually(lambda: out.data == b"two\n"), bytes(out.data)
    with open(ctl / "node.log", "ab") as f:
        f.write(b"three\n")
    assert eventually(lambda: out.data == b"two\nthree\n"), "still following while the job runs"
    with open(ctl / "node.log", "ab") as f:
        f.write(b"last words\n")
    (ctl / "exit_code").write_text("0\n")
    th.join(timeout=20)
    assert not th.is_alive(), "the follower did not stop at exit_code"
    assert rc == [0] and out.data == b"two\nthree\nlast words\n"  # the log drained to its end


def test_stops_when_the_job_shell_is_a_zombie(tmp_path):
    p = subprocess.Popen(["true"])  # not reaped until p.wait(): a zombie meanwhile
    try:
        assert eventually(lambda: Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z")
        ctl = control(tmp_path, p.pid, b"partial line without newline")
        th, out, rc = start(ctl, 1)
        th.join(timeout=20)
        assert not th.is_alive(), "a zombie counted as a running job"
        assert rc == [0] and out.data == b"partial line without newline"
    finally:
        p.wait()


def test_a_job_that_ended_before_the_wanted_line_gives_nothing(tmp_path):
    ctl = control(tmp_path, 0, b"one\ntwo\n")  # no such process
    th, out, rc = start(ctl, 5)
    th.join(timeout=20)
    assert not th.is_alive() and rc == [0] and out.data == b""


def test_the_end_of_the_job_shell_ends_the_wait_between_polls(tmp_path):
    # Every run's end waited for the follower's next poll; it now wakes on the shell's exit. With a
    # 60 s poll, a follower that only sleeps would still be asleep when the join gives up.
    ctl = tmp_path / ".clusterddp"
    ctl.mkdir()
    (ctl / "node.log").write_bytes(b"started\n")
    p = subprocess.Popen(["bash", "-c", f"sleep 1; echo done >> {ctl}/node.log; echo 0 > {ctl}/exit_code"])
    try:
        (ctl / "pid").write_text(f"{p.pid}\n")
        out, rc = Sink(), []
        th = threading.Thread(target=lambda: rc.append(follow.main([str(ctl), "1", "60"], stdout=out)), daemon=True)
        th.start()
        assert eventually(lambda: out.data == b"started\n"), bytes(out.data)
        th.join(timeout=20)
        assert not th.is_alive(), "the follower slept through the end of the job's shell"
        assert rc == [0] and out.data == b"started\ndone\n"  # what the job wrote last is not lost
    finally:
        p.wait()


def test_a_whole_log_sent_to_a_job_that_ended_is_told_with_its_size_and_hash(tmp_path):
    # What lets the end of a run skip fetching the log again (artifacts.keep_streamed): from line 1 to
    # exit_code, the follower says how much it sent and its sha256; from a later line, or to a job that
    # ended without an exit code, it sent no whole log and says nothing.
    ctl = control(tmp_path, os.getpid(), b"one\ntwo\n")
    err = io.StringIO()
    th, out, rc = start(ctl, 1, err)
    assert eventually(lambda: out.data == b"one\ntwo\n")
    assert err.getvalue() == "", "told whole while the job still runs"
    with open(ctl / "node.log", "ab") as f:
        f.write(b"\x00\xffbinary, no newline")
    (ctl / "exit_code").write_text("0\n")
    th.join(timeout=20)
    log = (ctl / "node.log").read_bytes()
    assert rc == [0] and bytes(out.data) == log
    assert err.getvalue() == f"{follow.WHOLE_MARK}{len(log)} {hashlib.sha256(log).hexdigest()}\n"

    err = io.StringIO()
    th, out, rc = start(ctl, 2, err)  # not from the start: what it sent is not the whole log
    th.join(timeout=20)
    assert rc == [0] and bytes(out.data) == log[4:] and err.getvalue() == ""


def test_no_whole_log_is_told_for_a_job_that_ended_without_an_exit_code(tmp_path):
    ctl = control(tmp_path, 0, b"the shell was killed\n")  # no such process, no exit_code: lost
    err = io.StringIO()
    th, out, rc = start(ctl, 1, err)
    th.join(timeout=20)
    assert rc == [0] and out.data == b"the shell was killed\n" and err.getvalue() == ""
