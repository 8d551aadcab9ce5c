"""A `packages:` lock file read as frozen data: every package pinned to one version (pure; no network).

Two formats: a fully pinned requirements file (``pip-compile`` / ``uv pip compile`` output, with or
without ``--hash``), and PEP 751 ``pylock.toml``. A file is untrusted input: bounded, every line checked,
and anything that is not a lock (a loose ``torch>=2``, an editable, a URL, garbage) is a
:class:`~clusterddp.errors.LockFileError` naming the file and line.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import LockFileError

MAX_BYTES = 4 << 20  # a lock of thousands of packages with hashes is well under a megabyte
MAX_PINS = 10000
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
NAME_RE = re.compile(_NAME)
# PEP 440 versions (and their local part); no wildcard: `==2.*` is not a pin
VERSION_RE = re.compile(r"(?:[0-9]+!)?[0-9]+(?:\.[0-9]+)*(?:[._-]?(?:a|b|c|rc|alpha|beta|pre|preview)[._-]?[0-9]*)?"
                        r"(?:(?:-[0-9]+)|(?:[._-]?(?:post|rev|r)[._-]?[0-9]*))?(?:[._-]?dev[._-]?[0-9]*)?"
                        r"(?:\+[a-z0-9]+(?:[._-][a-z0-9]+)*)?", re.I)
_HASH_LEN = {"sha256": 64, "sha384": 96, "sha512": 128}
_REQ = re.compile(rf"(?P<name>{_NAME})\s*(?:\[(?P<extras>[^\]]*)\])?\s*(?P<rest>.*)", re.S)
# requirements-file options that say where pip looks: the launcher uses its own configured index instead
_IGNORED_OPTIONS = ("--index-url", "-i", "--extra-index-url", "--find-links", "-f", "--trusted-host",
                    "--prefer-binary", "--no-index", "--only-binary", "--pre")
_NOT_A_LOCK = {"-r": "includes another file", "--requirement": "includes another file",
               "-c": "includes a constraints file", "--constraint": "includes a constraints file",
               "-e": "is an editable install", "--editable": "is an editable install"}
HINT = ("give a fully pinned lock: `pip-compile` or `uv pip compile requirements.in -o requirements.txt` "
        "output, or a PEP 751 pylock.toml (`uv export --format pylock.toml`)")


def normalize(name: str) -> str:
    """PEP 503's normalized project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Pin:
    """One package of a lock: its name (as written), exact version, accepted hashes (``sha256:<hex>``),
    environment marker, and the line it is on."""

    name: str
    version: str
    hashes: tuple[str, ...] = ()
    marker: str | None = None
    extras: str | None = None
    line: int = 0

    @property
    def key(self) -> str:
        return normalize(self.name)

    def requirement(self) -> str:
        """The line pip reads for it."""
        extras = f"[{self.extras}]" if self.extras else ""
        marker = f" ; {self.marker}" if self.marker else ""
        return f"{self.name}{extras}=={self.version}{marker}" + "".join(f" --hash={h}" for h in self.hashes)


@dataclass(frozen=True)
class Lock:
    """A lock file's packages. ``sha256``: of its bytes (what an environment's id starts from)."""

    path: str
    format: str  # "requirements" or "pylock"
    sha256: str
    pins: tuple[Pin, ...]

    @property
    def hashed(self) -> bool:
        """Every package carries hashes: pip then checks each wheel against them (``--require-hashes``)."""
        return all(p.hashes for p in self.pins)

    def requirements(self) -> str:
        """The lock as a requirements file for ``pip download``."""
        return "".join(p.requirement() + "\n" for p in self.pins)

    def line_of(self, name: str) -> int | None:
        key = normalize(name)
        return next((p.line for p in self.pins if p.key == key), None)


