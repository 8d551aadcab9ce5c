"""Helpers of the `packages:` bed tests: an inventory whose nodes build from a lock, what they hold."""

from __future__ import annotations

from pathlib import Path

import yaml


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
