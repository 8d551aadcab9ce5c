"""What the SSH transport does to the whole process, and when: never at import, once per process.

Also: the commands that contact no host never load Fabric, invoke or paramiko.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap

import pytest

from clusterddp import inventory
from clusterddp.transport import ssh
from helpers import REPO


def a_host() -> inventory.Host:
    return inventory.Host(name="a", address="a.invalid", user=None, port=None, identity_file=None,
                          known_hosts="/nonexistent/known_hosts", host_key_policy="strict", gpus=1,
                          python="python3", workdir="~/w", env=(), setup=(), connect_timeout=1.0)


def test_import_changes_nothing_process_wide_and_the_first_transport_does_it_once():
    """Real glibc in a fresh process: a 7 MiB block is mmapped (glibc's default) until a transport exists."""
    code = textwrap.dedent("""
        import ctypes, logging
        class Info(ctypes.Structure):
            _fields_ = [(n, ctypes.c_size_t) for n in
                        "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
        libc = ctypes.CDLL(None)
        libc.mallinfo2.restype = Info

        def mmapped(n):
            before = libc.mallinfo2().hblks
            block = bytearray(n)
            return libc.mallinfo2().hblks - before

        def state():
            return [mmapped(7 << 20), ssh._process_ready, paramiko.packet.Packetizer.REKEY_BYTES,
                    [type(h).__name__ for h in logging.getLogger("paramiko").handlers]]

        import paramiko
        from clusterddp.transport import ssh
        from test_transport_process import a_host
        print(state())
        ssh.SSHTransport(a_host())  # made, never opened
        print(state())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=REPO / "tests" / "transport", timeout=60,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "tests"),
                                                                                   os.environ.get("PYTHONPATH")]))}
                         ).stdout.splitlines()
    at_import, after = map(ast.literal_eval, out)
    assert at_import == [1, False, 1 << 29, []]
    assert after == [0, True, 1 << 29, ["NullHandler"]]  # re-keying is per transport: paramiko's class untouched


class FakeLibc:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return 1


def test_malloc_is_tuned_once_per_process_and_is_a_no_op_without_glibc(monkeypatch):
    libc = FakeLibc()
    monkeypatch.setattr(ssh, "_libc", lambda: libc)
    monkeypatch.setattr(ssh, "_process_ready", False)
    ssh.SSHTransport(a_host())
    ssh.SSHTransport(a_host())
    assert libc.calls == [(-3, 8 << 20), (-1, 32 << 20)]  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD; once

    def no_libc():
        raise OSError("no C library by that name")
    for loader in (lambda: object(), no_libc):  # a libc without mallopt (macOS, musl), or none to load
        monkeypatch.setattr(ssh, "_libc", loader)
        monkeypatch.setattr(ssh, "_process_ready", False)
        ssh.SSHTransport(a_host())
        assert ssh._reuse_freed_memory() is False


# What was loaded, said at exit: at the interpreter's (atexit), or at os._exit, which a finished `up`
# and `exec` end with (cli.common.exit_quickly_when_done).
PROBE = ("import atexit, os, sys\n"
         "def said():\n"
         "    loaded = sorted(m for m in ('fabric', 'invoke', 'paramiko') if m in sys.modules)\n"
         "    print('LOADED', loaded, file=sys.stderr)\n"
         "    sys.stderr.flush()\n"
         "atexit.register(said)\n"
         "quick = os._exit\n"
         "os._exit = lambda code: (said(), quick(code))\n"
         "from clusterddp.cli.app import main\n"
         "sys.argv = ['clusterddp', *sys.argv[1:]]\n"
         "main()\n")


@pytest.mark.parametrize("args", [["--help"], ["runs"], ["schedule", "list"],
                                  ["up", "local", "t.py", "--gpus", "1"]], ids=" ".join)
def test_commands_that_contact_no_host_never_load_fabric_invoke_or_paramiko(tmp_path, args):
    (tmp_path / "t.py").write_text("print('hi from t')\n")
    r = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=tmp_path, capture_output=True, text=True,
                       timeout=240, env={**os.environ, "CLUSTERDDP_RUNS_DIR": str(tmp_path / "runs"),
                                         "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r
    if args[0] == "up":
        assert "hi from t" in r.stdout, r  # the job really ran
    assert "LOADED []" in r.stderr.splitlines(), r.stderr
