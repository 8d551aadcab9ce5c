"""Inventory parsing and validation: every rule by name, every error located."""

from __future__ import annotations

import pytest

from clusterddp import inventory
from clusterddp.errors import InventoryError

GOOD = """
name: lab
defaults:
  user: ubuntu
  gpus: 8
  env: {NCCL_DEBUG: WARN, A: x}
  setup: ["source ~/venv/bin/activate"]
master: {port: 29600}
collect: ["checkpoints/**"]
hosts:
  - name: gpu-01
    address: 10.0.0.11
  - name: gpu-02
    address: 10.0.0.12
    gpus: 4
    user: root
    env: {A: y, B: "1"}
"""


def parse(text: str):
    return inventory.parse(text, "inv.yaml")


def error_of(text: str) -> InventoryError:
    with pytest.raises(InventoryError) as e:
        parse(text)
    return e.value


def test_host_entry_wins_over_defaults_and_env_merges_by_key():
    inv = parse(GOOD)
    a, b = inv.hosts
    assert (a.user, a.gpus, b.user, b.gpus) == ("ubuntu", 8, "root", 4)
    assert dict(a.env) == {"NCCL_DEBUG": "WARN", "A": "x"}
    assert dict(b.env) == {"NCCL_DEBUG": "WARN", "A": "y", "B": "1"}
    assert a.setup == b.setup == ("source ~/venv/bin/activate",)


def test_builtin_defaults_and_unset_ssh_fields_left_to_ssh_config():
    h = parse("hosts: [{name: box}]").hosts[0]
    assert h.address == "box"  # resolved later through ~/.ssh/config
    assert h.user is None and h.port is None and h.identity_file is None
    assert (h.host_key_policy, h.gpus, h.python, h.workdir) == ("strict", "auto", "python3", "~/clusterddp")


def test_master_defaults_to_first_host_and_its_address():
    inv = parse(GOOD)
    assert (inv.master.host, inv.master.addr, inv.master.port) == ("gpu-01", "10.0.0.11", 29600)
    inv2 = parse(GOOD.replace("master: {port: 29600}", "master: {host: gpu-02, addr: 192.0.2.5}"))
    assert (inv2.master.host, inv2.master.addr, inv2.master.port) == ("gpu-02", "192.0.2.5", 29500)


def test_node_order_is_inventory_order():
    assert [h.name for h in parse(GOOD).hosts] == ["gpu-01", "gpu-02"]


@pytest.mark.parametrize("text, field, line, words", [
    ("hosts: []\n", "hosts", 1, "at least one host"),
    ("hosts:\n  - name: a\n    gpus: -1\n", "hosts[0].gpus", 3, ">= 1"),
    ("hosts:\n  - name: a\n  - name: b\n    gpus: \"4\"\n", "hosts[1].gpus", 4, "whole number"),
    ("hosts:\n  - name: a\n    gpu: 3\n", "hosts[0].gpu", 3, "unknown key"),
    ("hosts:\n  - name: a\n  - name: a\n", "hosts[1].name", 3, "duplicate"),
    ("hosts:\n  - name: a\nmaster: {host: b}\n", "master.host", 3, "not one of the hosts"),
    ("defaults:\n  port: 70000\nhosts: [{name: a}]\n", "defaults.port", 2, "65535"),
    ("defaults:\n  host_key_policy: never\nhosts: [{name: a}]\n", "defaults.host_key_policy", 2, "strict"),
    ("hosts:\n  - name: a\n    env: {A: true}\n", "hosts[0].env", 3, "quote it"),
    ("hosts:\n  - name: a b\n", "hosts[0].name", 2, "letters"),
    ("hosts:\n  - address: x\n", "hosts[0].name", 2, "required"),
    ("name: x\n", "hosts", 1, "required"),
])
def test_invalid_inventories_name_file_field_and_line(text, field, line, words):
    e = error_of(text)
    assert e.path == "inv.yaml" and e.field == field and e.line == line
    assert words in str(e)
    assert e.exit_code == 2


def test_yaml_syntax_error_names_the_line():
    e = error_of("hosts:\n  - name: a\n    gpus: [1,\n")
    assert e.field is None and e.line is not None and "not valid YAML" in str(e)


def test_not_a_mapping():
    assert "YAML mapping" in str(error_of("- a\n- b\n"))


def test_missing_file(tmp_path):
    with pytest.raises(InventoryError) as e:
        inventory.load(tmp_path / "nope.yaml")
    assert "no such file" in str(e.value)


def test_select_keeps_order_and_moves_master(tmp_path):
    inv = parse(GOOD)
    sub = inv.select(["gpu-02"])
    assert [h.name for h in sub.hosts] == ["gpu-02"] and sub.master.addr == "10.0.0.12"
    with pytest.raises(InventoryError, match="not in the inventory"):
        inv.select(["gpu-09"])


def test_example_inventory_is_valid():
    inv = inventory.load("inventory/lab.yaml")
    assert [h.name for h in inv.hosts] == ["gpu-01", "gpu-02"]
