"""The `packages:` bed tests' shared world: a bare base Python, the tiny wheels, one wheel cache."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tinywheel import make_wheel


@pytest.fixture(scope="session")
def world(bed, tmp_path_factory):
    """A bare base Python (no torch), the tiny wheels on a find-links folder, and a wheel cache shared by
    this module's tests (torch is copied into it once)."""
    root = tmp_path_factory.mktemp("envs")
    base = root / "base"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(base)], check=True)
    probe = subprocess.run([str(base / "bin" / "python"), "-c", "import torch"], capture_output=True)
    assert probe.returncode != 0, "the base Python must not have torch"
    wheels = root / "wheels"
    make_wheel(wheels, version="1.0")
    make_wheel(wheels, version="1.1")
    links = " ".join(x for x in (os.environ.get("PIP_FIND_LINKS", ""), str(wheels)) if x)
    env = {"PIP_FIND_LINKS": links, "CLUSTERDDP_CACHE": str(root / "cache")}
    return {"root": root, "python": str(base / "bin" / "python"), "env": env}
