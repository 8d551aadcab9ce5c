"""The one upload builder, every backend's: what of the script's folder leaves this machine (the
default excludes, then ``.clusterddpignore``), its size limit, and the tarball that carries it with
the shipped ``clusterddp.train`` (and, for backends that stage them with the code, private files).

SSH runs stream the tarball to each node (``jobs``); Slurm runs unpack it into the shared run folder
on the login host. Nothing here prints; bad input is a UsageError naming the file.
"""

from __future__ import annotations

import fcntl
import functools
import io
import os
import re
import stat
import tarfile
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .errors import FileRefused, UsageError
from .files import read_bounded
from .inventory.model import LOCAL, Host, Inventory, NotifyTarget
from .nodescript import SHIPPED_LIB
from .sizes import human_size

# What never leaves this machine unless .clusterddpignore re-includes it (``!.env``): VCS and
# tool caches, virtualenvs, and the usual places of secrets (SSH keys, .env files, PEM keys,
# .netrc). Gitignore syntax, read before the user's own rules (the last matching rule wins).
DEFAULT_EXCLUDES = (".git/", ".hg/", ".svn/", "__pycache__/", ".clusterddp/", ".pytest_cache/", ".mypy_cache/",
                    ".venv/", ".ssh/", ".env", ".env.*", "*.pem", "*.key", ".netrc", "id_rsa*", "id_dsa*",
                    "id_ecdsa*", "id_ed25519*",
                    # the well-known credential stores of cloud, cluster, registry and package tools
                    "**/.aws/credentials", "**/.kube/config", "**/.docker/config.json", ".git-credentials",
                    ".pypirc", ".pgpass", ".npmrc")
IGNORE_FILE_LIMIT = 1 << 20  # bytes of .clusterddpignore read at most
IGNORE_FILE = ".clusterddpignore"
DEFAULT_MAX_UPLOAD = 1 << 30


