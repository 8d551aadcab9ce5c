"""The job's quick exit (``stackhook.quick_exit``, in the ``sitecustomize`` launch.sh writes): every python of
the job ends without the interpreter's last collections, after its own ``atexit`` functions, with every
byte written to a file still open kept; ``CLUSTERDDP_QUICK_EXIT=0`` gives the interpreter's own exit back.
Real pythons, hooked as launch.sh hooks them (its own lines write the hook)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from clusterddp import nodescript
from clusterddp.node import stackhook


@pytest.fixture
def hooked(tmp_path):
    """The environment of a python of a job: launch.sh's stack hook lines run, their exports kept."""
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    script = "\n".join([f"CTL={ctl}", *nodescript.stack_hook_lines(), 'echo "$CLUSTERDDP_STACKS|$PYTHONPATH"'])
    stacks, path = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True,
                                  env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
                                  ).stdout.strip().split("|")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", stackhook.QUICK_EXIT)}
    return {**env, "CLUSTERDDP_STACKS": stacks, "PYTHONPATH": path}


def run(source: str, env: dict, cwd, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", source, *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=60)


# An object in a reference cycle at exit, with a __del__ that says it ran, and files kept open in another cycle.
CYCLES = """
import os, sys
class Cycle:
    def __del__(self):
        os.write(1, b"finalized\\n")
c = Cycle(); c.me = c
class Holder:
    pass
h = Holder(); h.me = h
h.text = open("text.txt", "w"); h.text.write("t" * 1000 + "end")
h.binary = open("binary.bin", "wb"); h.binary.write(b"b" * 1000 + b"end")
h.both = open("both.bin", "w+b"); h.both.write(b"r" * 1000 + b"end")
import atexit
atexit.register(lambda f=h.text: f.write(" and its atexit"))
del c, h
print("done", flush=True)
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""


def contents(folder) -> tuple[str, bytes, bytes]:
    return ((folder / "text.txt").read_text(), (folder / "binary.bin").read_bytes(), (folder / "both.bin").read_bytes())


def test_a_cycles_finalizer_is_skipped_at_exit_and_every_byte_written_to_a_file_left_open_is_kept(hooked, tmp_path):
    r = run(CYCLES, hooked, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "done\n"  # no "finalized": the last collections were skipped
    # the files sat in a cycle, never closed: the flush wrote them whole, the script's own atexit line included
    assert contents(tmp_path) == ("t" * 1000 + "end and its atexit", b"b" * 1000 + b"end", b"r" * 1000 + b"end")


def test_clusterddp_quick_exit_0_gives_the_interpreters_own_exit(hooked, tmp_path):
    r = run(CYCLES, {**hooked, stackhook.QUICK_EXIT: "0"}, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "done\nfinalized\n"
    # and Python's own exit loses what sat in a file kept in a cycle (its raw file closes first: bpo-17852),
    # which the quick exit's flush keeps
    assert contents(tmp_path) == ("", b"", b"")


def test_a_python_not_hooked_finalizes_its_cycles(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CLUSTERDDP_STACKS")}
    assert run(CYCLES, env, tmp_path).stdout == "done\nfinalized\n"


def test_the_exit_code_and_the_traceback_are_the_scripts(hooked, tmp_path):
    r = run(CYCLES, hooked, tmp_path, "3")
    assert r.returncode == 3 and r.stdout == "done\n"
    r = run("import atexit\natexit.register(print, 'its atexit')\nraise ValueError('bad batch')", hooked, tmp_path)
    assert r.returncode == 1
    assert "ValueError: bad batch" in r.stderr and r.stdout == "its atexit\n"


def test_it_runs_after_the_processs_other_atexit_functions(hooked, tmp_path):
    # An atexit function that runs after the quick exit would write into a file the flush has passed
    # and the freeze then leaves unclosed: registered late, it must run first.
    r = run("import atexit, gc\natexit.register(lambda: print('frozen before me:', gc.get_freeze_count() > 0))",
            hooked, tmp_path)
    assert r.stdout == "frozen before me: False\n"


def test_quick_exit_flushes_only_files_open_for_writing(tmp_path):
    reading = open(__file__)
    closed = open(tmp_path / "closed.txt", "w")
    closed.close()
    held = open(tmp_path / "held.txt", "w")
    held.write("kept")
    try:
        import gc
        try:
            assert stackhook.quick_exit() >= 1
            assert gc.get_freeze_count() > 0
        finally:
            gc.unfreeze()
        assert (tmp_path / "held.txt").read_text() == "kept"
    finally:
        held.close()
        reading.close()


def test_the_name_it_reads_is_one_a_job_may_set():
    from clusterddp.inventory import reserved_env
    assert reserved_env(stackhook.QUICK_EXIT) is None
    assert reserved_env("CLUSTERDDP_QUICK_EXITS") is not None  # the rest of clusterddp's names stay reserved
