"""docs/script-environment.md against what a rank really sees: a two-node run on the SSH bed whose
ranks print their environment. Every variable of the families the page covers that a rank sees is
on the page; every variable the page says is always there is there on every rank, with its value."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers import REPO, cddp, job_script, run_id_of

pytestmark = pytest.mark.integration

PAGE = REPO / "docs" / "script-environment.md"
FAMILIES = re.compile(r"(CLUSTERDDP_|TORCH|NCCL_|GLOO_|CUDA_|MASTER_|LOCAL_|GROUP_|ROLE_)|"
                      r"(RANK|WORLD_SIZE|OMP_NUM_THREADS|PYTHONPATH)$")

DUMP = r'''
import json, os
env = {k: v for k, v in os.environ.items()}
os.write(1, ("ENV " + json.dumps(env, sort_keys=True) + "\n").encode())
'''


def page_rows() -> dict[str, str]:
    """Each variable the page's tables name (first column) -> that row's 'when' cell (or '' in the
    torchrun table, whose variables are all always there)."""
    rows: dict[str, str] = {}
    for line in PAGE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| `") or len(cells) < 2:
            continue
        for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", cells[0]):
            rows[name] = cells[1] if len(cells) == 3 else "always"
    return rows


def test_the_page_lists_what_the_code_exports():
    rows = page_rows()
    assert {"CLUSTERDDP_RUN_ID", "CLUSTERDDP_HOST", "CLUSTERDDP_NODE_RANK", "RANK", "LOCAL_RANK"} <= set(rows)
    # every name clusterddp's node scripts export by a literal is on the page
    sources = "".join((REPO / "clusterddp" / f).read_text() for f in ("plan.py", "nodescript.py", "flight.py"))
    exported = set(re.findall(r"\b((?:CLUSTERDDP|TORCH_FR|TORCH_NCCL)_[A-Z_]+)\b", sources))
    exported -= {"CLUSTERDDP_STORE", "CLUSTERDDP_MIRROR_INTERVAL", "TORCH_NCCL_TRACE_BUFFER_SIZE",
                 "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"}  # the store wait's own, the launcher's, torch's old names
    assert exported - set(rows) == set(), f"exported but not on {PAGE.name}: {sorted(exported - set(rows))}"


def test_every_rank_sees_what_the_page_says(bed, tmp_path):
    script = job_script(tmp_path, "dump.py", DUMP)
    inv = bed.write_inventory(tmp_path / "inv.yaml")
    r = cddp("up", str(inv), str(script), "--runs-dir", str(tmp_path / "runs"), check_rc=0)
    run_id = run_id_of(r.stdout)
    envs = [json.loads(line.split("ENV ", 1)[1]) for line in r.stdout.splitlines() if "] ENV {" in line]
    assert len(envs) == 4, r.stdout  # 2 nodes x 2 processes
    rows = page_rows()
    seen = {k for env in envs for k in env if FAMILIES.match(k)}
    assert seen - set(rows) == set(), f"ranks see variables {PAGE.name} does not list: {sorted(seen - set(rows))}"
    always = {k for k, when in rows.items() if when == "always"}
    multi = {k for k, when in rows.items() if when == "multi-node runs"}
    for env in envs:
        missing = (always | multi) - set(env)
        assert not missing, f"the page says every rank has {sorted(missing)}"
        assert env["CLUSTERDDP_RUN_ID"] == run_id
        assert env["CLUSTERDDP_NODE_RANK"] == env["GROUP_RANK"]
        node = bed.nodes[int(env["GROUP_RANK"])]
        assert env["CLUSTERDDP_HOST"] == node.name and env["CLUSTERDDP_JOB"] == f"{run_id}/{node.name}"
        assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "eth0"
        run_dir = Path(node.workdir) / "runs" / run_id
        assert env["TORCH_FR_DUMP_TEMP_FILE"] == str(run_dir / ".clusterddp" / node.name / "flight" / "rank")
        assert env["PYTHONPATH"].split(":")[0] == str(run_dir / ".clusterddp" / node.name / "stacks" / "hook")
        # the bed's hosts have gpus: 2, so the run leased two slots on each
        assert sorted(env["CUDA_VISIBLE_DEVICES"].split(",")) == ["0", "1"]
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
