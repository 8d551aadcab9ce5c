"""This machine's wheel cache: every wheel a lock needs for a node's Python and platform, fetched once.

``pip download`` does the fetching, with this machine's own pip configuration (its index, ``find-links``,
``pip.conf``, ``PIP_*``): the nodes need no index. Wheels are kept by content
(``<cache>/wheels/<sha256>/<file>``); what a lock needs for a target is remembered in
``<cache>/locks/<lock sha256>-<target>.json``, so a second run fetches nothing and runs no pip.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from .lock import Lock

UV_VERSION = "0.13.9"  # the installer sent to every node (its wheel holds a static binary)


def cache_dir() -> Path:
    """``$CLUSTERDDP_CACHE``, else ``$XDG_CACHE_HOME/clusterddp`` (``~/.cache/clusterddp``)."""
    if os.environ.get("CLUSTERDDP_CACHE"):
        return Path(os.environ["CLUSTERDDP_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "clusterddp"


@dataclass(frozen=True)
class Target:
    """What a node's environment is built for: its Python (``3.11``, tag ``cp311``) and platform tag."""

    python: str       # major.minor
    tag: str          # cp311
    platform: str     # manylinux_2_36_x86_64

    @property
    def key(self) -> str:
        return f"{self.tag}-{self.platform}"


@dataclass(frozen=True)
class Wheel:
    sha256: str
    name: str
    size: int

    def path(self, cache: Path) -> Path:
        return cache / "wheels" / self.sha256 / self.name


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(lock: Lock, target: Target, cache: Path | None = None, *, hosts: tuple[str, ...] = (),
          pip: tuple[str, ...] = (sys.executable, "-m", "pip")) -> tuple[Wheel, ...]:
    """Every wheel ``lock`` needs on ``target`` (for ``hosts``, named in errors), from the cache or fetched
    into it. UsageError (exit 2) naming the package when the index has no wheel of it for the target."""
    cache = cache or cache_dir()
    index = cache / "locks" / f"{lock.sha256}-{target.key}.json"
    known = _known(index, cache)
    if known is not None:
        return known
    reqs = lock.requirements()
    wheels = _download(reqs, target, cache, pip, lock.hashed, lambda name: _refused(lock, target, hosts, name))
    index.parent.mkdir(parents=True, exist_ok=True)
    _write(index, [[w.sha256, w.name, w.size] for w in wheels])
    return wheels


def known(lock: Lock, target: Target, cache: Path | None = None) -> tuple[Wheel, ...] | None:
    """The wheels ``lock`` needs on ``target`` if this machine's cache has them already (None: not fetched yet)."""
    cache = cache or cache_dir()
    return _known(cache / "locks" / f"{lock.sha256}-{target.key}.json", cache)


def installer(target: Target, cache: Path | None = None,
              pip: tuple[str, ...] = (sys.executable, "-m", "pip")) -> Wheel:
    """The uv wheel for ``target``'s platform (the nodes' installer), from the cache or fetched."""
    cache = cache or cache_dir()
    index = cache / "locks" / f"uv-{UV_VERSION}-{target.platform}.json"
    known = _known(index, cache)
    if known is None:
        def refused(name: str) -> UsageError:
            return UsageError(f"no uv {UV_VERSION} wheel for {target.platform} from this machine's index",
                              "the nodes install with uv: make its wheel reachable from this machine's pip")
        known = _download(f"uv=={UV_VERSION}\n", target, cache, pip, False, refused, any_python=True)
        index.parent.mkdir(parents=True, exist_ok=True)
        _write(index, [[w.sha256, w.name, w.size] for w in known])
    return known[0]


def platforms(tag: str) -> list[str]:
    """The platform tags a node of platform ``tag`` takes: a ``manylinux_2_<N>`` glibc takes every older
    manylinux (and the legacy names of 2_17, 2_12, 2_5), newest first."""
    m = re.fullmatch(r"manylinux_(\d+)_(\d+)_(.+)", tag)
    if not m or m.group(1) != "2":
        return [tag]
    arch = m.group(3)
    out = [f"manylinux_2_{k}_{arch}" for k in range(int(m.group(2)), 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    return out + [f"{legacy[k]}_{arch}" for k in (17, 12, 5) if k <= int(m.group(2))]


def _known(index: Path, cache: Path) -> tuple[Wheel, ...] | None:
    try:
        rows = json.loads(index.read_text())
        wheels = tuple(Wheel(str(s), str(n), int(z)) for s, n, z in rows)
    except (OSError, ValueError, TypeError):
        return None
    if all(w.path(cache).is_file() and w.path(cache).stat().st_size == w.size for w in wheels):
        return wheels
    return None


def _write(path: Path, data: object) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")  # runs' and threads' own
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _download(reqs: str, target: Target, cache: Path, pip: tuple[str, ...], hashed: bool, refused,
              any_python: bool = False) -> tuple[Wheel, ...]:
    (cache / "wheels").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".fetch-") as tmp:
        req_file = Path(tmp) / "lock.txt"
        req_file.write_text(reqs)
        dest = Path(tmp) / "dl"
        argv = [*pip, "download", "--quiet", "--no-deps", "--only-binary=:all:", "--dest", str(dest),
                *[w for p in platforms(target.platform) for w in ("--platform", p)], "-r", str(req_file)]
        if not any_python:
            argv += ["--python-version", target.python, "--implementation", target.tag[:2],
                     "--abi", target.tag, "--abi", "abi3", "--abi", "none"]
        if hashed:
            argv.append("--require-hashes")
        r = subprocess.run(argv, capture_output=True, text=True, errors="replace")
        if r.returncode != 0:
            m = re.search(r"(?:No matching distribution found for|satisfies the requirement) ([A-Za-z0-9._-]+)",
                          r.stderr)
            if m:
                raise refused(m.group(1))
            lines = [line for line in r.stderr.strip().splitlines() if line.strip()]
            raise UsageError(f"pip download failed: {' / '.join(lines[-4:])}",
                             "check this machine's pip configuration (`pip config list`) and the lock's hashes")
        out = []
        for f in sorted(dest.iterdir()):
            if not f.name.endswith(".whl"):
                continue
            sha = _sha256(f)
            where = cache / "wheels" / sha
            where.mkdir(parents=True, exist_ok=True)
            os.replace(f, where / f.name)
            out.append(Wheel(sha, f.name, (where / f.name).stat().st_size))
        return tuple(out)


def _refused(lock: Lock, target: Target, hosts: tuple[str, ...], name: str) -> UsageError:
    line = lock.line_of(name.split("==")[0])
    where = f"{lock.path}:{line}" if line else lock.path
    on = f" ({', '.join(hosts)})" if hosts else ""
    return UsageError(f"{where}: {name}: no wheel for Python {target.python} on {target.platform}{on} "
                      "from this machine's index",
                      "pin a version that has a wheel for the nodes' Python and platform, or check this machine's "
                      "pip configuration (`pip config list`)")
