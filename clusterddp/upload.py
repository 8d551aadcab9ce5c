"""The one upload builder, every backend's: what of the script's folder leaves this machine (the
default excludes, then ``.clusterddpignore``), its size limit, and the tarball that carries it with
the shipped ``clusterddp.train`` (and, for backends that stage them with the code, private files).

SSH runs stream the tarball to each node (``jobs``); Slurm runs unpack it into the shared run folder
on the login host. Nothing here prints; bad input is a UsageError naming the file.
"""

from __future__ import annotations

import io
import os
import re
import tarfile
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from .errors import FileRefused, UsageError
from .files import read_bounded
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


def ignored(rel: str, is_dir: bool, rules: list[IgnoreRule]) -> bool:
    verdict = False
    for r in rules:
        if (is_dir or not r.dir_only) and r.regex.match(rel):
            verdict = not r.negate
    return verdict


@dataclass(frozen=True)
class SourceFolder:
    """What the upload of a script's folder holds: paths relative to ``root`` (folders end in /)."""

    root: Path
    entries: tuple[tuple[str, int], ...]  # (relative path, bytes; 0 for folders and links)

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


_SIZE_RE = re.compile(r"([0-9]{1,30}(?:\.[0-9]{1,30})?)\s*([KMGT]?)(?:i?B)?", re.I | re.ASCII)  # no "٣", no 1e400


def parse_size(text: str) -> int:
    """``500M``, ``2G``, ``1.5GiB``, ``100000`` (bytes) as bytes; binary units."""
    m = _SIZE_RE.fullmatch(text.strip())
    if not m:
        raise UsageError(f"--max-upload {text!r}: not a size", "e.g. --max-upload 500M or --max-upload 4G")
    return int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " "))


def scan_source(source_dir: Path, runs_dir: Path) -> SourceFolder:
    """The files the upload would send: the default excludes, then ``.clusterddpignore``'s rules;
    the runs folder is never sent. Folders that are excluded are not entered (as git: a file in
    them cannot be re-included). Links are sent as links, never followed."""
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
    entries: list[tuple[str, int]] = []

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
        if ignored(rel, is_dir, rules) or (is_dir and skip is not None and _inode(entry) == skip):
            continue
        if is_dir:
            entries.append((rel + "/", 0))
            stack.append(listing(entry.path, rel + "/"))
        else:
            regular = entry.is_file(follow_symlinks=False)
            entries.append((rel, entry.stat(follow_symlinks=False).st_size if regular else 0))
    return SourceFolder(source_dir, tuple(entries))


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


def scan(source_dir: Path, runs_dir: Path) -> SourceFolder:
    """:func:`scan_source`, an unreadable folder as bad input naming it."""
    try:
        return scan_source(source_dir, runs_dir)
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
    """The script's folder packed into a private temporary tarball; :meth:`discard` removes it."""

    folder: SourceFolder
    path: Path

    def discard(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


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
    fd, name = tempfile.mkstemp(prefix="clusterddp-upload-", suffix=".tar.gz")  # 0600
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
        raise UsageError(f"cannot pack the script's folder {folder.root}: {e}",
                         "make every file there readable, or move the script to a folder of its own") from None
    except BaseException:
        os.unlink(name)
        raise
    return Upload(folder, Path(name))
