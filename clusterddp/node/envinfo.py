"""``envinfo``: what ``clusterddp check --diff`` compares between a node and the master.

Node side, :func:`main`: prints one line, :data:`MARK` and a JSON object: the Python version,
torch, its CUDA and NCCL, the NVIDIA driver, the installed distributions (``name==version``, as
``pip freeze`` lists them, read with ``importlib.metadata``: no pip needed, no subprocess), and
a sha256 of the script's folder as a previous run left it (the files named in its arguments,
below the run folder given). Python 3.5 grammar, each part guarded: a node whose Python is too old still
answers with its version. ``plan.envinfo_command`` runs it with the host's python, site-packages
included, after the host's setup lines and env.

Launcher side, :func:`parse_reply`: the facts, each checked and bounded.
"""

import hashlib
import json
import os
import sys

MARK = "CLUSTERDDP_ENVINFO "
# pip freeze leaves these out (unless --all): tools of the environment, not of the job
FREEZE_SKIPS = ("pip", "setuptools", "wheel", "distribute")


def _norm(name: "str") -> "str":
    """A distribution's name as pip compares them (PEP 503)."""
    import re
    return re.sub(r"[-_.]+", "-", name).lower()


def _packages() -> "dict":
    from importlib import metadata  # Python 3.8+; older ones answer without packages
    out = {}  # type: dict
    for d in metadata.distributions():
        name = d.metadata["Name"]
        if name and _norm(name) not in FREEZE_SKIPS:
            out.setdefault(_norm(name), d.version)  # the first on sys.path wins, as at import
    return out


def _tree_hash(root: "str", files: "list") -> "dict":
    """sha256 over each named file's path and content; files missing or unreadable are counted."""
    h, missing = hashlib.sha256(), 0
    for rel in sorted(files):
        path = os.path.join(root, rel)
        try:
            with open(path, "rb") as f:
                fh = hashlib.sha256()
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    fh.update(chunk)
            h.update(rel.encode("utf-8", "surrogateescape") + b"\0" + fh.digest())
        except OSError:
            missing += 1
            h.update(rel.encode("utf-8", "surrogateescape") + b"\0missing")
    return {"sha256": h.hexdigest(), "files": len(files), "missing": missing}


def files_arg(files: "list") -> "str":
    """The list of files to hash as one short argument (base64 of zlib of JSON): a script's folder of
    thousands of files stays far below the kernel's limit on one argument (128 KiB)."""
    import base64
    import zlib
    return base64.b64encode(zlib.compress(json.dumps(sorted(files)).encode(), 9)).decode()


def main(argv: "list") -> int:
    """argv: the run folder of a previous run ("" for none), and :func:`files_arg` of the files to hash there."""
    r = {"python": "%d.%d.%d" % tuple(sys.version_info[:3]), "torch": None, "cuda": None, "nccl": None,
         "driver": None, "packages": None}  # type: dict
    try:
        import importlib.util
        spec = importlib.util.find_spec("torch")
        if spec is not None and spec.submodule_search_locations:
            ns = {}  # type: dict
            with open(os.path.join(list(spec.submodule_search_locations)[0], "version.py")) as f:
                exec(f.read(), ns)
            r["torch"], r["cuda"] = ns.get("__version__"), ns.get("cuda")
            if r["cuda"]:  # NCCL's version needs torch itself (seconds): only on CUDA builds, which have one
                import torch
                v = torch.cuda.nccl.version()
                r["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception as e:
        r["torch_error"] = "%s: %s" % (type(e).__name__, e)
    try:
        import subprocess
        p = subprocess.Popen(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, universal_newlines=True)
        out, _ = p.communicate(timeout=30)
        if p.returncode == 0 and out.strip():
            r["driver"] = out.strip().splitlines()[0].strip()
    except Exception:
        pass  # no nvidia-smi: a CPU node, no driver
    try:
        r["packages"] = _packages()
    except Exception as e:
        r["packages_error"] = "%s: %s" % (type(e).__name__, e)
    if argv and argv[0]:
        import base64
        import zlib
        files = json.loads(zlib.decompress(base64.b64decode(argv[1])).decode())
        root = os.path.expanduser(argv[0])
        r["script"] = _tree_hash(root, files) if os.path.isdir(root) else None
    sys.stdout.write(MARK + json.dumps(r) + "\n")
    sys.stdout.flush()
    return 0


# ---- launcher side ----

class EnvInfoError(Exception):
    """A node's answer could not be used; the message says why."""


MAX_TEXT = 200          # characters of a version, a driver, an error
MAX_PACKAGES = 20000


def _text(name: "str", v: "object") -> "object":
    if v is None:
        return None
    if not isinstance(v, str):
        raise EnvInfoError("malformed envinfo reply: %s must be text" % name)
    return v if len(v) <= MAX_TEXT else v[:MAX_TEXT] + "..."


def parse_reply(stdout: bytes, stderr: bytes, exit_code: int) -> "dict":
    """The facts of the last marked line, each checked; :class:`EnvInfoError` when there is none
    (with the reason stderr gives) or it is malformed."""
    from .reply import ReplyError, last_marked_json  # launcher side only: never runs on a node
    try:
        facts = last_marked_json(stdout, MARK)
    except ReplyError as e:
        raise EnvInfoError("unreadable envinfo reply: %s" % e) from None
    if facts is not None:
        if not isinstance(facts, dict) or not isinstance(facts.get("python"), str):
            raise EnvInfoError("malformed envinfo reply: no python version")
        out = dict((k, _text(k, facts.get(k))) for k in ("python", "torch", "cuda", "nccl", "driver",
                                                         "torch_error", "packages_error"))
        pk = facts.get("packages")
        if pk is not None:
            if not isinstance(pk, dict) or len(pk) > MAX_PACKAGES or not all(
                    isinstance(k, str) and len(k) <= MAX_TEXT and isinstance(v, str) for k, v in pk.items()):
                raise EnvInfoError("malformed envinfo reply: packages must be an object of names and versions")
            pk = dict((k, v[:MAX_TEXT]) for k, v in pk.items())
        out["packages"] = pk
        sc = facts.get("script")
        if sc is not None:
            if not isinstance(sc, dict) or not isinstance(sc.get("sha256"), str) or len(sc["sha256"]) != 64 or \
                    not all(type(sc.get(k)) is int and 0 <= sc[k] <= 10 ** 9 for k in ("files", "missing")):
                raise EnvInfoError("malformed envinfo reply: script must be {sha256, files, missing}")
            sc = {"sha256": sc["sha256"], "files": sc["files"], "missing": sc["missing"]}
        out["script"] = sc
        return out
    err = stderr.decode("utf-8", "replace").strip().splitlines()
    raise EnvInfoError(err[-1][:MAX_TEXT] if err else "no output, exit %d" % exit_code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
