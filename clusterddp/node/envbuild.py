"""On a node: what it holds of `packages:` environments, the wheels it is sent, and an environment built.

Run with the node's base Python (``python:``), standard library only, as ``python -S -c <source> VERB JSON``:

- ``look``: the facts an environment's id is made of (Python, platform), the environments complete
  under ``<workdir>/envs`` and the wheels its store holds; one marked line.
- ``receive``: wheels on stdin (``<sha256> <size> <file name>\\n`` then the bytes, repeated), each
  checked against its sha256 before it enters the store (``wheels/<sha256>/<file name>``); a damaged
  one is refused, named in the answer.
- ``build``: the environment ``<id>`` from store wheels, under a lock (a second build of the same id
  waits, then finds it complete), in ``.tmp-<id>-<pid>`` renamed to ``<id>`` only once installed and
  verified (each package's version, the named modules imported). A build cut short leaves only a
  ``.tmp-`` folder, which the next build of that id removes: nothing half built is ever taken.

The installer is uv, from a wheel the launcher sent (its static binary, unpacked once).
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time

TYPE_CHECKING = False
MARK = "CDDP_ENV "
COMPLETE = ".clusterddp-env.json"  # written in an environment before it is renamed into place
_FILE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,250}\.whl")
_SHA_RE = re.compile(r"[0-9a-f]{64}")
_ID_RE = re.compile(r"[0-9a-f]{16,64}")
MAX_WHEEL = 16 << 30
MAX_LISTED = 20000


SAY = []  # type: list  # `build ... say` (a Slurm job's node): the answer said as a line for the node's log


def reply(obj):
    if not SAY:
        sys.stdout.write(MARK + json.dumps(obj, sort_keys=True) + "\n")
    elif "state" in obj:
        sys.stdout.write("[clusterddp] environment {} {}{}{}\n".format(SAY[0], obj["state"], "" if obj.get(
            "seconds") is None else " in {} s".format(obj["seconds"]), "" if obj.get("waited") is None else
            " (after {} s waiting for another build of it)".format(obj["waited"])))
    else:
        err = obj.get("error")
        if err == "disk":
            err = "no room ({} bytes needed, {} free)".format(obj.get("needed"), obj.get("free"))
        sys.stdout.write("[clusterddp] environment {} not built: {}\n".format(SAY[0], err))
    sys.stdout.flush()


def platform_tag():
    """The wheel platform tag this interpreter's machine takes first (manylinux by its glibc)."""
    import sysconfig
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    if plat.startswith("linux_"):
        arch = plat[len("linux_"):]
        try:
            libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
        except (ValueError, OSError, AttributeError):
            libc = ""
        m = re.match(r"glibc (\d+)\.(\d+)", libc)
        if m:
            return "manylinux_{}_{}_{}".format(m.group(1), m.group(2), arch)
    return plat


def facts():
    v = sys.version_info
    impl = sys.implementation.name
    return {"python": "{}.{}.{}".format(v[0], v[1], v[2]), "impl": impl,
            "tag": ("cp" if impl == "cpython" else impl[:2]) + "{}{}".format(v[0], v[1]),
            "exe": os.path.realpath(sys.executable), "platform": platform_tag()}


def complete(path):
    return os.path.isfile(os.path.join(path, COMPLETE))


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def store_wheels(root):
    """sha256 -> file name of each wheel in the store."""
    out = {}
    top = os.path.join(root, "wheels")
    try:
        names = os.listdir(top)
    except OSError:
        return out
    for sha in names:
        if not _SHA_RE.fullmatch(sha):
            continue
        try:
            files = [f for f in os.listdir(os.path.join(top, sha)) if _FILE_RE.fullmatch(f)]
        except OSError:
            continue
        if len(files) == 1:
            out[sha] = files[0]
        if len(out) >= MAX_LISTED:
            break
    return out


def look(args):
    root = os.path.expanduser(args["root"])
    os.makedirs(root, mode=0o700, exist_ok=True)
    envs = sorted(n for n in os.listdir(root) if _ID_RE.fullmatch(n) and complete(os.path.join(root, n)))
    out = facts()
    out.update(root=os.path.abspath(root), free=free_bytes(root), envs=envs[:MAX_LISTED],
               wheels=sorted(store_wheels(root)))
    if args.get("sizes"):  # `env list`
        out.update(sizes={i: tree_size(os.path.join(root, i)) for i in envs},
                   store=tree_size(os.path.join(root, "wheels")))
    reply(out)
    return 0


def _read_exact(stream, n, sink, digest):
    while n:
        chunk = stream.read(min(n, 1 << 20))
        if not chunk:
            raise EOFError("the stream ended inside a wheel")
        n -= len(chunk)
        digest.update(chunk)
        if sink is not None:
            sink.write(chunk)


