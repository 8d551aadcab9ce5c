"""The backend seam (clusterddp/backends/): every backend in the registry implements the whole
Backend protocol, the registry picks by inventory and by run record (by the name each carries), nothing
outside a backend branches on `.slurm` (the shared inventory and record models included: each backend
owns its data), and a third backend is a folder and a registry line: its inventory section, its schema,
its secrets and its part of run.json work with nothing else edited."""

from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path

import pytest

import clusterddp
from clusterddp import backends
from clusterddp.backends import base
from helpers import parse_inventory, resolved

PACKAGE = Path(clusterddp.__file__).resolve().parent


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
        if rel.startswith(("backends/", "node/")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "slurm":
                found.append(f"{rel}:{node.lineno}")
            if isinstance(node, ast.ImportFrom) and node.module and "slurm" in node.module:
                found.append(f"{rel}:{node.lineno} imports {node.module}")
    assert not found, f"branch through clusterddp.backends instead: {found}"


# A third backend on paper: PBS, a folder (a module here) and its line in the registry, nothing else.
PBS = '''
from dataclasses import dataclass

from clusterddp.inventory.section import ENV, Field, Line, Maybe, Model, Section


@dataclass(frozen=True)
class PbsSettings:
    queue: str | None
    env: tuple


def _read(entry, at):
    return PbsSettings(entry.queue, tuple(entry.env.items()))


SECTION = Section(key="pbs", entry=Model("_PbsEntry", {"queue": Field(Maybe(Line())), "env": Field(ENV, {})}),
                  read=_read, allocates="PBS allocates the hosts", descriptions={"queue": "The PBS queue"},
                  docs=(("`pbs`", ("_PbsEntry",), "pbs."),))


class PbsBackend:
    name = "pbs"

    def section(self):
        return SECTION

    def secrets(self, inventory):
        return inventory.backend_settings.env


BACKEND = PbsBackend()
'''


@pytest.fixture
def pbs(tmp_path, monkeypatch):
    (tmp_path / "pbs_paper.py").write_text(PBS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(backends.BACKENDS, "pbs", "pbs_paper")
    return backends.get("pbs")


def test_a_third_backend_is_a_folder_and_a_registry_line(pbs, tmp_path):
    from clusterddp.backends.base import LaunchRequest
    from clusterddp.cli.up import secrets
    from clusterddp.errors import InventoryError
    from clusterddp.inventory import inventory_json_schema as json_schema
    from clusterddp.record import BackendPart, RunRecord
    from clusterddp.runspec import RunSpec
    from helpers import make_record

    inv = parse_inventory("name: q\npbs:\n  queue: gpu\n  env: {TOKEN: s3cret}\n", "p.yaml")
    assert inv.backend == "pbs" and inv.hosts == () and backends.for_inventory(inv) is pbs
    assert inv.backend_settings.queue == "gpu"
    with pytest.raises(InventoryError) as e:  # its rules give errors located as the inventory's own
        parse_inventory("pbs:\n  queue: [a]\n", "p.yaml")
    assert (e.value.field, e.value.line) == ("pbs.queue", 2)
    with pytest.raises(InventoryError, match="not part of a `pbs:` inventory: PBS allocates the hosts"):
        parse_inventory("hosts: [{name: a}]\npbs: {}\n", "p.yaml")
    # --dry-run hides its env, asking the backend (cli/up.py names no backend's settings)
    req = LaunchRequest(inventory_arg="p.yaml", inventory=inv, spec=resolved(RunSpec("t.py", env=(("A", "b"),)), inv),
                        runs_dir=str(tmp_path))
    assert secrets(req) == (("A", "b"), ("TOKEN", "s3cret"))
    # its part of the JSON Schema and of docs/inventory.md's field reference
    schema = json_schema.generate(backends.inventory_sections())
    assert {"$ref": "#/$defs/PbsInventory"} in schema["oneOf"] and "_PbsEntry" in schema["$defs"]
    assert schema["$defs"]["_PbsEntry"]["properties"]["queue"]["description"] == "The PBS queue"
    assert "#### `pbs.queue`" in json_schema.reference(backends.inventory_sections())
    # its part of run.json: kept opaque by the record, picked by name
    rec = make_record("r1", backend=BackendPart("pbs", 1, {"job": "7.server"}))
    data = rec.to_json()
    assert data["backend"] == {"name": "pbs", "version": 1} and data["pbs"] == {"job": "7.server"}
    back = RunRecord.from_json(json.loads(json.dumps(data)), "run.json")
    assert back.backend == rec.backend and backends.for_record(back) is pbs


def test_a_third_backends_inventory_in_the_scripts_folder_is_never_uploaded(pbs, tmp_path, monkeypatch):
    # it may hold env secrets: the upload's rule asks the registry for every backend's key (through `up`)
    from clusterddp import upload
    from clusterddp.backends.ssh import launch as jobs
    from clusterddp.runspec import RunSpec
    src = tmp_path / "proj"
    src.mkdir()
    (src / "t.py").write_text("print(1)\n")
    (src / "inv.yml").write_text("hosts:\n  - {name: gpu-01, address: gpu-01.invalid}\n")
    (src / "pbs-lab.yaml").write_text("pbs:\n  queue: gpu\n  env: {TOKEN: s3cret}\n")
    monkeypatch.chdir(src)
    assert backends.inventory_keys() == ("hosts", "slurm", "pbs")
    prep = jobs.prepare("inv.yml", resolved(RunSpec(script="t.py"), "inv.yml"), str(tmp_path / "runs"))
    assert prep.folder is not None
    assert dict(prep.folder.left_out) == {"inv.yml": "the inventory",
                                          "pbs-lab.yaml": upload.other_inventory(("hosts", "slurm", "pbs"))}
    assert "pbs-lab.yaml" not in {rel for rel, _ in prep.folder.entries}


def test_without_its_registry_line_a_backends_section_is_an_unknown_key():
    from clusterddp.errors import InventoryError
    with pytest.raises(InventoryError) as e:
        parse_inventory("pbs:\n  queue: gpu\n", "p.yaml")
    assert e.value.field in ("pbs", "hosts"), e.value


def test_the_independence_contract_lists_every_registered_backend():
    """The recipe's second line: a backend's name in pyproject.toml's independence contract."""
    import tomllib

    from helpers import REPO
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (listed,) = [c["modules"] for c in contracts if c["type"] == "independence" and "backends" in c["name"]]
    assert sorted(listed) == sorted(backends.BACKENDS.values())


def test_the_add_a_backend_recipe_names_the_files_outside_the_folder_and_no_shared_model():
    """docs/architecture.md's recipe: outside its folder, a backend touches the registry, the contract's
    list and docs; not the shared inventory or record models (they hold its data opaque)."""
    from helpers import REPO
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    recipe = text.split("- **A backend**", 1)[1].split("\n- **", 1)[0]
    assert "a folder and a line" in recipe
    for named in ("backends/__init__.py", "pyproject.toml", "inventory.section.Section", "record.BackendPart",
                  "secrets"):
        assert named in recipe, named
    for shared in ("inventory/model.py", "inventory/loader.py", "record.py`", "cli/up.py"):
        assert shared not in recipe, shared
