"""Inventory parsing and validation: every rule by name, every error located."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from clusterddp import inventory
from clusterddp.errors import InventoryError
from helpers import REPO

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
    # a copied example must not pin the master port (the default is a free one, chosen per run), and
    # what its comment says of the default is what the loader does (it once said "default: 29500")
    assert not inv.master.port_fixed
    block = (REPO / "inventory" / "lab.yaml").read_text().split("\nmaster:", 1)[1].split("\n\n", 1)[0]
    port = [line for line in block.splitlines() if "port:" in line]
    assert len(port) == 1 and "default: the master's first free port from 29500 up" in port[0], block


# ---- hostile or careless YAML: the strict reader (clusterddp/_inventory_yaml.py) ----

# The classic "billion laughs": 459 bytes that PyYAML's safe_load expands to 387 million strings
# (8 s, 1.2 GB and a 226 MB error message before the strict reader).
BOMB = "\n".join([
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
    *(f"{c}: &{c} [{','.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi", strict=True)),
    "hosts: [{name: x, env: {A: *i}}]", ""])


@pytest.fixture(params=["libyaml", "pyyaml"])
def yaml_parser(request, monkeypatch):
    """Both parsers the strict reader can run on: libyaml's where installed, PyYAML's own where not."""
    from clusterddp.inventory import _inventory_yaml
    if request.param == "libyaml" and not _inventory_yaml.LIBYAML:
        pytest.skip("PyYAML was built without libyaml here")
    monkeypatch.setattr(_inventory_yaml, "LIBYAML", request.param == "libyaml")
    return request.param


def test_alias_bomb_is_refused_at_once_in_little_memory(tmp_path):
    import resource
    import subprocess
    import sys
    import time
    import tracemalloc

    assert len(BOMB) < 500
    (tmp_path / "bomb.yaml").write_text(BOMB)

    def small_address_space():  # the bomb needs 1.2 GB: a MemoryError here means it was expanded
        resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20))
    r = subprocess.run([sys.executable, "-m", "clusterddp", "check", "bomb.yaml"], cwd=tmp_path, text=True,
                       capture_output=True, timeout=60, preexec_fn=small_address_space)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.startswith("error: bomb.yaml:") and "more than 50,000 values" in r.stderr
    assert len(r.stderr) < 500
    tracemalloc.start()
    started = time.perf_counter()
    e = error_of(BOMB)
    took, peak = time.perf_counter() - started, tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert took < 0.5 and peak < 20 << 20, (took, peak)  # measured: ~0.01 s, ~1 MB
    assert e.line is not None and e.field is not None


@pytest.mark.parametrize("text, field, words", [
    ("hosts: " + "[" * 5000 + "]" * 5000 + "\n", "", "nested more than 20 levels"),  # libyaml: no field
    ("hosts:\n" + "".join("  " * i + f"- k{i}:\n" for i in range(40)), "hosts", "nested more than 20 levels"),
    ("hosts: [{name: a, gpus: " + "9" * 5000 + "}]\n", "hosts[0].gpus", "5,000 characters"),
    ("hosts: [{name: a, connect_timeout: 1" + "0" * 400 + ".5}]\n", "hosts[0].connect_timeout", "characters"),
    ("x: &x [*x]\nhosts: [{name: a}]\n", "x[0]", "inside its own anchor"),
    ("a: &a [1]\nhosts: [" + ", ".join(["*a"] * 101) + "]\n", "hosts[100]", "more than 100 aliases"),
    ("hosts: !!python/object:os.system [{name: a}]\n", "hosts", "!!python/object"),
    ("hosts: [{name: a, setup: !!binary aGk=}]\n", "hosts[0].setup", "!!binary"),
    ("hosts: [{name: a, 22: port}]\n", "hosts[0]", "keys must be text"),
    ("hosts: [{name: a, on: yes}]\n", None, None),  # `on` is text in YAML 1.2: an unknown key
    ('hosts: [{name: "a\\0b"}]\n', "hosts[0].name", "NUL"),
])
def test_hostile_yaml_gives_a_located_error_on_either_parser(yaml_parser, text, field, words):
    e = error_of(text)
    assert e.line is not None and e.exit_code == 2, str(e)
    if field is None:
        assert e.field == "hosts[0].on" and "unknown key" in str(e)
        return
    assert (e.field or "").startswith(field) and words in str(e), str(e)
    assert len(str(e)) < 500


def test_duplicate_keys_are_refused_naming_both_lines(yaml_parser):
    e = error_of("hosts:\n  - name: a\ndefaults: {}\nhosts:\n  - name: b\n")
    assert (e.field, e.line) == ("hosts", 4) and "first at line 1" in str(e)
    e = error_of("hosts:\n  - name: a\n    env:\n      A: x\n      B: y\n      A: z\n")
    assert (e.field, e.line) == ("hosts[0].env.A", 6) and "first at line 4" in str(e)
    e = error_of("hosts:\n  - {name: a, gpus: 2, gpus: 4}\n")
    assert e.field == "hosts[0].gpus" and "duplicate key" in str(e)


def test_scalars_follow_yaml_1_2_not_1_1(yaml_parser):
    e = error_of("hosts:\n  - name: a\n    port: 1:22\n")  # YAML 1.1: sexagesimal 82
    assert (e.field, e.line) == ("hosts[0].port", 3) and "valid integer" in str(e)
    e = error_of("hosts:\n  - name: a\n    port: 0777\n")  # YAML 1.1: octal 511
    assert e.field == "hosts[0].port" and "leading zero" in str(e) and "0o777" in str(e)
    e = error_of("hosts:\n  - name: a\n    gpus: yes\n")  # YAML 1.1: true
    assert e.field == "hosts[0].gpus" and "whole number" in str(e)
    inv = parse("hosts:\n  - name: no\n    port: 0o26\n    gpus: 0x10\n"
                "    env: {A: yes, B: off, C: 2001-12-14, D: 1:22, E: ~x, F: 0b11, G: 1_000}\n"
                "defaults: {keepalive: 1e1, host_key_policy: !!str strict}\n")
    h = inv.hosts[0]
    assert (h.name, h.port, h.gpus, h.keepalive) == ("no", 22, 16, 10.0)
    assert dict(h.env) == {"A": "yes", "B": "off", "C": "2001-12-14", "D": "1:22", "E": "~x", "F": "0b11",
                           "G": "1_000"}
    for bad in ("connect_timeout: .inf", "keepalive: .nan", "connect_timeout: 1e999", "keepalive: 100000"):
        e = error_of(f"hosts: [{{name: a, {bad}}}]\n")
        assert e.field == "hosts[0]." + bad.split(":")[0], str(e)


def test_aliases_within_bounds_still_work(yaml_parser):
    inv = parse("defaults:\n  env: &common {NCCL_DEBUG: INFO}\n  setup: &venv [source ~/v/bin/activate]\n"
                "hosts:\n  - {name: a, env: *common}\n  - {name: b, setup: *venv}\n")
    assert dict(inv.hosts[0].env) == {"NCCL_DEBUG": "INFO"} and inv.hosts[1].setup == ("source ~/v/bin/activate",)
    e = error_of("d: &d {user: u}\nhosts:\n  - name: a\n    <<: *d\n")
    assert "unknown key" in str(e) and "merge keys" in str(e)  # YAML 1.1 merge keys are gone


def test_size_limit_bytes_and_control_characters_are_located(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("hosts: [{name: a}]\n" + "# padding\n" * 120_000)  # 1.2 MB: valid YAML, but too big
    with pytest.raises(InventoryError, match=r"larger than 1,048,576 bytes") as e:
        inventory.load(big)
    assert e.value.exit_code == 2
    with pytest.raises(InventoryError, match=r"at most 1,048,576"):
        parse("hosts: [{name: a}]\n" + "#" * (1 << 20))
    raw = tmp_path / "latin1.yaml"
    raw.write_bytes(b"hosts:\n  - name: a\n    user: j\xf6rg\n")
    with pytest.raises(InventoryError) as e:
        inventory.load(raw)
    assert (e.value.line, str(e.value).split(":")[0]) == (3, str(raw)) and "not UTF-8" in str(e.value)
    e = error_of("hosts:\n  - name: a\n    user: a\x1bb\n")
    assert e.line == 3 and "control character U+001B" in str(e)


@pytest.mark.parametrize("text, field", [
    ('hosts: [{name: "local\\n"}]', "hosts[0].name"),
    ('hosts: [{name: "gpu-01\\n"}]', "hosts[0].name"),
    ("hosts: [{name: " + "a" * 129 + "}]", "hosts[0].name"),
    ('hosts: [{name: a, env: {"A\\n": x}}]', "hosts[0].env"),
    ('hosts: [{name: a, address: "10.0.0.1\\nx"}]', "hosts[0].address"),
    ('hosts: [{name: a}]\ncollect: ["ok/*", "\\e]0;pwned\\a"]', "collect[1]"),
    ('hosts: [{name: a, user: "\\x85u"}]', "hosts[0].user"),
])
def test_names_and_one_line_fields_match_whole_and_hold_no_control_characters(text, field):
    e = error_of(text + "\n")
    assert e.field == field and e.line == 1 + text.count("\n"), str(e)


@pytest.mark.parametrize("where, key, words", [
    ("defaults", "CLUSTERDDP_JOB", "CLUSTERDDP_JOB is how stop and teardown find"),
    ("host", "CLUSTERDDP_RUN_ID", "clusterddp sets CLUSTERDDP_*"),
    ("host", "MASTER_PORT", "--master-port"),
    ("defaults", "RANK", "torchrun sets it for every worker"),
    ("host", "CTL", "exit code"),
    ("defaults", "PET_RDZV_BACKEND", "rendezvous"),
])
def test_reserved_env_names_are_refused_where_they_are_set(where, key, words):
    text = (f"defaults:\n  env:\n    {key}: x\nhosts:\n  - name: a\n" if where == "defaults"
            else f"hosts:\n  - name: a\n  - name: b\n    env:\n      OK: 1\n      {key}: x\n")
    e = error_of(text)
    field = f"defaults.env.{key}" if where == "defaults" else f"hosts[1].env.{key}"
    assert (e.field, e.line) == (field, 3 if where == "defaults" else 6), str(e)
    assert "reserved" in str(e) and words in str(e)


def test_torchrun_settings_that_are_not_clusterddps_stay_allowed():
    env = dict(parse("hosts: [{name: a, env: {NCCL_SOCKET_IFNAME: eth1, OMP_NUM_THREADS: 4, CUDA_VISIBLE_DEVICES: "
                     "'0,1', TORCHELASTIC_ERROR_FILE: /tmp/e, PET_LOG_DIR: /tmp/l, CLUSTERDDP_QUICK_EXIT: 0}}]"
                     ).hosts[0].env)
    assert set(env) == {"NCCL_SOCKET_IFNAME", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "TORCHELASTIC_ERROR_FILE",
                        "PET_LOG_DIR", "CLUSTERDDP_QUICK_EXIT"}  # the job's quick exit turned off (stackhook)


def test_messages_quote_user_text_short_and_escaped():
    long = "x" * 100_000
    e = error_of(f"hosts: [{{name: a}}]\nmaster: {{host: \"{long}\\e[2J\"}}\n")
    assert e.field == "master.host" and len(str(e)) < 300 and "\x1b" not in str(e)
    e = error_of(f"hosts: [{{name: a, env: {{\"{long}\": 1}}}}]\n")
    assert len(str(e)) < 300
    e = error_of(f"hosts:\n  - name: a\n    ? {long}\n    : 1\n")
    assert len(str(e)) < 300 and "unknown key" in str(e) and e.line == 3


# ---- flags: -e and --hosts (clusterddp/cli/common.py) ----

@pytest.mark.parametrize("flag, words", [
    ("A\n=1", "expected NAME=VALUE"),
    ("\nA=1", "expected NAME=VALUE"),
    ("CLUSTERDDP_JOB=other/run", "CLUSTERDDP_JOB is how stop and teardown find"),
    ("WORLD_SIZE=4", "torchrun sets it"),
    ("NPROC=3", "launch.sh uses it"),
    ("A=\udcff", "not UTF-8"),  # an undecodable byte on the command line
])
def test_env_flag_names_match_whole_and_reserved_names_are_refused(flag, words):
    from clusterddp.cli.common import parse_env
    from clusterddp.errors import UsageError
    with pytest.raises(UsageError) as e:
        parse_env(["OK=1", flag])
    assert words in str(e.value) and e.value.exit_code == 2
    assert parse_env(["A=x=y", "B=", "C=$NPROC \n"]) == (("A", "x=y"), ("B", ""), ("C", "$NPROC \n"))


def test_hosts_flag_keeps_inventory_order_and_refuses_unknown_names_shortly():
    from clusterddp.cli.common import host_list
    inv = parse(GOOD)
    assert [h.name for h in inv.select(host_list(" gpu-02 , gpu-01,")).hosts] == ["gpu-01", "gpu-02"]
    big = parse("hosts: [" + ", ".join(f"{{name: h{i}}}" for i in range(500)) + "]")
    with pytest.raises(InventoryError, match="not in the inventory") as e:
        big.select(host_list("h1,nope\x1b[2J," + "x" * 100_000 + "," + ",".join(f"n{i}" for i in range(50))))
    assert len(str(e.value)) < 600 and "\x1b" not in str(e.value) and "(and 44 more)" in str(e.value)


def test_a_fixed_choice_of_gpus_the_lease_folder_and_whether_the_master_port_was_given():
    inv = parse("defaults: {lease_dir: /var/lib/cddp-leases}\nhosts:\n  - {name: a, gpus: [3, 1]}\n  - {name: b}\n")
    a, b = inv.hosts
    assert (a.gpus, a.slots, b.gpus, b.slots) == (2, (1, 3), "auto", None)
    assert a.lease_dir == b.lease_dir == "/var/lib/cddp-leases"
    assert (inv.master.port, inv.master.port_fixed) == (29500, False)  # not written: up chooses a free one from it
    assert parse(GOOD).master.port_fixed and parse(GOOD).master.port == 29600
    assert inv.select(["b"]).master.port_fixed is False


@pytest.mark.parametrize("gpus, words", [("[]", "GPU indices"), ("[0, 0]", "lists a GPU twice"),
                                         ("[0, true]", "GPU indices"), ("[1024]", "GPU indices")])
def test_a_bad_fixed_choice_of_gpus_is_located(gpus, words):
    e = error_of(f"hosts:\n  - name: a\n    gpus: {gpus}\n")
    assert e.field == "hosts[0].gpus" and e.line == 3 and words in str(e)


def test_every_command_reads_its_inventory_through_one_loader(tmp_path):
    """load_named: `local` or a file, narrowed by --hosts/--exclude (--fanout over the inventory's through
    backends.base.load_inventory: runspec.fanout_of); the CLI's commands (up, schedule add, check, exec,
    leases, top) all call it."""
    p = tmp_path / "inv.yaml"
    p.write_text("fanout: 4\nhosts: [{name: a}, {name: b}, {name: c}]\n")
    inv = inventory.load_named(str(p), hosts=["a", "b", "c"], exclude=["b"])
    assert [h.name for h in inv.hosts] == ["a", "c"] and inv.fanout == 4
    local = inventory.load_named("local", gpus=2)
    assert local.hosts[0].transport == "local" and local.hosts[0].gpus == 2
    import inspect

    from clusterddp.backends import base
    from clusterddp.cli import check, common, exec_, leases, top
    assert base.load_inventory("local", 3).hosts[0].gpus == 3
    assert base.load_inventory(str(p), fanout=2).fanout == 2 and base.load_inventory(str(p)).fanout == 4
    assert check.load_inventory is exec_.load_inventory is leases.load_inventory is common.load_inventory
    assert "from .common import load_inventory" in inspect.getsource(top)


# ---- a misspelt key: named, with the key it is close to (issue 39 §6) ----

@pytest.mark.parametrize(("text", "line", "field", "meant"), [
    ("host:\n  - {name: a, address: 10.0.0.1}\n", 1, "host", "hosts"),
    ("hosts:\n  - {name: a, adress: 10.0.0.1}\n", 2, "hosts[0].adress", "address"),
    ("defaults: {usr: me}\nhosts: [{name: a, address: 10.0.0.1}]\n", 1, "defaults.usr", "user"),
    ("hosts: [{name: a, address: 10.0.0.1}]\nspare:\n  - {name: s, address: 10.0.0.2}\n", 2, "spare", "spares"),
    ("hosts: [{name: a, address: 10.0.0.1}]\nStall_Timeout: 30\n", 2, "Stall_Timeout", "stall_timeout"),
])
def test_a_misspelt_key_is_named_first_with_the_key_it_is_close_to(text, line, field, meant):
    with pytest.raises(InventoryError) as e:
        inventory.parse(text, "lab.yaml")
    said = str(e.value).splitlines()[0]
    assert said == f"lab.yaml:{line}: {field}: unknown key; did you mean `{meant}`?", said
    assert "required, but missing" not in said
    if field == "host":  # one slip, one problem: not also "hosts: required, but missing" after it
        assert "more problem" not in str(e.value), str(e.value)


def test_a_key_close_to_nothing_keeps_the_readme_hint_and_a_given_key_is_never_suggested():
    with pytest.raises(InventoryError) as e:
        inventory.parse("hosts: [{name: a, address: 10.0.0.1}]\ncolour: red\n", "lab.yaml")
    assert "colour: unknown key; check its spelling against docs/inventory.md, \"Every field\"" in str(e.value)
    # `hosts:` is there: `host:` beside it is not "did you mean hosts" (it is given already)
    with pytest.raises(InventoryError) as e:
        inventory.parse("hosts: [{name: a, address: 10.0.0.1}]\nhost: x\n", "lab.yaml")
    assert "did you mean" not in str(e.value)


_TOP_KEYS = ("hosts", "defaults", "spares", "master", "fanout", "stall_timeout", "keep_runs", "notify")


@settings(max_examples=150, deadline=None)
@given(key=st.sampled_from(_TOP_KEYS), at=st.integers(0, 20), how=st.sampled_from(("drop", "double", "swap")))
def test_any_one_slip_in_a_top_level_key_is_refused_naming_that_key(key, at, how):
    """A key one slip away from a real one (a letter dropped, doubled or two swapped): refused at its
    line, the slip named as given, and any suggestion a real key."""
    from clusterddp.inventory._inventory_schema import INVENTORY
    i = at % len(key)
    slip = {"drop": key[:i] + key[i + 1:], "double": key[:i] + key[i] + key[i:],
            "swap": key[:i] + key[i + 1:i + 2] + key[i:i + 1] + key[i + 2:]}[how]
    assume(slip not in INVENTORY.fields and slip)
    text = "hosts: [{name: a, address: 10.0.0.1}]\n" if key != "hosts" else ""
    text += f"{slip}: 1\n"
    with pytest.raises(InventoryError) as e:
        inventory.parse(text, "lab.yaml")
    said = str(e.value).splitlines()[0]
    assert said.startswith(f"lab.yaml:{1 if key == 'hosts' else 2}: {slip}: unknown key"), said
    if "did you mean" in said:
        meant = said.rsplit("`", 2)[1]
        assert meant in INVENTORY.fields


@pytest.mark.parametrize("where", ["defaults: {workdir: /scratch/%h/ddp}\nhosts: [{name: a, address: 10.0.0.1}]\n",
                                   "hosts: [{name: a, address: 10.0.0.1, workdir: '~/%h'}]\n"])
def test_percent_h_in_workdir_is_refused_not_taken_as_a_folder_named_percent_h(where):
    """%h is the node's hostname only in lease_dir (filled in on the node); the launcher names paths
    under workdir as given, so a workdir with %h would be a literal folder `%h`: refused, located."""
    e = error_of(where)
    assert e.field in ("defaults.workdir", "hosts[0].workdir") and e.line == 1 and e.exit_code == 2
    assert "%h is filled in only in lease_dir" in str(e)
    # in lease_dir it stays what it was
    inv = inventory.parse("defaults: {lease_dir: /var/lib/l/%h}\nhosts: [{name: a, address: 10.0.0.1}]\n", "l.yaml")
    assert inv.hosts[0].lease_dir == "/var/lib/l/%h"
