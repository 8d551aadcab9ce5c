"""``stackhook``: the ``sitecustomize`` of every Python process of a job, so that ``clusterddp stacks``
can ask any rank (and torchrun's agent) for the Python stack of each of its threads, at any time,
with no change to the user's script.

launch.sh writes this source as ``$CTL/stacks/hook/sitecustomize.py``, puts that folder first on
``PYTHONPATH`` and sets ``CLUSTERDDP_STACKS=$CTL/stacks`` (``nodescript.stack_hook_lines``). Every
python started under the job imports ``sitecustomize`` as it starts (``site``), whatever its entry
(torchrun's agent, each rank with or without ``--local-rank-arg``'s shim, ``srun``), and so runs
:func:`install`: ``faulthandler`` registered for :func:`signal_number` (``SIGRTMIN+6``: not SIGUSR1
or SIGUSR2, which Slurm and many training scripts use for checkpoints), writing to
``$CLUSTERDDP_STACKS/<pid>.txt``, whose first line (:data:`HEADER`) names the main thread.

Why faulthandler: its handler is C, run in the signal handler itself, without the GIL, so a rank
blocked in a C call (gloo's all_reduce, a futex) answers as well as one running Python; it only
reads the interpreter's frames and writes them, and the call it interrupted resumes (``SA_RESTART``;
a call that cannot restart gets EINTR, which Python and gloo retry). The signal's default action
(ending the process) never applies: ``clusterddp stacks`` signals only a process whose
``/proc/PID/status`` shows it catches the signal and whose header names it.

It also gives every such python a quick exit (:func:`quick_exit`, registered first so it runs after the
process's other ``atexit`` functions): the interpreter's last garbage collections at exit walk every object
torch made, 0.3 CPU-s and 0.3 s of wall time for each rank (of a 1-step job's 5 s on two nodes:
bench/RESULTS-up-ssh.md). ``CLUSTERDDP_QUICK_EXIT=0`` in the job's environment turns it off.

Then the next ``sitecustomize`` on ``sys.path`` (a distribution's, a virtualenv's) runs, as it would
have without this one. Nothing here may stop a job from starting: every error is swallowed.
Python 3.8 grammar, standard library only.
"""

from __future__ import annotations

import os
import sys

ENV = "CLUSTERDDP_STACKS"
QUICK_EXIT = "CLUSTERDDP_QUICK_EXIT"          # "0": the interpreter's own exit, every collection made
OFFSET = 6                                    # the signal: SIGRTMIN + OFFSET
HEADER = "CLUSTERDDP_STACKS pid=%d main=0x%x\n"
_held = []  # type: list  # the open dump files: referenced for the life of the process


def signal_number() -> int:
    """The signal a hooked process dumps its stacks on (the same number on the node for both sides)."""
    import signal
    return int(signal.SIGRTMIN) + OFFSET


def install(folder: str) -> str:
    """Register the dump in this process: ``<folder>/<pid>.txt`` (replaced: a pid's earlier owner's
    dumps are not this one's), its header written first. Returns the file's path."""
    import _thread
    import faulthandler
    pid = os.getpid()
    path = os.path.join(folder, "%d.txt" % pid)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o600)
    os.write(fd, (HEADER % (pid, _thread.get_ident())).encode())
    faulthandler.register(signal_number(), file=fd, all_threads=True, chain=False)
    _held.append(fd)
    return path


def quick_exit() -> int:
    """At exit, after every other ``atexit`` function: flush every file still open for writing, then
    ``gc.freeze()``, so that the interpreter's last collections skip every object there is. Python
    does not promise to finalize what is still alive at exit; what the freeze leaves unfinalized is
    what sits in a reference cycle then: its ``__del__`` is not called and its file is not closed, so
    the flush first keeps every byte written to such a file (the OS closes it), which Python's own
    exit can lose (the raw file of a cycle may close before its buffer flushes: bpo-17852). Returns
    how many files it flushed."""
    import gc
    import io
    flushed = 0
    kinds = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)  # a text file's flush flushes its buffer too
    found = gc.get_objects()
    for f in found:
        if type(f) in kinds:  # exact types: isinstance would ask every object its __class__
            try:
                if not f.closed and f.writable():
                    f.flush()
                    flushed += 1
            except Exception:  # noqa: BLE001 - closed, detached, a pipe gone: nothing to keep
                pass
    del found
    gc.freeze()
    return flushed


def _chain(here: str) -> None:
    """Run the ``sitecustomize`` that this one shadows, if there is one, in its place."""
    import importlib.machinery
    import importlib.util
    rest = [p for p in sys.path if os.path.realpath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def main(argv: list) -> int:
    """``stackhook FOLDER``: register the dump in this process (for tests); prints the file's path."""
    print(install(argv[0]))
    return 0


if __name__ == "sitecustomize":
    if os.environ.get(QUICK_EXIT, "1") != "0":
        import atexit
        atexit.register(quick_exit)  # the first registered: run last
    _folder = os.environ.get(ENV)
    if _folder:
        try:
            install(_folder)
        except Exception:  # noqa: BLE001 - never stop a job from starting; `stacks` says it is not hooked
            pass
    _chain(os.path.realpath(os.path.dirname(os.path.abspath(__file__))))

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
