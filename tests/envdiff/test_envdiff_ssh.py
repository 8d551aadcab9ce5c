"""`clusterddp check --diff` for real, on sshd hosts in network namespaces: only what differs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from helpers import cddp, job_script, run_id_of

pytestmark = pytest.mark.integration


def diff(inv: Path, runs: Path, *args: str, rc: int) -> str:
    return cddp("check", str(inv), "--diff", "--runs-dir", str(runs), *args, check_rc=rc, timeout=120).stdout


def test_nothing_shown_when_hosts_agree_and_a_changed_copy_of_the_script_folder_is_named(bed, tmp_path):
    inv = bed.write_inventory(tmp_path / "inv.yaml")
    runs = tmp_path / "runs"
    out = diff(inv, runs, rc=0)
    lines = out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("SAME: all 2 host(s) agree with the master node1 (python, torch, "
                                                   "CUDA, NCCL, driver, "), out
    assert "no script folder: no previous run of" in out

    script = job_script(tmp_path, "t.py", "import helper\n")
    (script.parent / "helper.py").write_text("X = 1\n")
    r = cddp("up", str(inv), str(script), "--runs-dir", str(runs), "--gpus", "1", check_rc=0, timeout=180)
    run_id = run_id_of(r.stdout)
    out = diff(inv, runs, rc=0)
    assert len(out.splitlines()) == 1 and f"the script folder of run {run_id})" in out, out

    copy = Path(bed.nodes[1].workdir) / "runs" / run_id / "helper.py"
    copy.write_text("X = 2  # edited on the node\n")
    out = diff(inv, runs, rc=1)
    rows = [line.split() for line in out.splitlines()]
    assert rows[0] == ["host", "what", "node1", "(master)", "this", "host"], out
    assert len(rows) == 3 and rows[1][:3] == ["node2", "script", "folder"] and rows[1][3] != rows[1][4], out
    assert out.splitlines()[-1].startswith("DIFF: 1 of 2 host(s) differ from the master node1")


def test_one_package_installed_on_one_host_only_is_exactly_the_difference(bed, tmp_path):
    # node2's python: this interpreter with one more distribution on its path (what pip would list)
    extra = tmp_path / "extra"
    (extra / "extra_pkg-1.2.3.dist-info").mkdir(parents=True)
    (extra / "extra_pkg-1.2.3.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: extra-pkg\nVersion: 1.2.3\n")
    wrapper = tmp_path / "python-extra"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={extra} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    inv = bed.write_inventory(tmp_path / "inv.yaml")
    doc = yaml.safe_load(inv.read_text())
    doc["hosts"][1]["python"] = str(wrapper)
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))

    rep = json.loads(diff(inv, tmp_path / "runs", "--json", rc=1))
    assert rep["differences"] == [{"host": "node2", "what": "package extra-pkg", "master": "-", "value": "1.2.3"}]
    assert rep["master"] == "node1" and rep["errors"] == {} and rep["packages"] > 5
    out = diff(inv, tmp_path / "runs", rc=1)
    assert [line.split() for line in out.splitlines()[:2]] == [
        ["host", "what", "node1", "(master)", "this", "host"], ["node2", "package", "extra-pkg", "-", "1.2.3"]]
    assert len(out.splitlines()) == 3
