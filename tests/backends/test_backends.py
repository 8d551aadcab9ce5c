"""The backend seam (clusterddp/backends/): every backend in the registry implements the whole
Backend protocol, the registry picks by inventory and by run record, and nothing outside a backend
(or the modules that hold the data: inventory, record) branches on `.slurm`."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import clusterddp
from clusterddp import backends
from clusterddp.backends import base
from helpers import parse_inventory

PACKAGE = Path(clusterddp.__file__).resolve().parent
DATA = ("inventory.py", "record.py", "_inventory_schema.py", "_inventory_yaml.py", "_hostfile.py", "inventory/")


@pytest.mark.parametrize("name", sorted(backends.BACKENDS))
def test_every_registered_backend_implements_the_whole_protocol(name):
    backend = backends.get(name)
    assert backend.name == name
    wanted = {m for m, v in vars(base.Backend).items() if callable(v) and not m.startswith("_")}
    assert wanted >= {"prepare", "render", "launch", "follow", "status", "stop", "logs", "collect", "check"}
    for method in wanted:
        ours, theirs = inspect.signature(getattr(base.Backend, method)), inspect.signature(getattr(backend, method))
        assert list(theirs.parameters) == list(ours.parameters)[1:], (name, method)  # less `self`
    assert isinstance(backend.checks, frozenset)


def test_the_registry_picks_by_inventory_and_by_record(tmp_path):
    ssh = parse_inventory("hosts:\n  - {name: a, address: 10.0.0.1}\n", "i.yaml")
    slurm = parse_inventory("slurm: {}\n", "c.yaml")
    assert backends.for_inventory(ssh).name == "ssh" and backends.for_inventory(slurm).name == "slurm"


def test_nothing_outside_a_backend_branches_on_slurm():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(("backends/", "node/")) or rel.startswith(DATA) or rel in DATA:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "slurm":
                found.append(f"{rel}:{node.lineno}")
            if isinstance(node, ast.ImportFrom) and node.module and "slurm" in node.module:
                found.append(f"{rel}:{node.lineno} imports {node.module}")
    assert not found, f"branch through clusterddp.backends instead: {found}"