def _rule_regex(pattern: str) -> str:
    """A gitignore glob as a regex over a /-separated path: ``*`` and ``?`` stay within one
    component, ``**`` spans any, ``[...]`` is a set."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[" and "]" in pattern[i + 2:]:
            j = pattern.index("]", i + 2)
            body = pattern[i + 1:j]
            out.append("[" + ("^" + body[1:] if body[:1] == "!" else body).replace("\\", "\\\\") + "]")
            i = j
        elif c == "\\" and i + 1 < len(pattern):
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


@dataclass(frozen=True)
class IgnoreRule:
    regex: re.Pattern
    negate: bool
    dir_only: bool


def ignore_rules(lines: list[str] | tuple[str, ...]) -> list[IgnoreRule]:
    """Rules in the subset of gitignore syntax clusterddp reads: ``#`` comments, ``!negation``,
    ``dir/`` (folders only), ``/anchored`` or ``a/b`` (relative to the script's folder; otherwise
    the name matches at any depth), ``*``, ``?``, ``[...]`` and ``**``."""
    rules = []
    for line in lines:
        line = line.rstrip("\n").rstrip("\r")
        if not line.endswith("\\ "):
            line = line.rstrip(" ")
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        line = line[1:] if negate else line
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line
        body = _rule_regex(line.lstrip("/"))
        rules.append(IgnoreRule(re.compile(("" if anchored else "(?:.*/)?") + body + r"\Z", re.S), negate, dir_only))
    return rules


def verdict(rel: str, is_dir: bool, rules: list[IgnoreRule]) -> bool | None:
    """Whether the last rule that matches ``rel`` leaves it out (True) or re-includes it (False);
    None when no rule matches."""
    out = None
    for r in rules:
        if (is_dir or not r.dir_only) and r.regex.match(rel):
            out = not r.negate
    return out


def ignored(rel: str, is_dir: bool, rules: list[IgnoreRule]) -> bool:
    return bool(verdict(rel, is_dir, rules))


@dataclass(frozen=True)
class Secret:
    """A file the run names as a secret or as its inventory: never uploaded, whatever the ignore rules."""

    path: str  # absolute, as named (``~`` expanded)
    why: str   # what names it: ``the inventory``, ``a notify webhook_file (lab.yaml: notify[0])``, ...


def _absolute(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


def secret_files(inventory: Inventory, notify: Iterable[NotifyTarget] = (), env_files: Iterable[str] = (),
                 hosts: Iterable[Host] | None = None) -> tuple[Secret, ...]:
    """The files a run names that must never leave this machine in its upload: the inventory itself,
    each notify ``webhook_file`` (the inventory's and --notify's), each ``-e @FILE``, and every host's
    ``identity_file`` and ``known_hosts`` (``hosts``: the inventory's hosts and spares unless the
    backend names others, as Slurm's login host). Relative paths are taken as the launcher takes them:
    a webhook_file already made absolute by the loader, the others from the working directory."""
    out: list[Secret] = []
    if inventory.path != LOCAL:
        out.append(Secret(_absolute(inventory.path), "the inventory"))
    for t in (*inventory.notify, *notify):
        if t.kind == "webhook_file":
            out.append(Secret(_absolute(t.value), f"a notify webhook_file ({t.where or 'notify'}), a secret"))
    for f in env_files:
        out.append(Secret(_absolute(f), f"an env file (-e @{f}), a secret"))
    for h in ((*inventory.hosts, *inventory.spares) if hosts is None else hosts):
        if h.identity_file:
            out.append(Secret(_absolute(h.identity_file), f"{h.name}'s identity_file, a secret"))
        if h.transport == "ssh" and h.known_hosts:
            out.append(Secret(_absolute(h.known_hosts), f"{h.name}'s known_hosts"))
    return tuple(dict.fromkeys(out))


# Another inventory in the script's folder (``lab.yaml`` beside ``train.py``, as the README's walk-through
# has it) is left out too, unless .clusterddpignore re-includes it by a ``!`` rule: a YAML file
# (``.yaml``/``.yml``) of at most an inventory's size (1 MiB) with a top-level key that makes a file an
# inventory. Those keys are the backends' (``hosts:``, ``slurm:``, ...): the caller asks the registry
# (:func:`clusterddp.backends.inventory_keys`) and passes them in, so this module names no backend.
INVENTORY_SUFFIXES = (".yaml", ".yml")
INVENTORY_LIMIT = 1 << 20


@functools.lru_cache(maxsize=8)
def _inventory_key(keys: tuple[str, ...]) -> re.Pattern[bytes]:
    if not keys or not all(re.fullmatch(r"[a-z][a-z0-9_]*", k) for k in keys):
        raise ValueError(f"inventory keys must be lowercase names, not {keys!r}")  # a caller's bug
    return re.compile(rb"^[\"']?(?:" + b"|".join(k.encode() for k in keys) + rb")[\"']?[ \t]*:", re.M)


def other_inventory(keys: tuple[str, ...]) -> str:
    """Why another inventory is left out (``keys``: every backend's inventory key)."""
    names = [f"{k}:" for k in keys]
    said = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
    return f"an inventory (a YAML file with {said}); a !NAME line in {IGNORE_FILE} sends it"


def looks_like_inventory(path: str | Path, keys: tuple[str, ...]) -> bool:
    """Whether ``path`` is a clusterddp inventory by the rule above, ``keys`` being every backend's
    inventory key (read bounded; a link is not followed)."""
    pattern = _inventory_key(keys)
    if not str(path).lower().endswith(INVENTORY_SUFFIXES):
        return False
    try:
        raw, _ = read_bounded(path, INVENTORY_LIMIT, nofollow=True)
    except FileRefused:
        return False
    return bool(pattern.search(raw))


@dataclass(frozen=True)
class SourceFolder:
    """What the upload of a script's folder holds: paths relative to ``root`` (folders end in /)."""

    root: Path
    entries: tuple[tuple[str, int], ...]  # (relative path, bytes; 0 for folders and links)
    left_out: tuple[tuple[str, str], ...] = ()  # (relative path, why): secrets and inventories, never sent
    ignored: tuple[str, ...] = ()  # what the ignore rules left out (a folder, not entered, ends in /)

    @property
    def files(self) -> int:
        return sum(1 for rel, _ in self.entries if not rel.endswith("/"))

    @property
    def size(self) -> int:
        return sum(n for _, n in self.entries)

    def biggest(self, n: int = 5) -> list[tuple[str, int]]:
        """The largest top-level items (a folder counts all it holds), largest first."""
        tops: dict[str, int] = {}
        for rel, size in self.entries:
            head, sep, _ = rel.partition("/")
            key = head + sep
            tops[key] = tops.get(key, 0) + size
        return sorted(tops.items(), key=lambda kv: (-kv[1], kv[0]))[:n]

    def summary(self) -> str:
        return f"{self.files} files, {human_size(self.size)} ({self.size} bytes) from {self.root}"

    def report(self) -> list[str]:
        """What `up` and ``--dry-run`` say of the upload: :meth:`summary`, then each file left out as a
        secret or an inventory, and why (names escaped: they come from the disk)."""
        from .inventory import show
        return [f"upload: {self.summary()}",
                *(f"upload: left out {show(rel)[1:-1] if rel.isprintable() else show(rel)}: {why}"
                  for rel, why in self.left_out)]

    def described(self) -> list[str]:
        """What ``--dry-run`` says of the upload: :meth:`report` with :meth:`contents` after its first line."""
        said = self.report()
        return [said[0], *self.contents(), *said[1:]]

    def contents(self, n: int = 10) -> list[str]:
        """The largest top-level items sent, and the first things the ignore rules leave out (names escaped)."""
        from .inventory import some
        tops = self.biggest(n)
        more = len({rel.partition("/")[0] for rel, _ in self.entries}) - len(tops)
        out = [f"  sends: {', '.join(f'{some([rel])} ({human_size(size)})' for rel, size in tops) or 'nothing'}"
               + (f" (and {more} more)" if more > 0 else "")]
        if self.ignored:
            out.append(f"  not sent, by the ignore rules (defaults, then {IGNORE_FILE}): {some(list(self.ignored))}")
        return out


_SIZE_RE = re.compile(r"([0-9]{1,30}(?:\.[0-9]{1,30})?)\s*([KMGT]?)(?:i?B)?", re.I | re.ASCII)  # no "٣", no 1e400


def parse_size(text: str) -> int:
    """``500M``, ``2G``, ``1.5GiB``, ``100000`` (bytes) as bytes; binary units."""
    m = _SIZE_RE.fullmatch(text.strip())
    if not m:
        raise UsageError(f"--max-upload {text!r}: not a size", "e.g. --max-upload 500M or --max-upload 4G")
    return int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " "))


