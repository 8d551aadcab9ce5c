"""The preflight probe: what ``clusterddp check`` and ``up`` need to know about one node.

Node side, :func:`main`: prints one line, :data:`MARK` followed by a JSON object of facts
(Python, torch, CUDA and NCCL versions, GPUs, interfaces, free disk, whether the master port is
free, the node's clock). ``plan.probe_command`` runs it after the host's setup lines and env, as
``python -c`` (not ``-S``: it looks for torch in site-packages), with the node's own Python,
which may be old: Python 3.5 grammar (no f-strings), and each part guarded, so a partial report
still comes back. A failing setup line is answered, by the shell, with :func:`setup_failed_reply`.

Launcher side, :func:`parse_reply`: the facts back from the command's output.
"""

import json
import os
import sys

MARK = "CLUSTERDDP_PROBE "


def main(argv: "list[str]") -> int:
    """argv: a JSON object {"full", "port", "workdir"}; the interface that routes to the master, or ""."""
    import socket
    import time
    a = json.loads(argv[0])
    r = {"python": "%d.%d.%d" % tuple(sys.version_info[:3]), "executable": sys.executable,
         "hostname": socket.gethostname(), "iface": argv[1] or None, "torch": None, "cuda": None,
         "nccl": None, "torch_error": None, "full": a["full"]}
    try:  # torch's version and CUDA build from its version.py: no `import torch` (seconds) needed
        import importlib.util
        spec = importlib.util.find_spec("torch")
        if spec is None or not spec.submodule_search_locations:
            r["torch_error"] = "not installed"
        else:
            ns = {}  # type: dict
            with open(os.path.join(list(spec.submodule_search_locations)[0], "version.py")) as f:
                exec(f.read(), ns)
            r["torch"], r["cuda"] = ns.get("__version__"), ns.get("cuda")
    except Exception as e:
        r["torch_error"] = "%s: %s" % (type(e).__name__, e)
    if a["full"] and r["torch"]:
        try:
            import torch
            r["torch"], r["cuda"] = torch.__version__, torch.version.cuda
            if torch.version.cuda:
                try:
                    v = torch.cuda.nccl.version()
                    r["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
                except Exception:
                    pass
        except Exception as e:
            r["torch_error"] = "import torch failed: %s: %s" % (type(e).__name__, e)
    if a["full"]:
        import subprocess
        try:
            p = subprocess.Popen(["nvidia-smi", "-L"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 universal_newlines=True)
            out, err = p.communicate(timeout=30)
            if p.returncode == 0:
                r["gpus"] = sum(1 for line in out.splitlines() if line.startswith("GPU "))
            else:
                r["gpu_error"] = ((err or out).strip().splitlines() or ["exit %d" % p.returncode])[-1]
        except OSError:
            r["gpus"] = None
        except Exception as e:
            p.kill()
            r["gpu_error"] = "nvidia-smi did not answer: %s" % e
    try:
        r["interfaces"] = sorted(n for _, n in socket.if_nameindex())
    except Exception:
        r["interfaces"] = None
    try:
        import shutil
        r["ip_tool"] = shutil.which("ip") is not None
    except Exception:
        pass
    r["env_ifname"] = dict((k, os.environ.get(k)) for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"))
    try:  # free space where the runs will go: the workdir, or its nearest existing parent
        w = d = os.path.expanduser(a["workdir"])
        while d and not os.path.exists(d):
            d = os.path.dirname(d.rstrip("/"))
        d = d or "."
        st = os.statvfs(d)
        r.update(disk_path=d, disk_free=st.f_bavail * st.f_frsize, workdir_exists=os.path.isdir(w),
                 disk_writable=os.access(d, os.W_OK | os.X_OK))
    except Exception as e:
        r["disk_error"] = "%s: %s" % (type(e).__name__, e)
    if a["full"]:
        _workdir_marker(r, a["workdir"])
        _train(r)
    if a["port"]:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's TCPStore: TIME_WAIT is no conflict
        try:
            s.bind(("", a["port"]))
            r["port_free"] = True
        except Exception as e:
            r["port_free"], r["port_error"] = False, getattr(e, "strerror", None) or str(e)
        s.close()
    r["time"] = time.time()
    sys.stdout.write(MARK + json.dumps(r) + "\n")
    sys.stdout.flush()
    return 0


WORKDIR_MARKER = ".clusterddp-workdir"


def _workdir_marker(r: dict, workdir: str) -> None:
    """Tell which hosts share one workdir (an NFS home): the first host to probe it writes a random
    id into WORKDIR_MARKER there (creating the workdir), and every host reports the id it reads,
    so hosts that see one folder report one id. ``os.link`` is atomic and never replaces a file
    (on NFS too): when hosts probe a new workdir at the same moment, one id wins."""
    try:
        import uuid
        w = os.path.expanduser(workdir)
        os.makedirs(w, exist_ok=True)  # hosts may create it at the same moment
        path = os.path.join(w, WORKDIR_MARKER)
        if not os.path.exists(path):
            tmp = "%s.%s" % (path, uuid.uuid4().hex)
            with open(tmp, "w") as f:
                f.write(uuid.uuid4().hex + "\n")
            try:
                os.link(tmp, path)
            except OSError:
                pass  # another host wrote it first: its id is read below
            finally:
                os.unlink(tmp)
        with open(path) as f:
            r["workdir_id"] = f.read().strip()[:100] or None
    except Exception as e:
        r["workdir_id_error"] = "%s: %s" % (type(e).__name__, e)


def _train(r: dict) -> None:
    """Which clusterddp.train a job's script would import (plan._FIND_TRAIN asks the same on the
    node at launch): "train" is its file, None when this python has no clusterddp (a run ships
    the launcher's copy), with "train_sha256"; "train_error" when it has a clusterddp without one."""
    path = sys.path[:]
    try:
        import hashlib
        import importlib.util
        sys.path[:] = [p for p in sys.path if p not in ("", ".")]  # the login folder is not the run folder
        p = importlib.util.find_spec("clusterddp")
        if p is None or p.origin in (None, "namespace"):  # a bare folder named clusterddp is no install
            r["train"] = None
            return
        s = importlib.util.find_spec("clusterddp.train")
        if s is None or not s.origin:
            r["train_error"] = "it has a clusterddp (%s) without clusterddp.train" % p.origin
            return
        with open(s.origin, "rb") as f:
            r["train"], r["train_sha256"] = s.origin, hashlib.sha256(f.read()).hexdigest()
    except Exception as e:
        r["train_error"] = "%s: %s" % (type(e).__name__, e)
    finally:
        sys.path[:] = path


def setup_failed_reply(line: str) -> str:
    """The reply the probe command gives instead of running :func:`main` when setup ``line`` failed."""
    return MARK + json.dumps({"setup_failed": line})


# ---- launcher side ----

class ProbeError(Exception):
    """A probe's output could not be read: the message says why; ``field`` names the fact that
    was malformed, if that was the reason."""

    def __init__(self, message: str, field: "str | None" = None) -> None:
        super().__init__(message)
        self.field = field


MAX_TEXT = 2000       # characters kept of a text fact (an error message can be long)
MAX_NAMES = 4096      # interfaces listed
MAX_NUMBER = 2 ** 80  # disk bytes, GPUs, the clock: anything larger is no reading

# What each fact must be, as main() writes it: "text", "flag", "count" (an int >= 0), "number"
# (finite), "names" (a list of texts), "ifnames" ({NCCL_/GLOO_SOCKET_IFNAME: text or null});
# "?" after a kind: null allowed. Facts not listed here are dropped: nothing reads them.
FACTS = {"python": "text", "executable": "text?", "hostname": "text?", "iface": "text?", "torch": "text?",
         "cuda": "text?", "nccl": "text?", "torch_error": "text?", "full": "flag", "gpus": "count?",
         "gpu_error": "text", "interfaces": "names?", "ip_tool": "flag", "env_ifname": "ifnames",
         "disk_path": "text", "disk_free": "number", "workdir_exists": "flag", "disk_writable": "flag",
         "disk_error": "text", "port_free": "flag", "port_error": "text", "time": "number",
         "workdir_id": "text?", "workdir_id_error": "text", "train": "text?", "train_sha256": "text",
         "train_error": "text"}
IFNAME_KEYS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def _kind_of(v: object) -> str:
    return "null" if v is None else {bool: "true/false", int: "a number", float: "a number", str: "text",
                                     list: "a list", dict: "an object"}.get(type(v), type(v).__name__)


def _fact(name: str, kind: str, v: object) -> object:
    """``v`` if it is of ``kind`` (texts cut to MAX_TEXT); else ProbeError naming the fact."""
    def bad(want: str) -> ProbeError:
        return ProbeError("malformed probe reply: %s must be %s, not %s" % (name, want, _kind_of(v)), name)
    if kind.endswith("?"):
        if v is None:
            return None
        kind = kind[:-1]
    if kind == "text":
        if not isinstance(v, str):
            raise bad("text")
        return v if len(v) <= MAX_TEXT else v[:MAX_TEXT] + "..."
    if kind == "flag":
        if not isinstance(v, bool):
            raise bad("true or false")
        return v
    if kind == "count":
        if type(v) is not int or not 0 <= v <= MAX_NUMBER:  # noqa: E721 - a bool is no count
            raise bad("a whole number >= 0")
        return v
    if kind == "number":
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not -MAX_NUMBER <= v <= MAX_NUMBER:  # NaN too
            raise bad("a finite number")
        return v
    if kind == "names":
        if not isinstance(v, list) or len(v) > MAX_NAMES or not all(isinstance(n, str) and len(n) <= 256 for n in v):
            raise bad("a list of names")
        return v
    # ifnames
    if not isinstance(v, dict) or not set(v) <= set(IFNAME_KEYS) or \
            not all(x is None or isinstance(x, str) and len(x) <= MAX_TEXT for x in v.values()):
        raise bad("an object of %s and %s (text or null)" % IFNAME_KEYS)
    return v


def _checked(facts: dict) -> dict:
    """Only the facts main() writes, each of its kind: nothing that reads them can trip on a type."""
    if "setup_failed" in facts:
        return {"setup_failed": _fact("setup_failed", "text", facts["setup_failed"])}
    if "python" not in facts:
        raise ProbeError("malformed probe reply: no python version in it", "python")
    return dict((k, _fact(k, FACTS[k], v)) for k, v in facts.items() if k in FACTS)


def parse_reply(stdout: bytes, stderr: bytes, exit_code: int) -> dict:
    """The facts a probe printed (its last marked line, whatever else the login shell printed),
    each checked against :data:`FACTS`; raises :class:`ProbeError` when it printed none (with the
    reason if stderr gives one) or a malformed one (naming the fact)."""
    from .reply import ReplyError, last_marked_json  # launcher side only: never runs on a node
    try:
        facts = last_marked_json(stdout, MARK)
    except ReplyError as e:
        raise ProbeError("unreadable probe output: %s" % e) from None
    if facts is not None:
        if not isinstance(facts, dict):
            raise ProbeError("unreadable probe output: not a JSON object")
        return _checked(facts)
    err = stderr.decode("utf-8", "replace").strip().splitlines()
    raise ProbeError(err[-1] if err else "no output, exit %d" % exit_code)


if __name__ == "__main__":
    main(sys.argv[1:])
    os._exit(0)  # now: the launcher's clock reading must follow the node's at once (and torch's teardown is slow)
