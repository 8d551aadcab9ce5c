"""`slurm:` inventories: the cluster block read strictly, every error located (file:line: field)."""

from __future__ import annotations

import pytest

from clusterddp import inventory
from clusterddp.backends.slurm.section import settings_of
from clusterddp.errors import InventoryError
from helpers import cddp, parse_inventory

GOOD = """
name: cluster
collect: ["checkpoints/**"]
slurm:
  login: local
  partition: main
  nodes: "2:4"
  gpus_per_node: 2
  request_gpus: false
  time: "02:00:00"
  account: proj-1
  qos: null
  constraint: "a100&ib"
  sbatch: ["--mem=16G", "--exclusive"]
  shared_dir: /shared/clusterddp
  python: /opt/venv/bin/python
  setup: ["module load cuda"]
  env: {NCCL_DEBUG: WARN, N: 3}
"""


def error_of(text: str) -> InventoryError:
    with pytest.raises(InventoryError) as e:
        parse_inventory(text, "c.yaml")
    return e.value


def test_a_slurm_inventory_reads_into_settings_and_lists_no_hosts():
    inv = parse_inventory(GOOD, "c.yaml")
    s = settings_of(inv)
    assert inv.backend == "slurm" and inv.hosts == () and inv.name == "cluster" and inv.collect == ("checkpoints/**",)
    assert s is not None
    assert (s.login, s.partition, s.nodes, s.gpus_per_node, s.request_gpus) == ("local", "main", (2, 4), 2, False)
    assert (s.time, s.account, s.qos, s.constraint) == ("02:00:00", "proj-1", None, "a100&ib")
    assert s.sbatch == ("--mem=16G", "--exclusive") and s.shared_dir == "/shared/clusterddp"
    assert s.setup == ("module load cuda",) and s.env == (("NCCL_DEBUG", "WARN"), ("N", "3"))
    plain = settings_of(parse_inventory("slurm: {}\n", "c.yaml"))
    assert plain is not None and (plain.nodes, plain.gpus_per_node, plain.request_gpus, plain.shared_dir,
                                  plain.python) == ((1, 1), 1, True, "~/clusterddp", "python3")


@pytest.mark.parametrize("text, where, words", [
    ("slurm:\n  nodes: 0\n", "c.yaml:2: slurm.nodes", ">= 1"),
    ("slurm:\n  nodes: \"4:2\"\n", "c.yaml:2: slurm.nodes", "MIN <= MAX"),
    ("slurm:\n  nodes: true\n", "c.yaml:2: slurm.nodes", "range"),
    ("slurm:\n  gpus_per_node: 0\n", "c.yaml:2: slurm.gpus_per_node", "greater than or equal to 1"),
    ("slurm:\n  time: 2h\n", "c.yaml:2: slurm.time", "Slurm time limit"),
    ("slurm:\n  partition: \"main; rm -rf /\"\n", "c.yaml:2: slurm.partition", "Slurm name"),
    ("slurm:\n  sbatch:\n    - --mem=1G\n    - mem\n", "c.yaml:4: slurm.sbatch[1]", "not an sbatch option"),
    ("slurm:\n  sbatch: [\"--nodes=3\"]\n", "c.yaml:2: slurm.sbatch[0]", "sets it itself"),
    ("slurm:\n  sbatch: [\"--mem=1G\\n#SBATCH --nodes=9\"]\n", "c.yaml:2: slurm.sbatch[0]", "control character"),
    ("slurm:\n  login: login1\n", "c.yaml:2: slurm.login", "must be `local`"),
    ("slurm:\n  login: [a]\n", "c.yaml:2: slurm.login", "or a host entry"),
    ("slurm:\n  login:\n    name: l1\n    addres: x\n", "c.yaml:4: slurm.login.addres", "unknown key"),
    ("slurm:\n  login:\n    name: l1\n    port: \"22\"\n", "c.yaml:4: slurm.login.port", "valid integer"),
    ("slurm:\n  login:\n    name: l1\n    port: 70000\n", "c.yaml:4: slurm.login.port", "65535"),
    ("slurm:\n  login:\n    name: l1\n    host_key_policy: yes\n", "c.yaml:4: slurm.login.host_key_policy",
     "strict"),
    ("slurm:\n  login:\n    name: l1\n    gpus: 2\n", "c.yaml:4: slurm.login.gpus", "not used for the login host"),
    ("slurm:\n  login:\n    name: l1\n    setup: echo\n", "c.yaml:4: slurm.login.setup", "valid list"),
    ("slurm:\n  login:\n    address: 10.0.0.5\n", "c.yaml:2: slurm.login.name", "required"),
    ("slurm:\n  login:\n    name: \"a b\"\n", "c.yaml:3: slurm.login.name", "letters, digits"),
    ("slurm:\n  login:\n    name: l1\n    env: {A: [1]}\n", "c.yaml:4: slurm.login.env", "a list"),
    ("slurm:\n  env: {RANK: 1}\n", "c.yaml:2: slurm.env.RANK", "reserved"),
    ("slurm:\n  env: {A: [1]}\n", "c.yaml:2: slurm.env", "a list"),
    ("slurm:\n  gpus: 2\n", "c.yaml:2: slurm.gpus", "unknown key"),
    ("slurm: {}\nhosts:\n  - name: a\n", "c.yaml:2: hosts", "Slurm allocates the hosts"),
    ("name: c\nslurm: {}\ndefaults: {gpus: 2}\n", "c.yaml:3: defaults", "not part of a `slurm:` inventory"),
    ("slurm: []\n", "c.yaml:1: slurm", "a mapping (`key: value` lines)"),
])
def test_each_bad_slurm_field_is_refused_at_its_line(text, where, words):
    e = error_of(text)
    assert str(e).startswith(where + ":"), str(e)
    assert words in str(e)