IGNORED_KEPT = 1000  # ignored entries a SourceFolder lists at most (for --dry-run)


def scan_source(source_dir: Path, runs_dir: Path, secrets: tuple[Secret, ...] = (), *,
                inventory_keys: tuple[str, ...]) -> SourceFolder:
    """The files the upload would send: the default excludes, then ``.clusterddpignore``'s rules;
    the runs folder is never sent. Folders that are excluded are not entered (as git: a file in
    them cannot be re-included). Links are sent as links, never followed. ``secrets`` (known by
    inode, so a hard link or another spelling of the path is caught too) are never sent, whatever
    the rules; nor is another inventory (:func:`looks_like_inventory` by ``inventory_keys``, every
    backend's) unless a ``!`` rule of ``.clusterddpignore`` re-includes it."""
    other = other_inventory(inventory_keys)
    _inventory_key(inventory_keys)  # a caller's bad keys fail before the walk
    rules = ignore_rules(DEFAULT_EXCLUDES)
    try:  # bounded and non-blocking: a FIFO or /dev/zero put there must not hang or fill memory
        rules += ignore_rules(read_bounded(source_dir / IGNORE_FILE, IGNORE_FILE_LIMIT)[0].decode().splitlines())
    except FileRefused as e:
        if e.reason != "missing":
            raise UsageError(f"cannot read {source_dir / IGNORE_FILE}: {e.problem}",
                             "make it a readable UTF-8 text file (gitignore syntax)") from None
    except UnicodeDecodeError as e:
        raise UsageError(f"cannot read {source_dir / IGNORE_FILE}: {e}", "make it readable UTF-8 text") from None
    try:  # the runs folder, known by its inode: resolving every folder's path was quadratic in the depth
        st = os.stat(runs_dir)
        skip: tuple[int, int] | None = (st.st_dev, st.st_ino)
    except OSError:
        skip = None
    withheld = _inodes(secrets)
    entries: list[tuple[str, int]] = []
    left_out: list[tuple[str, str]] = []
    ignored_: list[str] = []

    def listing(folder: str | Path, prefix: str) -> Iterator[tuple[os.DirEntry, str]]:
        with os.scandir(folder) as it:
            items = sorted(it, key=lambda e: e.name)
        return iter([(e, prefix + e.name) for e in items])

    # Depth first, in name order, with a stack of listings rather than recursion: a folder nested
    # deeper than Python's recursion limit is walked like any other.
    stack = [listing(source_dir, "")]
    while stack:
        step = next(stack[-1], None)
        if step is None:
            stack.pop()
            continue
        entry, rel = step
        is_dir = entry.is_dir(follow_symlinks=False)
        if not is_dir and _inode(entry) in withheld:
            left_out.append((rel, withheld[_inode(entry)]))
            continue
        said = verdict(rel, is_dir, rules)
        if said or (is_dir and skip is not None and _inode(entry) == skip):
            if said and len(ignored_) < IGNORED_KEPT:
                ignored_.append(rel + "/" if is_dir else rel)
            continue
        if said is None and not is_dir and looks_like_inventory(entry.path, inventory_keys):
            left_out.append((rel, other))
            continue
        if is_dir:
            entries.append((rel + "/", 0))
            stack.append(listing(entry.path, rel + "/"))
        else:
            regular = entry.is_file(follow_symlinks=False)
            entries.append((rel, entry.stat(follow_symlinks=False).st_size if regular else 0))
    return SourceFolder(source_dir, tuple(entries), tuple(left_out), tuple(ignored_))