def read(path: str | Path) -> Lock:
    """The lock at ``path`` (its format from its name: ``pylock.toml``/``pylock.*.toml``, else a
    requirements file). LockFileError for anything that is not a lock."""
    p = Path(path)
    shown = str(path)
    try:
        with open(p, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise LockFileError(shown, f"cannot be read: {e.strerror or e}",
                            hint="check the path (relative to the inventory's folder)") from None
    if len(data) > MAX_BYTES:
        raise LockFileError(shown, f"is over {MAX_BYTES >> 20} MiB: not a lock file", hint=HINT)
    return parse(data, shown)


def detect(path: str) -> str:
    """``pylock`` or ``requirements`` from a lock file's name; other known lock files are refused."""
    name = Path(path).name
    if re.fullmatch(r"pylock(\.[^.]+)?\.toml", name):
        return "pylock"
    if name.endswith(".toml") or name.endswith(".lock"):
        raise LockFileError(path, f"{name}: not a lock format clusterddp reads",
                            hint=HINT + "; from uv.lock: `uv export --format requirements-txt` or "
                            "`uv export --format pylock.toml`")
    return "requirements"


def parse(data: bytes, path: str) -> Lock:
    """The lock in ``data``, read from ``path`` (which names it in errors and decides its format)."""
    fmt = detect(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise LockFileError(path, "is not UTF-8 text: not a lock file", line, HINT) from None
    if "\0" in text:
        raise LockFileError(path, "holds a NUL byte: not a lock file", text[:text.index("\0")].count("\n") + 1, HINT)
    pins = parse_pylock(text, path) if fmt == "pylock" else parse_requirements(text, path)
    if not pins:
        raise LockFileError(path, "lists no package", hint=HINT)
    if len(pins) > MAX_PINS:
        raise LockFileError(path, f"lists over {MAX_PINS} packages", hint=HINT)
    _no_twice(pins, path)
    bare = next((p for p in pins if not p.hashes), None)
    if bare is not None and any(p.hashes for p in pins):  # pip checks all or none
        raise LockFileError(path, f"{bare.name} has no --hash while other packages have", bare.line,
                            "lock it again with hashes for every package (`pip-compile --generate-hashes`, "
                            "`uv pip compile --generate-hashes`), or with none")
    return Lock(path, fmt, hashlib.sha256(data).hexdigest(), tuple(pins))


def _no_twice(pins: list[Pin], path: str) -> None:
    seen: dict[str, Pin] = {}
    for p in pins:
        if p.marker is None and p.key in seen:  # with markers, one pin per Python version or platform is usual
            raise LockFileError(path, f"{p.name} is pinned twice (also line {seen[p.key].line})", p.line,
                                "keep one pin per package (or add environment markers that tell them apart)")
        seen.setdefault(p.key, p)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each line, ``\\``-continued lines joined and comments dropped."""
    out: list[tuple[int, str]] = []
    buf, start = "", 0
    for i, raw in enumerate(text.splitlines(), 1):
        line = re.sub(r"(^|\s)#.*", "", raw)
        if not buf:
            start = i
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        if buf.strip():
            out.append((start, buf.strip()))
        buf = ""
    if buf.strip():
        out.append((start, buf.strip()))
    return out


def parse_requirements(text: str, path: str) -> list[Pin]:
    """The pins of a requirements file; LockFileError at the first line that is not an exact pin."""
    pins = []
    for n, line in _logical_lines(text):
        if line.startswith("-"):
            flag = re.split(r"[\s=]", line, maxsplit=1)[0]
            if flag in _NOT_A_LOCK:
                raise LockFileError(path, f"{flag}: {_NOT_A_LOCK[flag]}, which a lock does not", n, HINT)
            if flag in _IGNORED_OPTIONS:
                continue  # where to look: the launcher's own index settings decide (docs/environments.md)
            raise LockFileError(path, f"{_show(flag)}: not an option of a lock file", n, HINT)
        pins.append(_requirement(line, n, path))
    return pins


def _show(text: str, limit: int = 60) -> str:
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def _requirement(line: str, n: int, path: str) -> Pin:
    hashes = []
    for h in re.finditer(r"\s--hash[=\s]\s*(\S+)", " " + line):
        hashes.append(_hash(h.group(1), n, path))
    body = re.sub(r"\s--hash[=\s]\s*\S+", "", " " + line).strip()
    if re.search(r"\s--?[A-Za-z]", " " + body):
        raise LockFileError(path, f"{_show(body)}: a per-requirement option other than --hash", n, HINT)
    req, _, marker = body.partition(";")
    m = _REQ.fullmatch(req.strip())
    if not m:
        raise LockFileError(path, f"{_show(line)} is not a requirement", n, HINT)
    name, extras, rest = m.group("name"), m.group("extras"), m.group("rest").strip()
    if rest.startswith("@"):
        raise LockFileError(path, f"{name}: a URL requirement ({_show(rest[1:].strip(), 40)}); the nodes get wheels "
                            "from the launcher's index", n, "pin a version from an index instead")
    pin = re.fullmatch(r"===?\s*(\S+)", rest)
    if not pin or not VERSION_RE.fullmatch(pin.group(1)):
        what = req.strip()
        raise LockFileError(path, f"{_show(what)} is not pinned to one version", n,
                            f"pin it (`{name}==<version>`): {HINT}")
    if extras is not None and not re.fullmatch(rf"\s*{_NAME}(\s*,\s*{_NAME})*\s*", extras):
        raise LockFileError(path, f"{name}[{_show(extras)[1:-1]}]: not a list of extras", n, HINT)
    return Pin(name, pin.group(1), tuple(hashes), _marker(marker, n, path), extras and extras.strip(), n)


def _marker(marker: str, n: int, path: str) -> str | None:
    marker = marker.strip()
    if not marker:
        return None
    if len(marker) > 500 or not re.fullmatch(r"[A-Za-z0-9_\s.'\"()<>=!~,*+-]+", marker):
        raise LockFileError(path, f"{_show(marker)} is not an environment marker", n, HINT)
    return marker


def _hash(value: str, n: int, path: str) -> str:
    algo, _, digest = value.partition(":")
    if _HASH_LEN.get(algo) != len(digest) or not re.fullmatch(r"[0-9a-f]+", digest):
        raise LockFileError(path, f"--hash={_show(value, 30)} is not a sha256/sha384/sha512 hash", n, HINT)
    return value


def parse_pylock(text: str, path: str) -> list[Pin]:
    """The pins of a PEP 751 ``pylock.toml`` (``lock-version`` 1.x; wheels only: the nodes install no sdist)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        raise LockFileError(path, "pylock.toml needs Python 3.11 or newer on this machine",
                            hint="run clusterddp with Python 3.11+, or give a requirements lock") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"line (\d+)", str(e))
        line = int(m.group(1)) if m else text.count("\n") + 1 if "end of document" in str(e) else None
        raise LockFileError(path, f"is not TOML ({str(e).split('(')[0].strip()})", line, HINT) from None
    version = doc.get("lock-version")
    if not isinstance(version, str) or version.split(".")[0] != "1":
        raise LockFileError(path, f"lock-version {_show(str(version))}: not a PEP 751 lock this clusterddp reads",
                            _line_of(text, "lock-version"), "give lock-version = \"1.0\" (PEP 751)")
    packages = doc.get("packages")
    if not isinstance(packages, list) or not all(isinstance(p, dict) for p in packages):
        raise LockFileError(path, "has no [[packages]] tables", _line_of(text, "packages"), HINT)
    starts = [i for i, line in enumerate(text.splitlines(), 1) if line.strip().replace(" ", "") == "[[packages]]"]
    pins = []
    for i, p in enumerate(packages):
        n = starts[i] if i < len(starts) else None
        name, ver = p.get("name"), p.get("version")
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise LockFileError(path, f"packages[{i}]: name {_show(str(name))} is not a package name", n, HINT)
        if not isinstance(ver, str) or not VERSION_RE.fullmatch(ver):
            raise LockFileError(path, f"{name}: version {_show(str(ver))} is not one version", n,
                                f"pin it: {HINT}")
        wheels = p.get("wheels")
        if not isinstance(wheels, list) or not wheels:
            raise LockFileError(path, f"{name}: no wheels (an sdist, a VCS or a directory source); the nodes "
                                "install wheels only", n, "lock a version that has wheels")
        hashes = []
        for w in wheels:
            h = w.get("hashes") if isinstance(w, dict) else None
            if not isinstance(h, dict) or not h:
                raise LockFileError(path, f"{name}: a wheel without hashes", n, "PEP 751 wheels carry hashes")
            for algo, digest in h.items():
                if algo in _HASH_LEN:
                    hashes.append(_hash(f"{algo}:{digest}", n or 0, path))
        marker = p.get("marker")
        if marker is not None and not isinstance(marker, str):
            raise LockFileError(path, f"{name}: marker is not a string", n, HINT)
        pins.append(Pin(name, ver, tuple(dict.fromkeys(hashes)), _marker(marker or "", n or 0, path), None, n or 0))
    return pins


def _line_of(text: str, key: str) -> int | None:
    for i, line in enumerate(text.splitlines(), 1):
        if re.match(rf"\s*{re.escape(key)}\s*=|\s*\[\[?{re.escape(key)}", line):
            return i
    return None
