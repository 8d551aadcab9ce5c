"""`check --diff` without SSH: the node program on this machine, the comparison, the parser under
whatever a node might send."""

from __future__ import annotations

import json
import subprocess
import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterddp import node
from clusterddp.envdiff import Difference, compare
from clusterddp.node.envinfo import MARK, EnvInfoError, files_arg, parse_reply

BASE = {"python": "3.11.7", "torch": "2.13.0+cpu", "cuda": None, "nccl": None, "driver": None,
        "packages": {"torch": "2.13.0+cpu", "typer": "0.24.0"}, "script": None}


def test_the_node_program_reports_this_python_its_packages_and_the_script_hash(tmp_path):
    (tmp_path / "t.py").write_text("print(1)\n")
    p = subprocess.run([sys.executable, "-c", node.source("envinfo"), str(tmp_path), files_arg(["t.py", "gone.py"])],
                       capture_output=True, timeout=60)
    f = parse_reply(p.stdout, p.stderr, p.returncode)
    from importlib.metadata import version
    assert f["python"] == ".".join(map(str, sys.version_info[:3])) and f["torch"] == version("torch")
    assert f["packages"]["torch"] == version("torch") and "pip" not in f["packages"]  # as pip freeze lists them
    assert f["script"]["files"] == 2 and f["script"]["missing"] == 1
    (tmp_path / "t.py").write_text("print(2)\n")
    p2 = subprocess.run([sys.executable, "-c", node.source("envinfo"), str(tmp_path), files_arg(["t.py", "gone.py"])],
                        capture_output=True, timeout=60)
    assert parse_reply(p2.stdout, p2.stderr, 0)["script"]["sha256"] != f["script"]["sha256"]


def test_only_what_differs_is_listed_per_host_against_the_master():
    other = {**BASE, "torch": "2.12.0", "packages": {"torch": "2.12.0", "requests": "2.31.0", "typer": "0.24.0"}}
    rep = compare("a", {"a": BASE, "b": dict(BASE), "c": other}, {})
    assert rep.differences == (Difference("c", "torch", "2.13.0+cpu", "2.12.0"),
                               Difference("c", "package requests", "-", "2.31.0"),
                               Difference("c", "package torch", "2.13.0+cpu", "2.12.0"))
    assert not rep.ok and rep.master == "a" and rep.packages == 2
    assert compare("a", {"a": BASE, "b": dict(BASE)}, {}).ok


def test_the_script_folder_counts_only_for_hosts_of_that_run():
    h = {"sha256": "0" * 64, "files": 3, "missing": 0}
    facts = {"a": {**BASE, "script": h}, "b": {**BASE, "script": {**h, "sha256": "1" * 64}}, "c": BASE}
    rep = compare("a", facts, {}, run_hosts=("a", "b"), run_id="r1")
    assert rep.differences == (Difference("b", "script folder", "000000000000", "111111111111"),)
    assert compare("a", facts, {}).ok  # no previous run: not compared


def test_a_host_that_did_not_answer_is_named_and_the_master_missing_changes_the_reference():
    rep = compare("a", {"b": BASE, "c": {**BASE, "driver": "550.1"}}, {"a": "cannot connect: timed out"})
    assert rep.master == "b" and "the master a did not answer: compared with b" in (rep.note or "")
    assert rep.differences == (Difference("c", "driver", "-", "550.1"),) and rep.errors == {"a": "cannot connect: "
                                                                                                  "timed out"}


def test_replies_are_checked():
    ok = (MARK + json.dumps(BASE)).encode()
    assert parse_reply(b"motd\n" + ok, b"", 0)["packages"] == BASE["packages"]
    for bad, why in (({**BASE, "packages": ["torch"]}, "packages must be"), ({**BASE, "python": 3}, "no python"),
                     ({**BASE, "script": {"sha256": "x"}}, "script must be"), ({**BASE, "torch": []}, "torch must")):
        try:
            parse_reply((MARK + json.dumps(bad)).encode(), b"", 0)
        except EnvInfoError as e:
            assert why in str(e)
        else:
            raise AssertionError(bad)
    try:
        parse_reply(b"", b"bash: /opt/py: No such file or directory\n", 127)
    except EnvInfoError as e:
        assert str(e) == "bash: /opt/py: No such file or directory"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(1 << 70), max_value=1 << 70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=12)


@settings(derandomize=True, database=None, deadline=None, max_examples=300,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(sorted(BASE) + ["x"]), json_values, max_size=4), st.binary(max_size=40))
def test_parser_and_compare_take_anything_a_node_sends(changes, junk):
    raw = junk + b"\n" + (MARK + json.dumps({**BASE, **changes})).encode()
    try:
        f = parse_reply(raw, b"", 0)
    except EnvInfoError as e:
        assert "envinfo reply" in str(e)
        return
    rep = compare("a", {"a": BASE, "b": f}, {})
    assert json.dumps(rep.to_dict())


def test_what_a_node_sends_is_one_line_in_every_row():
    from clusterddp.envdiff import facts_of
    from clusterddp.fleet import HostResult
    from clusterddp.transport.base import CommandResult
    forged = {**BASE, "torch": "2.13.0\nSAME: all 9 host(s) agree", "packages": {"a\nb": "1\r2"}}
    ok = HostResult("b", CommandResult(0, (MARK + json.dumps(forged)).encode(), b""))
    bad = HostResult("c", CommandResult(127, b"", b"bash: /opt/py: No such file\nFAIL forged\n"))
    facts, errors = facts_of([ok, bad])
    assert facts["b"]["torch"] == "2.13.0\\nSAME: all 9 host(s) agree"
    assert facts["b"]["packages"] == {"a\\nb": "1\\r2"}
    assert "\n" not in errors["c"] and "FAIL forged" in errors["c"]
