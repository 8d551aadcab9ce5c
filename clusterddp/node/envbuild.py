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


def env_id(lock_sha256, f):
    """An environment's id, as the launcher makes it (``clusterddp.envs.nodes.env_id``: a test holds the two equal)."""
    text = "\n".join([lock_sha256, f["python"], f["impl"], f["exe"], f["platform"]])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def uv_version(path):
    """The version a ``uv`` binary says it is (``uv 0.13.9 (...)``), or None."""
    try:
        r = subprocess.run([path, "--version"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.match(r"uv (\S+)", r.stdout.decode("ascii", "replace"))
    return m.group(1) if r.returncode == 0 and m else None


def usable_uv(root, version):
    """A uv of ``version`` this node has already: one unpacked in its store (``.uv/*/uv``), else one on PATH."""
    found = []
    try:
        found = sorted(os.path.join(root, ".uv", d, "uv") for d in os.listdir(os.path.join(root, ".uv")))
    except OSError:
        pass
    on_path = [os.path.join(d, "uv") for d in os.environ.get("PATH", "").split(os.pathsep) if d.startswith("/")]
    for path in found + on_path:
        if os.path.isfile(path) and os.access(path, os.X_OK) and uv_version(path) == version:
            return os.path.abspath(path)
    return None


def look(args):
    reply(looked(args))
    return 0


def lookexec(args, rest):
    """``look``, then ``rest`` (``-c <source> ARGS``: the preflight's probe, in the same command) run by the
    environment's python when it is complete, else by this base python: one command per node, not two."""
    out = looked(args)
    reply(out)
    python = sys.executable
    if out.get("id") in out["envs"]:
        python = os.path.join(out["root"], out["id"], "bin", "python")
    os.execv(python, [python] + list(rest))


def looked(args):
    root = os.path.expanduser(args["root"])
    os.makedirs(root, mode=0o700, exist_ok=True)
    envs = sorted(n for n in os.listdir(root) if _ID_RE.fullmatch(n) and complete(os.path.join(root, n)))
    out = facts()
    out.update(root=os.path.abspath(root), free=free_bytes(root), envs=envs[:MAX_LISTED],
               wheels=sorted(store_wheels(root)))
    if args.get("lock"):  # the id of the lock's environment here; a uv of ours already here, only if one is to be built
        out["id"] = env_id(args["lock"], out)
        if args.get("uv") and out["id"] not in envs:
            out["uv"] = usable_uv(out["root"], args["uv"])
    if args.get("sizes"):  # `env list`
        out.update(sizes={i: tree_size(os.path.join(root, i)) for i in envs},
                   store=tree_size(os.path.join(root, "wheels")))
    return out


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
    import fcntl
    fd = store_lock(root, fcntl.LOCK_SH)  # `env prune` waits for what is being stored
    try:
        return _receive(top, stream)
    finally:
        os.close(fd)


def _receive(top, stream):
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
for name, version in want.get("maybe", []):  # a pin whose marker may leave it out here: checked if installed
    try:
        got = metadata.version(name)
    except metadata.PackageNotFoundError:
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


MAX_GIVEN = 8 << 20  # what `build` reads on stdin: the index URL and the lock's requirements


def given(stream=None):
    """``build``'s stdin, wheels: index: ``{"index_url": ..., "requirements": ...}`` (off the command line:
    the URL may hold credentials)."""
    stream = stream or sys.stdin.buffer
    data = json.loads(stream.read(MAX_GIVEN).decode("utf-8"))
    if not isinstance(data.get("index_url"), str) or not isinstance(data.get("requirements"), str):
        raise ValueError("stdin: no index_url and requirements")
    return data


def scrub(text, url):
    """``text`` without the index URL's credentials (uv may quote the URL in its errors)."""
    from urllib.parse import unquote, urlsplit
    parts = urlsplit(url)
    secrets = [url, parts.netloc] if parts.username or parts.password else [url]
    for word in (parts.password, unquote(parts.password or "")):
        if word:
            secrets.append(word)
    for word in sorted(set(secrets), key=len, reverse=True):
        text = text.replace(word, "****")
    return text


def _opener_for(url):
    """``url`` without its credentials, and the headers that carry them (HTTP basic)."""
    import base64
    from urllib.parse import unquote, urlsplit, urlunsplit
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, {}
    bare = urlunsplit((parts.scheme, parts.hostname + (":%d" % parts.port if parts.port else ""), parts.path,
                       parts.query, ""))
    pair = "{}:{}".format(unquote(parts.username or ""), unquote(parts.password or ""))
    return bare, {"Authorization": "Basic " + base64.b64encode(pair.encode()).decode("ascii")}


def _get(url, headers, limit):
    from urllib.request import Request, urlopen
    with urlopen(Request(url, headers=headers), timeout=120) as r:
        return r.read(limit)


def uv_from_index(root, index_url, version, platforms):
    """The uv wheel of ``version`` for one of ``platforms`` fetched from the node's own index (PEP 503 page
    ``<index>/uv/``), sha256-checked against the link's ``#sha256=`` before it enters the store: (sha, name)."""
    import html
    from urllib.parse import unquote, urljoin, urlsplit
    base, headers = _opener_for(index_url)
    page = base.rstrip("/") + "/uv/"
    text = _get(page, dict(headers, Accept="text/html"), 8 << 20).decode("utf-8", "replace")
    best = None
    for href in re.findall(r'href\s*=\s*["\']([^"\']+)["\']', text):
        link = urljoin(page, html.unescape(href))
        where, _, frag = link.partition("#")
        name = unquote(where.rsplit("/", 1)[-1])
        m = re.fullmatch(r"uv-" + re.escape(version) + r"-py3-none-([A-Za-z0-9_.]+)\.whl", name)
        sha = re.fullmatch(r"sha256=([0-9a-f]{64})", frag)
        if not m or not sha:
            continue
        ranks = [platforms.index(t) for t in m.group(1).split(".") if t in platforms]
        if ranks and (best is None or min(ranks) < best[0]):
            best = (min(ranks), where, name, sha.group(1))
    if best is None:
        raise ValueError("the index has no uv {} wheel (with a sha256) for this node's platform".format(version))
    _, where, name, sha = best
    # the credentials go only to the index's own host (a file elsewhere, a CDN, gets none)
    same = urlsplit(where).netloc.rsplit("@", 1)[-1] == urlsplit(base).netloc
    top = os.path.join(root, "wheels")
    os.makedirs(os.path.join(top, sha), mode=0o700, exist_ok=True)
    tmp = os.path.join(top, ".tmp-{}-{}".format(os.getpid(), sha[:12]))
    data = _get(where, headers if same else {}, MAX_WHEEL)
    if hashlib.sha256(data).hexdigest() != sha:
        raise ValueError("the index's uv wheel {} does not match its sha256".format(name))
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, os.path.join(top, sha, name))
    return sha, name


def build(args, stream=None):
    import fcntl
    root = os.path.expanduser(args["root"])
    env_id = args["id"]
    if not _ID_RE.fullmatch(env_id):
        reply({"error": "not an environment id"})
        return 2
    index = None
    if args.get("index"):  # wheels: index: the URL and the lock on stdin, read before any wait
        try:
            index = given(stream)
        except (ValueError, UnicodeDecodeError, OSError) as e:
            reply({"error": "a malformed stdin ({})".format(type(e).__name__)})
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
    try:  # `env prune` leaves the wheel store alone while a build runs
        held = store_lock(store, fcntl.LOCK_SH)
    except OSError:  # a store this node cannot lock (another's, read-only): no prune of ours runs on it
        held = None
    try:
        return _build(args, root, store, env_id, final, index, waited)
    finally:
        if held is not None:
            os.close(held)


def store_lock(root, how):
    """The wheel store's lock (``.locks/.store``): shared by builds and receives, exclusive for `env prune`."""
    import fcntl
    os.makedirs(os.path.join(root, ".locks"), mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(root, ".locks", ".store"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, how)
    except OSError:
        os.close(fd)
        raise
    return fd


def _build(args, root, store, env_id, final, index, waited):
    for name in os.listdir(root):  # what a build cut short left: no build of this id runs now (we hold its lock)
        if name.startswith(".tmp-" + env_id + "-") or name == env_id:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    wheels = [(sha, name) for sha, name in args["wheels"]]
    how = args["uv"]
    held = store_wheels(store)
    need = wheels + ([tuple(how["wheel"])] if "wheel" in how else [])
    missing = [name for sha, name in need if held.get(sha) != name]
    if missing:
        reply({"error": "the wheel store lacks " + ", ".join(missing[:5])})
        return 1
    needed = sum(unpacked_size(os.path.join(store, "wheels", sha, name)) for sha, name in wheels) + (64 << 20)
    free = free_bytes(root)
    if needed > free:
        reply({"error": "disk", "needed": needed, "free": free})
        return 3
    uv_wheel = None
    try:
        if "path" in how and uv_version(how["path"]) == args.get("uv_version"):
            uv = how["path"]
        elif "wheel" in how:
            uv_wheel = how["wheel"][0]
            uv = uv_binary(root, how["wheel"][0], how["wheel"][1], store)
        elif index is not None:
            uv = usable_uv(root, args.get("uv_version"))
            if uv is None:
                uv_wheel, name = uv_from_index(root, index["index_url"], args.get("uv_version"), how["index"])
                uv = uv_binary(root, uv_wheel, name)
        else:
            reply({"error": "no uv {} here any more: build again".format(args.get("uv_version"))})
            return 1
    except (OSError, ValueError, StopIteration) as e:
        said = str(e) if index is None else scrub(str(e), index["index_url"])
        reply({"error": "no uv: {}".format(said)})
        return 1
    tmp = os.path.join(root, ".tmp-{}-{}".format(env_id, os.getpid()))
    env = dict(os.environ, UV_CACHE_DIR=os.path.join(root, ".uv-cache"), UV_NO_CONFIG="1",
               UV_PYTHON_DOWNLOADS="never", UV_OFFLINE="1")
    for key in ("VIRTUAL_ENV", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_INDEX", "UV_FIND_LINKS"):
        env.pop(key, None)
    started = time.time()
    code, said = _run([uv, "venv", "--quiet", "--relocatable", "--python", sys.executable, tmp], env)
    if code == 0 and index is None:
        code, said = _run([uv, "pip", "install", "--quiet", "--python", os.path.join(tmp, "bin", "python"),
                           "--no-index", "--no-deps"] + [os.path.join(store, "wheels", s, n) for s, n in wheels], env)
    elif code == 0:
        # the URL in uv's environment, never on its command line; the lock beside the environment being built
        env.pop("UV_OFFLINE")
        env["UV_DEFAULT_INDEX"] = index["index_url"]
        reqs = os.path.join(tmp, ".clusterddp-lock.txt")
        with open(reqs, "w") as f:
            f.write(index["requirements"])
        code, said = _run([uv, "pip", "install", "--quiet", "--python", os.path.join(tmp, "bin", "python"),
                           "--no-deps", "--no-build"] + (["--require-hashes"] if args.get("hashed") else [])
                          + ["-r", reqs], env)
        said = scrub(said, index["index_url"])
    if code != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        reply({"error": "uv failed (exit {}): {}".format(code, said)})
        return 1
    want = json.dumps({"expect": args["expect"], "maybe": args.get("maybe") or [], "imports": args["imports"]})
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
        # the store's wheels it was built from (and its uv's): what `env prune` keeps of the store for it
        json.dump({"id": env_id, "lock": args.get("lock"), "python": facts(), "built_s": time.time() - started,
                   "wheels": [sha for sha, _ in wheels] + ([uv_wheel] if uv_wheel else [])}, f)
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
    out = {"removed": removed, "kept": kept}
    if args.get("store"):
        out["store"] = prune_store(root, {n for n, _ in removed}, args)
    reply(out)
    return 0


def prune_store(root, removed, args):
    """The wheel store's wheels that no environment left here was built from removed (or, dry, named), under
    the store's lock (never while a build or a receive runs: then nothing, said); the uv wheel of the
    launcher's uv version and the wheels ``keep_wheels`` names (the lock's now) stay. Kept whole when an
    environment does not say its wheels (built by an older clusterddp)."""
    import fcntl
    try:
        fd = store_lock(root, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return {"busy": True, "removed": []}
    try:
        needed = set(args.get("keep_wheels") or [])
        for name in os.listdir(root):
            path = os.path.join(root, name)
            if not _ID_RE.fullmatch(name) or name in removed or not complete(path):
                continue
            try:
                with open(os.path.join(path, COMPLETE)) as f:
                    listed = json.load(f).get("wheels")
            except (OSError, ValueError, AttributeError):
                listed = None
            if not isinstance(listed, list):
                return {"unknown": name, "removed": []}
            needed.update(str(x) for x in listed)
        uv = "uv-{}-".format(args.get("uv_version") or "")
        top = os.path.join(root, "wheels")
        gone = []
        for sha, file in sorted(store_wheels(root).items()):
            if sha in needed or (args.get("uv_version") and file.startswith(uv)):
                continue
            where = os.path.join(top, sha)
            gone.append([file, tree_size(where)])
            if not args.get("dry"):
                aside = os.path.join(top, ".tmp-prune{}-{}".format(os.getpid(), sha[:12]))
                os.rename(where, aside)
                shutil.rmtree(aside, ignore_errors=True)
        if not args.get("dry"):  # what a receive cut short left (none runs now: we hold the store's lock)
            for name in os.listdir(top) if os.path.isdir(top) else []:
                if name.startswith(".tmp-"):
                    try:
                        os.unlink(os.path.join(top, name))
                    except OSError:
                        shutil.rmtree(os.path.join(top, name), ignore_errors=True)
        return {"removed": gone}
    finally:
        os.close(fd)


def main(argv):
    verb, args = argv[0], json.loads(argv[1])
    if verb == "look":
        return look(args)
    if verb == "lookexec":
        return lookexec(args, argv[2:])
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
