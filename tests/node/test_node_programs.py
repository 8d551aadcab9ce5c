"""The rules every node program (clusterddp/node/*.py) lives by, since each runs alone on a node:
the standard library only, the grammar of the oldest Python it may meet, a whole source that
runs as ``python -S -c`` where clusterddp cannot be imported, and plan.py sending exactly it.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from clusterddp import inventory, node, plan
from clusterddp.check import probe_command
from clusterddp.nodescript import q
from clusterddp.runspec import RunSpec
from helpers import resolved

# The oldest Python each must parse on (see clusterddp/node/__init__.py).
FLOOR = {"probe": (3, 5), "collect": (3, 8), "follow": (3, 8), "worker": (3, 8), "top": (3, 8), "diagnose": (3, 8),
         "stacks": (3, 8), "stackhook": (3, 8), "watch": (3, 8), "flight": (3, 8), "notify": (3, 8),
         "lease": (3, 8), "collective": (3, 8), "envinfo": (3, 5), "sampler": (3, 8), "envbuild": (3, 8),
         "where": (3, 8)}


def test_every_program_has_a_floor_and_source_reads_each_once():
    assert set(node.PROGRAMS) == set(FLOOR)
    files = {p.stem for p in Path(node.__file__).parent.glob("*.py")} - {"__init__", *node.LAUNCHER_SIDE}
    assert files == set(FLOOR)
    for name in node.PROGRAMS:
        assert node.source(name) == (Path(node.__file__).parent / f"{name}.py").read_text()
        assert node.source(name) is node.source(name)  # cached
    with pytest.raises(ValueError, match="no node program 'nope'"):
        node.source("nope")


@pytest.mark.parametrize("name", sorted(FLOOR))
def test_program_parses_on_its_oldest_python_and_imports_only_the_standard_library(name):
    tree = ast.parse(node.source(name), feature_version=FLOOR[name])  # e.g. an f-string in the probe fails here
    # The one relative import allowed: a launcher-side reader (a parse_* function, never called by
    # the program on the node) importing the shared reply helpers (node.LAUNCHER_SIDE).
    readers = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name.startswith("parse")]
    in_readers = {id(i) for f in readers for i in ast.walk(f) if isinstance(i, ast.ImportFrom)}
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.level and n.level == 1 and n.module is None:
            assert {a.name for a in n.names} <= set(node.NEIGHBOURS.get(name, ())), f"{name} imports a neighbour"
            continue
        if isinstance(n, ast.ImportFrom) and n.level:
            assert id(n) in in_readers and n.level == 1 and n.module in node.LAUNCHER_SIDE, \
                f"{name}: relative import of {n.module} outside a launcher-side parse_* reader"
            continue
        if isinstance(n, ast.ImportFrom):
            mods = [n.module or ""]
        elif isinstance(n, ast.Import):
            mods = [a.name for a in n.names]
        else:
            continue
        for m in mods:
            top = m.split(".")[0]
            assert top in sys.stdlib_module_names or top in ("torch", "__future__", *node.NEIGHBOURS.get(name, ())), \
                f"{name} imports {m}"
    assert ast.unparse(tree.body[-1]).startswith("if __name__ == '__main__':\n")  # runs main() as -c


def bare(name: str, args: list[str], cwd: Path, stdin: bytes = b"") -> subprocess.CompletedProcess:
    """Run a program's source as plan.py sends it, where clusterddp is not importable
    (-S: no site-packages, hence no editable install; cwd: not the repository)."""
    return subprocess.run([sys.executable, "-S", "-c", node.source(name), *args], cwd=cwd, input=stdin,
                          capture_output=True, timeout=60)


def test_each_program_runs_alone(tmp_path):
    p = bare("probe", [json.dumps({"full": False, "port": None, "workdir": str(tmp_path)}), ""], tmp_path)
    from clusterddp.node.probe import parse_reply
    assert parse_reply(p.stdout, p.stderr, p.returncode)["torch_error"] == "not installed", p.stderr  # -S

    (tmp_path / "node.log").write_bytes(b"line 1\nline 2\n")
    (tmp_path / "pid").write_text("0")
    (tmp_path / "exit_code").write_text("0")
    p = bare("follow", [str(tmp_path), "2", "0.01"], tmp_path)
    assert (p.returncode, p.stdout, p.stderr) == (0, b"line 2\n", b"")

    p = bare("envinfo", [], tmp_path)
    from clusterddp.node.envinfo import parse_reply as envinfo_reply
    assert envinfo_reply(p.stdout, p.stderr, p.returncode)["torch"] is None, p.stderr  # -S: no site-packages

    p = bare("collective", [json.dumps({"rank": 0, "world": 1, "limit_s": 60})], tmp_path)
    from clusterddp.node.collective import parse_output
    assert parse_output(p.stdout, 1)[0][-1]["kind"] == "torch", p.stderr

    p = bare("collect", [str(tmp_path), str(tmp_path / "node.log")], tmp_path,
             json.dumps({"log": True, "globs": ["pid"], "have": {}}).encode())
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(b'{"log": 14}\nline 1\nline 2\n{"file": "pid", "size": 1}\n{"files": 1}\n')


def test_plan_sends_the_whole_source_after_the_setup_lines():
    inv = inventory.parse("defaults: {python: /opt/py, setup: ['source ~/v/bin/activate']}\n"
                          "hosts: [{name: a, env: {K: v}}]\n", "inv.yaml")
    n = plan.build_plan(inv, resolved(RunSpec("t.py"), inv), "20261129-120000-abcd").nodes[0]
    setup = "{ source ~/v/bin/activate\n} >/dev/null 2>&1 || { true; }\n"
    assert plan.follow_command(n, 3) == setup + (f"/opt/py -S -c {q(node.source('follow'))} "
                                                 f"\"$HOME\"/clusterddp/runs/20261129-120000-abcd/.clusterddp/a 3 0.1")
    assert plan.collect_command(n).startswith(setup + f"/opt/py -S -c {q(node.source('collect'))} ")
    probe = probe_command(inv.hosts[0], "10.0.0.1", None)
    assert probe.stdin == b"export K=v\n" and f"\nexec /opt/py -c {q(node.source('probe'))} " in probe.text