def receive(args, stream=None):
    """Wheels from ``stream`` (stdin) into the store, each verified; answers which were taken and which refused."""
    root = os.path.expanduser(args["root"])
    top = os.path.join(root, "wheels")
    os.makedirs(top, mode=0o700, exist_ok=True)
    stream = stream or sys.stdin.buffer
    ok, bad = [], []
    while True:
        head = stream.readline(400)
        if not head:
            break
        parts = head.decode("ascii", "replace").split()
        if len(parts) != 3 or not _SHA_RE.fullmatch(parts[0]) or not parts[1].isdigit() \
                or not _FILE_RE.fullmatch(parts[2]) or int(parts[1]) > MAX_WHEEL:
            reply({"ok": ok, "bad": bad, "error": "a malformed wheel header"})
            return 2
        sha, size, name = parts[0], int(parts[1]), parts[2]
        tmp = os.path.join(top, ".tmp-{}-{}".format(os.getpid(), sha[:12]))
        digest = hashlib.sha256()
        try:
            with open(tmp, "wb") as f:
                _read_exact(stream, size, f, digest)
                f.flush()
                os.fsync(f.fileno())
            if digest.hexdigest() != sha:
                os.unlink(tmp)
                bad.append(sha)
                continue
            os.makedirs(os.path.join(top, sha), mode=0o700, exist_ok=True)
            os.replace(tmp, os.path.join(top, sha, name))
            ok.append(sha)
        except (OSError, EOFError) as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            if isinstance(e, EOFError):  # the launcher went away mid-wheel: nothing of it is kept
                reply({"ok": ok, "bad": bad, "error": "the stream ended inside {}".format(name)})
                return 2
            reply({"ok": ok, "bad": bad, "error": "cannot store {}: {}".format(name, e.strerror or e),
                   "needed": size, "free": free_bytes(top)})
            return 3
    reply({"ok": ok, "bad": bad})
    return 0


def unpacked_size(path):
    import zipfile
    with zipfile.ZipFile(path) as z:
        return sum(i.file_size for i in z.infolist())


def uv_binary(root, sha, name, store=None):
    """The uv binary from the store's uv wheel (``store``: another envs folder's), unpacked once in ``.uv/<sha>/``."""
    import zipfile
    where = os.path.join(root, ".uv", sha)
    exe = os.path.join(where, "uv")
    if os.path.isfile(exe):
        return exe
    os.makedirs(where, mode=0o700, exist_ok=True)
    with zipfile.ZipFile(os.path.join(store or root, "wheels", sha, name)) as z:
        member = next(i for i in z.infolist() if re.fullmatch(r"[^/]+\.data/scripts/uv", i.filename))
        tmp = exe + ".tmp-{}".format(os.getpid())
        with z.open(member) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst)
    os.chmod(tmp, 0o755)
    os.replace(tmp, exe)
    return exe


VERIFY = r"""
import importlib, json, re, sys
from importlib import metadata
want = json.loads(sys.argv[1])
def public(v):
    return re.sub(r"[-_.]+", ".", str(v).split("+")[0]).lower()
bad = []
for name, version in want["expect"]:
    try:
        got = metadata.version(name)
    except metadata.PackageNotFoundError:
        bad.append("{} is not installed".format(name))
        continue
    if got != version and public(got) != public(version):
        bad.append("{} is {}, not {}".format(name, got, version))
for module, version in want["imports"]:
    try:
        m = importlib.import_module(module)
    except Exception as e:
        bad.append("import {} failed: {}: {}".format(module, type(e).__name__, e))
        continue
    got = getattr(m, "__version__", None)
    if got is not None and public(got) != public(version):
        bad.append("{}.__version__ is {}, not {}".format(module, got, version))
print(json.dumps(bad))
"""


def _run(argv, env):
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    text = r.stdout.decode("utf-8", "replace")
    return r.returncode, "\n".join(text.strip().splitlines()[-8:])


def tree_size(path):
    total = 0
    for top, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(top, f)).st_size
            except OSError:
                pass
    return total


