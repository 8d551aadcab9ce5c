"""Planning is pure: the rendered per-node scripts and commands are compared to golden files.

Regenerate after an intended change with ``UPDATE_GOLDEN=1 pytest tests/test_plan.py`` and
read the diff before committing it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from clusterddp import inventory, plan
from clusterddp.plan import RunSpec, build_plan

GOLDEN = Path(__file__).parent / "golden"
RUN_ID = "20261129-120000-abcd"
INV = """
defaults:
  user: ubuntu
  gpus: 2
  python: /opt/venv/bin/python
  workdir: ~/cddp work
  env: {NCCL_DEBUG: WARN, QUOTED: "it's $HOME; `x`"}
  setup: ["source ~/venv/bin/activate", "export A=1"]
collect: ["checkpoints/**"]
hosts:
  - {name: gpu-01, address: 10.0.0.11}
  - {name: gpu-02, address: 10.0.0.12, gpus: auto, env: {GLOO_SOCKET_IFNAME: eth9}}
"""
HOSTILE = ("--msg", "two words", "it's", '"dq"', "$(touch /tmp/pwned)", "a;b|c&d", "naïve ü", "", "*")


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs from its golden file"


def two_node_plan(**spec):
    inv = inventory.parse(INV, "inv.yaml")
    return build_plan(inv, RunSpec("train/t.py", HOSTILE, collect=("logs/*.txt",), **spec), RUN_ID)


def test_two_node_plan_matches_golden():
    golden("two_nodes.txt", plan.render(two_node_plan()))


def test_local_plan_matches_golden():
    inv = inventory.local(gpus=2, python="/usr/bin/python3")
    p = build_plan(inv, RunSpec("t.py", ("--epochs", "1")), RUN_ID, local_run_dir="/home/me/proj",
                   local_control_dir="/home/me/proj/runs/x/node")
    golden("local.txt", plan.render(p))


def test_node_ranks_master_and_flags():
    p = two_node_plan(gpus=3, master_port=29999, env=(("NCCL_DEBUG", "INFO"),))
    a, b = p.nodes
    assert (a.node_rank, b.node_rank) == (0, 1)
    for n in (a, b):
        argv = list(n.argv)
        assert argv[argv.index("--master-addr") + 1] == "10.0.0.11"
        assert argv[argv.index("--master-port") + 1] == "29999"
        assert argv[argv.index("--nproc-per-node") + 1] == "3"  # --gpus beats host and defaults
        assert argv[argv.index("--max-restarts") + 1] == "0"
        assert dict(n.env)["NCCL_DEBUG"] == "INFO"  # -e beats the inventory
    assert p.collect == ("checkpoints/**", "logs/*.txt")


def test_restarts_use_c10d_rendezvous_and_a_fresh_store_per_attempt():
    p = two_node_plan(max_restarts=2)
    for n in p.nodes:
        argv = list(n.argv)
        assert argv[argv.index("--max-restarts") + 1] == "2"
        assert argv[argv.index("--rdzv-backend") + 1] == "c10d"
        assert argv[argv.index("--rdzv-endpoint") + 1] == "10.0.0.11:29500"
        assert argv[argv.index("--rdzv-id") + 1] == RUN_ID and "--node-rank" not in argv
        assert dict(n.env)["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
        assert '--local-addr "$LOCAL_ADDR"' in n.launch_script and "LOCAL_ADDR=$(ip" in n.launch_script
    golden("two_nodes_restarts.txt", plan.render(p))


def test_interface_detection_only_for_variables_the_inventory_leaves_unset():
    a, b = two_node_plan().nodes
    assert 'export GLOO_SOCKET_IFNAME="$IFACE"' in a.launch_script
    assert 'export GLOO_SOCKET_IFNAME="$IFACE"' not in b.launch_script
    assert "export GLOO_SOCKET_IFNAME=eth9" in b.launch_script
    assert 'export NCCL_SOCKET_IFNAME="$IFACE"' in b.launch_script


def test_rendered_argv_survives_the_shell_byte_for_byte(tmp_path):
    """Run the rendered torchrun line through bash with a fake python that prints its argv."""
    fake = tmp_path / "py"
    fake.write_text("#!/bin/sh\nfor a in \"$@\"; do printf '%s\\0' \"$a\"; done\n")
    fake.chmod(0o755)
    inv = inventory.parse(INV.replace("/opt/venv/bin/python", str(fake)), "inv.yaml")
    node = build_plan(inv, RunSpec("t.py", HOSTILE), RUN_ID).nodes[0]
    line = next(ln for ln in node.launch_script.splitlines() if ln.startswith(plan.q(str(fake))))
    out = subprocess.run(["bash", "-c", line], capture_output=True, check=True, cwd=tmp_path).stdout
    argv = out.split(b"\0")[:-1]
    assert [a.decode() for a in argv[-len(HOSTILE):]] == list(HOSTILE)
    assert not Path("/tmp/pwned").exists()


def test_env_values_survive_the_shell_byte_for_byte():
    node = two_node_plan().nodes[0]
    exports = "\n".join(ln for ln in node.launch_script.splitlines() if ln.startswith("export QUOTED="))
    out = subprocess.run(["bash", "-c", exports + '\nprintf %s "$QUOTED"'], capture_output=True, check=True)
    assert out.stdout.decode() == "it's $HOME; `x`"


@pytest.mark.parametrize("path, rendered", [
    ("~/a b", '"$HOME"/\'a b\''), ("~", '"$HOME"'), ("/abs/x", "/abs/x"), ("rel;x", "'rel;x'"),
])
def test_qpath_expands_only_a_leading_home(path, rendered):
    assert plan.qpath(path) == rendered


def test_launch_script_is_valid_bash():
    for node in two_node_plan().nodes:
        subprocess.run(["bash", "-n"], input=node.launch_script.encode(), check=True)
