"""How launch.sh and node.sh start torchrun (nodescript.TORCHRUN, nodescript.torchrun_start): its module run as
`python -m` runs it, a wait for the rendezvous store on the nodes that do not serve it, gc.freeze() once
it returned. Real processes through bash, with a stand-in module in place of torch.distributed.run
(the real one runs under every SSH and Slurm test)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from clusterddp import nodescript as node_script
from clusterddp.nodescript import TORCHRUN_SOURCE, shell_word, store_wait

# What the stand-in module reports: how it was run, and (at exit) whether its objects were frozen.
MODULE = """import atexit, gc, json, os, sys, threading, time
out = os.environ["OUT"]
def at_exit():
    with open(out + ".exit", "w") as f:
        json.dump({"frozen": gc.get_freeze_count(), "thread": os.path.exists(out + ".thread")}, f)
atexit.register(at_exit)
def late():
    time.sleep(0.3)
    open(out + ".thread", "w").close()
threading.Thread(target=late).start()  # not a daemon: the exit waits for it, as the interpreter's does
with open(out, "w") as f:
    json.dump({"name": __name__, "argv": sys.argv, "store": os.environ.get("CLUSTERDDP_STORE"),
               "started": time.time()}, f)
mode = os.environ.get("MODE")
if mode == "raise":
    raise ValueError("boom in the stand-in")
if mode == "exit":
    sys.exit(3)
"""


def _module(tmp_path: Path) -> Path:
    """The stand-in, a module of a package as torch.distributed.run is."""
    folder = tmp_path / "mods"
    (folder / "standin").mkdir(parents=True, exist_ok=True)
    (folder / "standin" / "__init__.py").write_text("")
    (folder / "standin" / "run.py").write_text(MODULE)
    return folder


def _run(tmp_path: Path, *args: str, env: dict | None = None, prefix: str = "", source: str = node_script.TORCHRUN,
         shim: bool = True) -> tuple[subprocess.CompletedProcess, dict, dict]:
    """Run the stand-in as launch.sh runs torchrun (``shim``), or as ``python -m`` does."""
    out = tmp_path / ("shim" if shim else "plain")
    words = (sys.executable, "-c", TORCHRUN_SOURCE, "standin.run") if shim else \
        (sys.executable, "-m", "standin.run")
    script = "\n".join([f"{node_script.TORCHRUN_VAR}={node_script.q(source)}",
                        f"{prefix}{' '.join(map(shell_word, (*words, *args)))}"])
    full = {**os.environ, "PYTHONPATH": str(_module(tmp_path)), "OUT": str(out), **(env or {})}
    r = subprocess.run(["bash", "-c", script], env=full, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    seen = json.loads(out.read_text()) if out.exists() else {}
    at_exit = json.loads(Path(f"{out}.exit").read_text()) if Path(f"{out}.exit").exists() else {}
    return r, seen, at_exit


def test_the_module_runs_as_python_m_runs_it_and_its_objects_are_frozen_before_the_exit(tmp_path):
    r, seen, at_exit = _run(tmp_path, "--nnodes", "2", "it's", "")
    plain, plain_seen, plain_exit = _run(tmp_path, "--nnodes", "2", "it's", "", shim=False)
    assert r.returncode == plain.returncode == 0, r.stderr
    assert seen["name"] == plain_seen["name"] == "__main__"
    assert seen["argv"] == plain_seen["argv"] and seen["argv"][0].endswith("standin/run.py")
    assert seen["argv"][1:] == ["--nnodes", "2", "it's", ""]
    # the exit is still Python's: atexit ran, a thread still running was waited for
    assert at_exit["thread"] and plain_exit["thread"]
    # ... with the interpreter's last collection left nothing to walk (python -m: nothing frozen)
    assert at_exit["frozen"] > 1000 and plain_exit["frozen"] == 0


def test_an_error_ends_it_as_it_ends_python_m(tmp_path):
    r, _, at_exit = _run(tmp_path, env={"MODE": "raise"})
    plain, _, _ = _run(tmp_path, env={"MODE": "raise"}, shim=False)
    assert r.returncode == plain.returncode == 1
    assert r.stderr.rstrip().endswith("ValueError: boom in the stand-in")
    assert at_exit["frozen"] == 0  # not frozen: an error's exit is Python's own, whole
    r, _, _ = _run(tmp_path, env={"MODE": "exit"})
    assert r.returncode == 3


def _free_port() -> int:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return port


def _listen_later(delay: float) -> tuple[int, dict, threading.Thread]:
    """A port that starts listening ``delay`` seconds from now (free until then: connections refused)."""
    port = _free_port()
    state: dict = {}

    def serve() -> None:
        time.sleep(delay)
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(8)
        state["listening"] = time.time()
        s.settimeout(60)
        try:
            state["conn"] = s.accept()  # the wait's connection: accepted, then closed by it
        finally:
            s.close()
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return port, state, t


# Loaded by every python of the test through PYTHONPATH: each connect attempt of the wait, timed, in $OUT.connects
CONNECTS = """import os, socket, time
_real = socket.create_connection
def create_connection(*args, **kwargs):
    try:
        s = _real(*args, **kwargs)
    except OSError:
        _note("refused")
        raise
    _note("ok")
    return s
