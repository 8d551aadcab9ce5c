"""clusterddp.files: the atomic private write, the polled lock and the bounded non-blocking read,
and the user-named files that go through that read (an inventory, `-e @FILE`)."""

from __future__ import annotations

import os
import stat
import threading
import time

import pytest
from typer.testing import CliRunner

from clusterddp import files
from clusterddp.cli.app import app
from clusterddp.errors import FileRefused, LockTimeout


def _within(seconds: float, fn):
    """``fn()``'s outcome (value or exception), or a failure if it has not returned in ``seconds``:
    a read that blocks on a FIFO would otherwise hang the test run."""
    out: dict = {}

    def go():
        try:
            out["value"] = fn()
        except BaseException as e:  # handed to the test
            out["error"] = e
    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still blocked after {seconds}s"
    if "error" in out:
        raise out["error"]
    return out["value"]


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


def test_a_fifo_is_refused_at_once_not_waited_on(fifo):
    with pytest.raises(FileRefused) as e:
        _within(20, lambda: files.read_bounded(fifo, 1000))
    assert e.value.reason == "not_regular" and "named pipe (FIFO)" in str(e.value) and str(fifo) in str(e.value)


@pytest.mark.parametrize("path, kind", [("/dev/zero", "a device"), ("/dev/null", "a device")])
def test_a_device_is_refused_before_any_read(path, kind):
    with pytest.raises(FileRefused, match=kind) as e:
        _within(20, lambda: files.read_bounded(path, 1 << 20))
    assert e.value.reason == "not_regular"


def test_a_folder_missing_file_and_oversized_file_are_refused_each_by_reason(tmp_path):
    big = tmp_path / "big"
    big.write_bytes(b"x" * 101)
    for path, reason in [(tmp_path, "not_regular"), (tmp_path / "nope", "missing"), (big, "too_large")]:
        with pytest.raises(FileRefused) as e:
            files.read_bounded(path, 100)
        assert e.value.reason == reason, path
    (tmp_path / "ok").write_bytes(b"x" * 100)
    data, st = files.read_bounded(tmp_path / "ok", 100)
    assert data == b"x" * 100 and stat.S_ISREG(st.st_mode)


def test_a_symlink_is_refused_only_when_asked(tmp_path):
    (tmp_path / "real").write_text("a")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert files.read_bounded(tmp_path / "link", 10)[0] == b"a"
    with pytest.raises(FileRefused) as e:
        files.read_bounded(tmp_path / "link", 10, nofollow=True)
    assert e.value.reason == "symlink"


def test_make_folders_makes_every_missing_folder_0700_whatever_the_umask_and_leaves_the_others(tmp_path):
    (tmp_path / "there").mkdir()
    os.chmod(tmp_path / "there", 0o755)
    old = os.umask(0)
    try:
        files.make_folders(tmp_path / "there" / "a" / "b")
        files.make_folders(tmp_path / "there" / "a" / "b")  # there already: nothing to do
    finally:
        os.umask(old)
    modes = {p: stat.S_IMODE(os.stat(tmp_path / p).st_mode) for p in ("there", "there/a", "there/a/b")}
    assert modes == {"there": 0o755, "there/a": 0o700, "there/a/b": 0o700}
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError):
        files.make_folders(tmp_path / "file" / "a")


def test_the_store_makes_the_folders_above_its_runs_folder_0700(tmp_path):
    from clusterddp.store import RunStore
    from helpers import make_record
    old = os.umask(0o022)
    try:
        RunStore(tmp_path / "new" / "runs").create(make_record("r1"))
    finally:
        os.umask(old)
    assert [stat.S_IMODE(os.stat(p).st_mode) for p in (tmp_path / "new", tmp_path / "new" / "runs")] == [0o700] * 2


def test_write_private_is_0600_whatever_the_umask_and_leaves_no_temp_file(tmp_path):
    old = os.umask(0)
    try:
        files.write_private(tmp_path / "f", b"one")
        files.write_private(tmp_path / "f", b"two")
    finally:
        os.umask(old)
    assert (tmp_path / "f").read_bytes() == b"two"
    assert stat.S_IMODE(os.stat(tmp_path / "f").st_mode) == 0o600
    assert os.listdir(tmp_path) == ["f"]


def test_a_failed_write_keeps_the_old_file(tmp_path):
    files.write_private(tmp_path / "f", b"old")
    with pytest.raises(RuntimeError), files.replacing(tmp_path / "f") as f:
        f.write(b"half")
        raise RuntimeError
    assert (tmp_path / "f").read_bytes() == b"old" and os.listdir(tmp_path) == ["f"]


def test_the_polled_lock_gives_up_at_its_deadline_with_the_callers_error(tmp_path):
    path = tmp_path / "lock"
    holder = os.open(path, os.O_RDWR | os.O_CREAT)
    other = os.open(path, os.O_RDWR)
    try:
        assert files.try_lock(holder) and not files.try_lock(other)
        start = time.monotonic()
        with pytest.raises(LockTimeout, match="still locked"):
            files.lock_polled(other, time.monotonic() + 0.3, lambda: LockTimeout("still locked"))
        assert 0.3 <= time.monotonic() - start < 30
        os.close(holder)
        holder = -1
        files.lock_polled(other, time.monotonic() + 30, lambda: LockTimeout("still locked"))
    finally:
        for fd in (holder, other):
            if fd >= 0:
                os.close(fd)


# ---- the user-named files that go through read_bounded ----

def _up(tmp_path, *args):
    (tmp_path / "t.py").write_text("print('hi')\n")
    return _within(60, lambda: CliRunner().invoke(app, ["up", *args, str(tmp_path / "t.py"), "--runs-dir",
                                                        str(tmp_path / "runs"), "--dry-run"]))


def test_a_fifo_or_dev_zero_as_the_inventory_is_refused_naming_it(tmp_path, fifo):
    for path, kind in [(fifo, "a named pipe (FIFO)"), ("/dev/zero", "a device")]:
        r = _up(tmp_path, str(path))
        assert r.exit_code == 2, r.output
        assert f"{path}: is {kind}, not a regular file" in r.output and "Traceback" not in r.output


def test_a_fifo_as_env_file_is_refused_naming_the_flag(tmp_path, fifo):
    r = _up(tmp_path, "local", "-e", f"@{fifo}")
    assert r.exit_code == 2, r.output
    assert f"-e @{fifo}: cannot read it: is a named pipe (FIFO)" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("which", ["fifo", "/dev/zero"])
def test_a_fifo_or_a_device_as_known_hosts_is_refused_naming_it(tmp_path, fifo, which):
    from dataclasses import replace

    from clusterddp import inventory
    from clusterddp.transport import connect
    known = str(fifo) if which == "fifo" else which
    host = replace(inventory.parse("hosts: [{name: a, address: 127.0.0.1, port: 9}]\n", "i.yaml").hosts[0],
                   known_hosts=known, connect_timeout=5.0)

    def go():
        t = connect(host)
        try:
            t.run("true")
        finally:
            t.close()
    with pytest.raises(FileRefused) as e:
        _within(60, go)
    assert e.value.exit_code == 2 and f"{known}: (known_hosts) is a" in str(e.value), str(e.value)
