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


def short_aliases(source: str) -> list[str]:
    """`import x as P` / `from . import plan as P` with a one- or two-letter name (issue 41: 40 of them, `P`,
    `S`, `SP`, ... said nothing of what they named); numpy's, hypothesis' and the like's usual ones kept."""
    import ast
    usual = {"np", "st", "dt", "mp"}
    return [f"{a.name} as {a.asname}" for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names
            if a.asname and len(a.asname) <= 2 and a.asname not in usual]


def test_short_aliases_finds_what_it_must():
    assert short_aliases("from . import plan as P\nimport clusterddp.stacks as SS\n") == ["plan as P",
                                                                                      "clusterddp.stacks as SS"]
    assert short_aliases("import numpy as np\nfrom . import plan\nx = 'import plan as P'\n") == []


def test_no_module_is_imported_under_a_one_or_two_letter_name():
    found = {p.relative_to(REPO).as_posix(): short_aliases(p.read_text(encoding="utf-8"))
             for top in ("clusterddp", "tests", "bench", "scripts") for p in (REPO / top).rglob("*.py")}
    assert {p: a for p, a in found.items() if a} == {}
