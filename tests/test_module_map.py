"""docs/architecture.md is the one module map: every module of the package is in it, and every
module it names exists (issue 22: the map was hand-kept in three places and drifted)."""

from __future__ import annotations

import re

from helpers import REPO

MAP = REPO / "docs" / "architecture.md"


def _named() -> set[str]:
    return set(re.findall(r"^\| `(clusterddp/[\w/]+\.py)` \|", MAP.read_text(encoding="utf-8"), re.M))


def _modules() -> set[str]:
    return {p.relative_to(REPO).as_posix() for p in (REPO / "clusterddp").rglob("*.py")}


def test_every_module_is_in_the_map():
    missing = sorted(_modules() - _named())
    assert not missing, f"add these to the tables in {MAP.relative_to(REPO)}: {missing}"


def test_the_map_names_no_module_that_is_gone():
    gone = sorted(_named() - _modules())
    assert not gone, f"{MAP.relative_to(REPO)} names modules that do not exist: {gone}"


def test_the_layers_in_the_map_are_the_contract_lint_imports_checks():
    import tomllib
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    in_toml = [sorted(m.strip().removeprefix("clusterddp.") for m in line.split("|")) for line in layers]
    section = MAP.read_text(encoding="utf-8").split("## Layers", 1)[1].split("##", 1)[0]
    in_doc = [sorted(re.findall(r"`(\w+)`", line.split("(", 1)[0]))
              for line in re.findall(r"^\d+\. (.+)$", section, re.M)]
    assert in_doc == in_toml