def _inodes(secrets: tuple[Secret, ...]) -> dict[tuple[int, int], str]:
    """Each secret's file (and, where the path is a link, the link itself) by (device, inode)."""
    out: dict[tuple[int, int], str] = {}
    for s in secrets:
        for look in (os.stat, os.lstat):
            try:
                st = look(s.path)
            except (OSError, ValueError):
                continue
            out.setdefault((st.st_dev, st.st_ino), s.why)
    return out


def _inode(entry: os.DirEntry) -> tuple[int, int]:
    st = entry.stat(follow_symlinks=False)
    return st.st_dev, st.st_ino


def check_upload_size(folder: SourceFolder, limit: int) -> None:
    if folder.size <= limit:
        return
    big = ", ".join(f"{rel} ({human_size(n)})" for rel, n in folder.biggest())
    raise UsageError(f"the script's folder is {human_size(folder.size)} to upload, over the {human_size(limit)} "
                     f"limit; biggest: {big}",
                     f"list what the nodes do not need in {folder.root / IGNORE_FILE} (gitignore syntax), move the "
                     "script to a folder of its own, or raise the limit with --max-upload SIZE")


def scan(source_dir: Path, runs_dir: Path, secrets: tuple[Secret, ...] = (), *,
         inventory_keys: tuple[str, ...]) -> SourceFolder:
    """:func:`scan_source`, an unreadable folder as bad input naming it."""
    try:
        return scan_source(source_dir, runs_dir, secrets, inventory_keys=inventory_keys)
    except OSError as e:
        raise UsageError(f"cannot read the script's folder {source_dir}: {e}",
                         "make every file there readable, or move the script to a folder of its own") from None


PYTHON_SUFFIXES = (".py", ".pyw", ".pyc")


def mentions_clusterddp(folder: SourceFolder) -> bool:
    """Whether a Python file the upload sends names ``clusterddp`` (a script that imports
    clusterddp.train, or a module of its folder that does): only then does a node's launch.sh look
    for the node's own clusterddp (a python start there, before torchrun). A file that cannot be read
    counts as naming it; :func:`pack` refuses it anyway."""
    word = b"clusterddp"
    for rel, _ in folder.entries:
        if not rel.endswith(PYTHON_SUFFIXES):
            continue
        try:
            with open(folder.root / rel, "rb") as f:  # a link is read through: the node gets its target's name
                tail = b""
                while chunk := f.read(1 << 20):
                    if word in tail + chunk:
                        return True
                    tail = chunk[-len(word):]
        except OSError:
            return True
    return False