def _note(what):
    if os.environ.get("OUT"):
        with open(os.environ["OUT"] + ".connects", "a") as f:
            f.write("%r %s\\n" % (time.time(), what))
socket.create_connection = create_connection
"""


def test_a_node_that_does_not_serve_the_store_starts_torchrun_once_the_store_listens(tmp_path):
    # Timed from the wait's own tries (each connect, stamped in the process): the first refused one
    # before the store listened, then the one that got through soon after. How long python took to
    # start on a loaded machine is not the wait's: a try that came only after the store listened
    # proves nothing, and the store listens later the next time.
    (_module(tmp_path) / "sitecustomize.py").write_text(CONNECTS)
    for delay in (1.0, 3.0, 9.0, 27.0):
        connects = tmp_path / "shim.connects"
        connects.unlink(missing_ok=True)
        port, state, t = _listen_later(delay)
        r, seen, _ = _run(tmp_path, "x", prefix=store_wait(f"127.0.0.1:{port}") + " ")
        t.join(30)
        assert r.returncode == 0, r.stderr
        tries = [(float(at), what) for at, what in (line.split() for line in connects.read_text().splitlines())]
        if sum(at < state["listening"] for at, _ in tries) >= 3:  # enough tries before it to time the gaps
            break
    else:
        raise AssertionError(f"the wait tried less than 3 times before the store listened, even {delay:g}s later: "
                             f"{tries}")
    assert "listening" in state and seen["started"] >= state["listening"]  # not before the store listened
    assert tries[-1][1] == "ok" and all(what == "refused" for _, what in tries[:-1]), tries
    # ... and soon after: it tries every 10 ms (torchrun's own client waited 0.3-0.75 s between tries). A
    # try's own time on a loaded machine is not the wait's: the median gap between tries is, and a wait
    # of torchrun's own back-off (0.3 s or more between tries) fails it whatever the load
    assert tries[-1][0] - state["listening"] < 1.0, (tries[-1][0] - state["listening"], tries[-3:])
    gaps = sorted(b - a for (a, _), (b, _) in zip(tries, tries[1:], strict=False))
    assert gaps[len(gaps) // 2] < 0.2, (len(tries), gaps[len(gaps) // 2:][:5])
    assert seen["store"] is None  # taken out of the environment: the workers never see it
    assert seen["argv"][1:] == ["x"] and seen["name"] == "__main__"
    # imported before it runs, yet no warning from runpy about that (torch, imported by the shim's watch
    # of the agent's log as torchrun imports it, may warn of its own: numpy missing)
    assert "runpy" not in r.stderr and "RuntimeWarning" not in r.stderr, r.stderr


def test_the_wait_is_bounded_and_a_bad_address_is_no_wait(tmp_path):
    bounded = node_script.TORCHRUN.replace("time.monotonic() + 30", "time.monotonic() + 1")
    assert bounded != node_script.TORCHRUN
    port = _free_port()  # nothing listens there
    started = time.time()
    r, seen, _ = _run(tmp_path, prefix=store_wait(f"127.0.0.1:{port}") + " ", source=bounded)
    assert r.returncode == 0 and seen["started"] - started >= 1.0  # it waited its bound, then went on
    for bad in ("nonsense", "127.0.0.1:notaport", ":"):
        r, seen, _ = _run(tmp_path, prefix=store_wait(node_script.q(bad)) + " ")
        assert r.returncode == 0 and seen["argv"][1:] == [] and seen["store"] is None, r.stderr

