"""Helpers of the `packages:` bed tests: an inventory whose nodes build from a lock, what they hold."""

from __future__ import annotations

from pathlib import Path

import yaml

# The CPU torch wheel and what it needs, pinned as pip-compile writes a lock (its comments too), and the
# tiny wheel (tinywheel.py): the one torch lock of test_envs_torch_ssh.py and bench/envs_up.py.
TORCH_LOCK = """\
# pip-compile --output-file=requirements.txt requirements.in
cddptiny==1.0
filelock==4.3.2
fsspec==2026.9.0
jinja2==3.1.6
markupsafe==3.0.4
mpmath==1.3.0
networkx==3.6.1
setuptools==84.2.1
sympy==1.14.0
torch==2.13.0
    # via -r requirements.in
typing-extensions==4.16.0
"""



def inventory(bed, world, tmp_path: Path, lock: str, name: str = "requirements.txt") -> Path:
    """An inventory whose nodes build from ``lock`` (written beside it) in workdirs of their own."""
    (tmp_path / name).write_text(lock)
    inv = bed.write_inventory(tmp_path / "inv.yaml", defaults_extra={"python": world["python"], "packages": name})
    doc = yaml.safe_load(inv.read_text())
    for i, h in enumerate(doc["hosts"]):
        h["workdir"] = str(tmp_path / f"node{i}")
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    return inv


def envs_of(tmp_path: Path, i: int) -> Path:
    return tmp_path / f"node{i}" / "envs"


def complete(tmp_path: Path, i: int) -> list[str]:
    """The environments complete on node ``i`` (the nodes share this filesystem)."""
    root = envs_of(tmp_path, i)
    return sorted(p.name for p in root.iterdir() if (p / ".clusterddp-env.json").is_file()) if root.is_dir() else []


def simple_index(folder: Path, wheels: list[Path]) -> Path:
    """``folder`` laid out as a PEP 503 simple index of ``wheels`` (``simple/<project>/index.html``, each link
    with its ``#sha256=``; the files under ``files/``), as a lab's index or mirror serves it."""
    import hashlib
    import os
    import re
    import shutil
    (folder / "files").mkdir(parents=True, exist_ok=True)
    projects: dict[str, list[str]] = {}
    for w in wheels:
        try:  # torch's wheel is 200 MB: linked, not copied, where the filesystem lets it
            os.link(w, folder / "files" / w.name)
        except OSError:
            shutil.copy(w, folder / "files" / w.name)
        sha = hashlib.sha256(w.read_bytes()).hexdigest()
        project = re.sub(r"[-_.]+", "-", w.name.split("-")[0]).lower()
        projects.setdefault(project, []).append(f'<a href="../../files/{w.name}#sha256={sha}">{w.name}</a><br>')
    for project, links in projects.items():
        (folder / "simple" / project).mkdir(parents=True, exist_ok=True)
        page = "<html><body>\n" + "\n".join(links) + "\n</body></html>\n"
        (folder / "simple" / project / "index.html").write_text(page)
    return folder


class Served:
    """``python -m http.server`` over ``folder`` on ``address`` (the bed's bridge: the nodes reach it); its
    request log kept. A context manager: the server is ended on leaving."""

    def __init__(self, folder: Path, address: str) -> None:
        import subprocess
        import sys
        self.log = folder.parent / f"{folder.name}.log"
        self._err = open(self.log, "wb")  # noqa: SIM115 - closed in __exit__
        self.proc = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "--bind", address, "0",
                                      "--directory", str(folder)], stdout=subprocess.PIPE, stderr=self._err)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()  # Serving HTTP on 10.1.0.1 port 41234 (http://...)
        self.port = int(line.split(" port ")[1].split()[0])

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self._err.close()

    def requests(self) -> str:
        return self.log.read_text(errors="replace")