@dataclass(frozen=True)
class Upload:
    """The script's folder packed into a private temporary tarball; :meth:`discard` removes it.
    ``lock``: a descriptor of it, flock'ed while this process has it (see :func:`sweep_leftovers`)."""

    folder: SourceFolder
    path: Path
    lock: int = field(default=-1, compare=False)

    def discard(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        if self.lock >= 0:
            try:
                os.close(self.lock)
            except OSError:
                pass


# The tarball's name holds the pid of the `up` that packed it: an `up` killed outright (SIGKILL,
# the OOM killer, a power cut of a container) cannot remove its own, so the next pack removes every
# one whose process is gone and whose lock is free (a live `up` in another pid namespace holds its lock).
UPLOAD_PREFIX = "clusterddp-upload-"
_LEFTOVER = re.compile(re.escape(UPLOAD_PREFIX) + r"([0-9]{1,10})-[A-Za-z0-9_]{1,64}\.tar\.gz")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # gone, or never a pid
        return False
    except PermissionError:  # another user's
        return True
    return True


def sweep_leftovers(folder: str | None = None) -> list[str]:
    """Remove the upload tarballs that an `up` killed outright left in ``folder`` (the temporary
    folder): this user's regular files named by :data:`UPLOAD_PREFIX` whose process has ended and
    whose lock nobody holds. The paths removed; what cannot be looked at is left alone."""
    folder = folder or tempfile.gettempdir()
    removed: list[str] = []
    try:
        with os.scandir(folder) as it:
            found = [e for e in it if e.name.startswith(UPLOAD_PREFIX)]
    except OSError:
        return removed
    for e in found:
        m = _LEFTOVER.fullmatch(e.name)
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        if m is None or not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or _alive(int(m.group(1))):
            continue
        try:
            fd = os.open(e.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.unlink(e.path)
            removed.append(e.path)
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


# The package's __init__ and clusterddp.train (which needs only torch), unpacked into
# <run folder>/.clusterddp/lib for nodes whose python has no clusterddp (the node script decides:
# nodescript.ship_train_lines).
SHIPPED = ("__init__.py", "train.py")


def _add_shipped(tar: tarfile.TarFile) -> None:
    package = Path(__file__).resolve().parent
    for folder in (SHIPPED_LIB, SHIPPED_LIB + "/clusterddp"):  # never .clusterddp itself: its mode stays
        info = tarfile.TarInfo(folder)
        info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, int(time.time())
        tar.addfile(info)
    for name in SHIPPED:
        tar.add(package / name, arcname=f"{SHIPPED_LIB}/clusterddp/{name}", recursive=False)


def pack(folder: SourceFolder, private: Mapping[str, str] | None = None, private_dir: str = "") -> Upload:
    """The script's folder (``folder``, already checked against the size limit), with clusterddp.train
    for nodes without clusterddp (SHIPPED) and ``private`` (name -> text, written 0600 under
    ``private_dir``, a path relative to the run folder), as a gzip tarball in a 0600 temporary file:
    streamed from disk, never held in memory. An unreadable file is bad input."""
    sweep_leftovers()
    fd, name = tempfile.mkstemp(prefix=f"{UPLOAD_PREFIX}{os.getpid()}-", suffix=".tar.gz")  # 0600
    lock = os.open(name, os.O_RDONLY | os.O_CLOEXEC)
    fcntl.flock(lock, fcntl.LOCK_EX)  # ours, until discard or our end (see sweep_leftovers)
    try:
        with os.fdopen(fd, "wb") as f, tarfile.open(fileobj=f, mode="w:gz", compresslevel=1) as tar:
            for rel, _ in folder.entries:
                rel = rel.rstrip("/")
                tar.add(folder.root / rel, arcname=rel, recursive=False)
            _add_shipped(tar)
            for fname, text in (private or {}).items():
                data = text.encode()
                info = tarfile.TarInfo(f"{private_dir}/{fname}" if private_dir else fname)
                info.size, info.mode, info.mtime = len(data), 0o600, int(time.time())
                tar.addfile(info, io.BytesIO(data))
    except OSError as e:
        os.unlink(name)
        os.close(lock)
        raise UsageError(f"cannot pack the script's folder {folder.root}: {e}",
                         "make every file there readable, or move the script to a folder of its own") from None
    except BaseException:
        os.unlink(name)
        os.close(lock)
        raise
    return Upload(folder, Path(name), lock)