def build(args):
    import fcntl
    root = os.path.expanduser(args["root"])
    env_id = args["id"]
    if not _ID_RE.fullmatch(env_id):
        reply({"error": "not an environment id"})
        return 2
    # "store": the wheel store of another envs folder (a Slurm job's node-local build, from the shared one)
    store = os.path.expanduser(args.get("store") or root)
    differ = [k for k in ("python", "impl", "exe", "platform") if args.get("facts") and facts()[k] != args["facts"][k]]
    if differ:  # "facts": what the launcher planned the id for (a Slurm job's node, from its login host's look)
        reply({"error": "this node's Python is not the one environment {} was planned for: {}".format(env_id, "; ".join(
            "{} {} here, {} planned".format(k, facts()[k], args["facts"][k]) for k in differ))})
        return 2
    final = os.path.join(root, env_id)
    locks = os.path.join(root, ".locks")
    os.makedirs(locks, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(locks, env_id), os.O_RDWR | os.O_CREAT, 0o600)
    waited = None  # seconds waited for another build of this id (said by the launcher)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        sys.stderr.write("[clusterddp] another run builds this environment: waiting for it\n")
        sys.stderr.flush()
        began = time.time()
        fcntl.flock(fd, fcntl.LOCK_EX)
        waited = round(time.time() - began, 1)
    if complete(final):
        reply({"state": "ready", "waited": waited})
        return 0
    for name in os.listdir(root):  # what a build cut short left: no build of this id runs now (we hold its lock)
        if name.startswith(".tmp-" + env_id + "-") or name == env_id:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    wheels = [(sha, name) for sha, name in args["wheels"]]
    held = store_wheels(store)
    missing = [name for sha, name in wheels + [tuple(args["uv"])] if held.get(sha) != name]
    if missing:
        reply({"error": "the wheel store lacks " + ", ".join(missing[:5])})
        return 1
    needed = sum(unpacked_size(os.path.join(store, "wheels", sha, name)) for sha, name in wheels) + (64 << 20)
    free = free_bytes(root)
    if needed > free:
        reply({"error": "disk", "needed": needed, "free": free})
        return 3
    uv = uv_binary(root, args["uv"][0], args["uv"][1], store)
    tmp = os.path.join(root, ".tmp-{}-{}".format(env_id, os.getpid()))
    env = dict(os.environ, UV_CACHE_DIR=os.path.join(root, ".uv-cache"), UV_NO_CONFIG="1",
               UV_PYTHON_DOWNLOADS="never", UV_OFFLINE="1")
    env.pop("VIRTUAL_ENV", None)
    started = time.time()
    code, said = _run([uv, "venv", "--quiet", "--relocatable", "--python", sys.executable, tmp], env)
    if code == 0:
        code, said = _run([uv, "pip", "install", "--quiet", "--python", os.path.join(tmp, "bin", "python"),
                           "--no-index", "--no-deps"] + [os.path.join(store, "wheels", s, n) for s, n in wheels], env)
    if code != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        reply({"error": "uv failed (exit {}): {}".format(code, said)})
        return 1
    want = json.dumps({"expect": args["expect"], "imports": args["imports"]})
    r = subprocess.run([os.path.join(tmp, "bin", "python"), "-c", VERIFY, want], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
    try:
        problems = json.loads(r.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        problems = ["the check did not answer: " + r.stderr.decode("utf-8", "replace").strip()[-300:]]
    if problems:
        shutil.rmtree(tmp, ignore_errors=True)
        reply({"error": "the built environment does not match the lock: " + "; ".join(problems[:5])})
        return 1
    with open(os.path.join(tmp, COMPLETE), "w") as f:
        json.dump({"id": env_id, "lock": args.get("lock"), "python": facts(), "built_s": time.time() - started}, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, final)
    dfd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    reply({"state": "built", "bytes": tree_size(final), "seconds": round(time.time() - started, 1),
           "waited": waited})
    return 0


def in_use(path):
    """Whether a process of this node runs from ``path`` (its command line names it)."""
    mark = (path.rstrip("/") + "/").encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/{}/cmdline".format(pid), "rb") as f:
                if mark in f.read():
                    return True
        except OSError:
            continue
    return False


def prune(args):
    """Remove the complete environments not in ``keep``, unless a process runs from one or it is being built;
    each renamed aside first, so no look ever lists one half removed."""
    import fcntl
    root = os.path.expanduser(args["root"])
    keep = set(args["keep"])
    removed, kept = [], []
    try:
        names = sorted(os.listdir(root))
    except OSError:
        names = []
    for name in names:
        path = os.path.join(root, name)
        if not _ID_RE.fullmatch(name) or not complete(path):
            continue
        if name in keep:
            kept.append([name, "recorded"])
            continue
        if in_use(path):
            kept.append([name, "in use"])
            continue
        locks = os.path.join(root, ".locks")
        os.makedirs(locks, mode=0o700, exist_ok=True)
        fd = os.open(os.path.join(locks, name), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                kept.append([name, "being built"])
                continue
            size = tree_size(path)
            if not args.get("dry"):
                aside = os.path.join(root, ".tmp-{}-prune{}".format(name, os.getpid()))
                os.rename(path, aside)
                shutil.rmtree(aside, ignore_errors=True)
            removed.append([name, size])
        finally:
            os.close(fd)
    reply({"removed": removed, "kept": kept})
    return 0


def main(argv):
    verb, args = argv[0], json.loads(argv[1])
    if verb == "look":
        return look(args)
    if verb == "receive":
        return receive(args)
    if verb == "build":
        if argv[2:] == ["say"]:
            SAY.append(args.get("id"))
        return build(args)
    if verb == "prune":
        return prune(args)
    reply({"error": "no verb " + verb})
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
