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