def test_a_login_host_entry_reads_like_a_hosts_entry():
    inv = parse_inventory("slurm:\n  login:\n    name: login1\n    address: 10.0.0.5\n    user: me\n    port: 2222\n"
                          "    identity_file: ~/.ssh/id_x\n    known_hosts: /k\n    host_key_policy: accept-new\n"
                          "    python: /opt/py\n    setup: [module load slurm]\n    env: {SLURM_CONF: /etc/s.conf}\n"
                          "    connect_timeout: 3\n    keepalive: 0\n", "c.yaml")
    login = settings_of(inv).login
    assert isinstance(login, inventory.Host)
    assert (login.name, login.address, login.user, login.port, login.identity_file, login.known_hosts,
            login.host_key_policy, login.python, login.setup, login.env, login.connect_timeout, login.keepalive,
            login.transport) == ("login1", "10.0.0.5", "me", 2222, "~/.ssh/id_x", "/k", "accept-new", "/opt/py",
                                 ("module load slurm",), (("SLURM_CONF", "/etc/s.conf"),), 3.0, 0.0, "ssh")
    plain = settings_of(parse_inventory("slurm:\n  login: {name: login1}\n", "c.yaml"))
    assert plain is not None and isinstance(plain.login, inventory.Host)
    assert (plain.login.address, plain.login.known_hosts, plain.login.host_key_policy) == (
        "login1", "~/.ssh/known_hosts", "strict")


def test_up_with_a_bad_slurm_inventory_exits_2_before_contacting_slurm(tmp_path):
    (tmp_path / "t.py").write_text("")
    inv = tmp_path / "c.yaml"
    inv.write_text("slurm:\n  partition: main\n  nodes: 0\n")
    r = cddp("up", str(inv), str(tmp_path / "t.py"), "--runs-dir", str(tmp_path / "runs"), check_rc=2)
    assert f"{inv}:3: slurm.nodes: must be >= 1" in r.stderr and "Traceback" not in r.stderr
    inv.write_text("slurm:\n  partition: main\n")
    r = cddp("up", str(inv), str(tmp_path / "t.py"), "--hosts", "a", "--runs-dir", str(tmp_path / "runs"), check_rc=2)
    assert "--hosts does not apply to a `slurm:` inventory" in r.stderr
    for verb in (("up",), ("schedule", "add", "n", "--cron", "@daily")):
        r = cddp(*verb, str(inv), str(tmp_path / "t.py"), "--exclude", "a", "--runs-dir", str(tmp_path / "runs"),
                 check_rc=2)
        assert "--exclude: a `slurm:` inventory lists no hosts" in r.stderr, r.stderr
    inv.write_text("slurm:\n  partition: main\n  login:\n    name: l1\n    prot: 22\n")
    r = cddp("up", str(inv), str(tmp_path / "t.py"), "--runs-dir", str(tmp_path / "runs"), check_rc=2)
    assert f"{inv}:5: slurm.login.prot: unknown key" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").glob("2*"))
