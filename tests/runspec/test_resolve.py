"""`runspec.resolve`: the one place a run's flags meet its inventory. Each precedence rule
(flag > host entry > inventory defaults > built-in) has a test of its own, named for it."""

from __future__ import annotations

import dataclasses

import pytest

from clusterddp import inventory
from clusterddp.errors import UsageError
from clusterddp.runspec import ResolvedSpec, RunSpec, fanout_of, fixed_slots, master_port_of, nproc, resolve

BARE = "hosts:\n  - {name: a, address: 10.0.0.1}\n  - {name: b, address: 10.0.0.2}\n"
FULL = """
defaults: {gpus: 2}
master: {port: 29777}
collect: [logs/*, out/*]
checkpoints: [inv/*.pt]
stall_timeout: 600
progress_regex: 'loss'
hosts:
  - {name: a, address: 10.0.0.1, gpus: 4}
  - {name: b, address: 10.0.0.2}
  - {name: c, address: 10.0.0.3, gpus: [0, 3]}
"""


def inv(text: str = FULL) -> inventory.Inventory:
    return inventory.parse(text, "inv.yaml")


def host(i: inventory.Inventory, name: str) -> inventory.Host:
    return next(h for h in i.hosts if h.name == name)


def spec(**flags) -> RunSpec:
    return RunSpec("train.py", **flags)


# ---- gpus: --gpus > the host's entry > the inventory's defaults > built-in auto ----

def test_gpus_flag_wins_over_host_entry():
    s = resolve(spec(gpus=1), inv())
    assert [nproc(s, h) for h in inv().hosts] == [1, 1, 1]


def test_gpus_host_entry_wins_over_inventory_defaults():
    s = resolve(spec(), inv())
    assert nproc(s, host(inv(), "a")) == 4


def test_gpus_inventory_defaults_win_over_builtin():
    s = resolve(spec(), inv())
    assert nproc(s, host(inv(), "b")) == 2


def test_gpus_builtin_is_auto():
    s = resolve(spec(), inv(BARE))
    assert [nproc(s, h) for h in inv(BARE).hosts] == ["auto", "auto"]


def test_gpus_flag_wins_over_a_hosts_fixed_slots():
    i = inv()
    assert fixed_slots(resolve(spec(), i), host(i, "c")) == (0, 3)
    assert fixed_slots(resolve(spec(gpus=2), i), host(i, "c")) is None
    assert fixed_slots(resolve(spec(), i), host(i, "a")) is None


# ---- master port: --master-port > the inventory's master.port > built-in 29500 (chosen free from it) ----

def test_master_port_flag_wins_over_inventory():
    s = resolve(spec(master_port=29600), inv())
    assert (s.master_port, s.port_fixed) == (29600, True)
    s = resolve(spec(master_port=29600), inv(BARE))
    assert (s.master_port, s.port_fixed) == (29600, True)


def test_master_port_inventory_wins_over_builtin():
    s = resolve(spec(), inv())
    assert (s.master_port, s.port_fixed) == (29777, True)


def test_master_port_builtin_is_29500_and_not_fixed():
    s = resolve(spec(), inv(BARE))
    assert (s.master_port, s.port_fixed) == (29500, False)


def test_check_and_collective_read_the_master_port_as_up_does():
    assert master_port_of(None, inv()) == (29777, True)
    assert master_port_of(29600, inv()) == (29600, True)
    assert master_port_of(None, inv(BARE)) == (29500, False)


# ---- collect: the inventory's globs, then the flag's, each once ----

def test_collect_flag_adds_to_inventory():
    s = resolve(spec(collect=("ckpt/*", "out/*")), inv())
    assert s.collect == ("logs/*", "out/*", "ckpt/*")
    assert resolve(spec(), inv(BARE)).collect == ()


# ---- checkpoints: --checkpoints > the inventory's checkpoints: > none (the mirror's own default) ----

def test_checkpoints_flag_wins_over_inventory():
    assert resolve(spec(checkpoints=("mine/*.pt",)), inv()).checkpoints == ("mine/*.pt",)


def test_checkpoints_inventory_wins_over_builtin():
    assert resolve(spec(), inv()).checkpoints == ("inv/*.pt",)
    assert resolve(spec(), inv(BARE)).checkpoints == ()


# ---- the stall watchdog: --stall-timeout/--progress-regex > the inventory's > off, any line ----

def test_stall_timeout_flag_wins_over_inventory():
    assert resolve(spec(stall_timeout=30.0), inv()).stall_timeout == 30.0


def test_stall_timeout_flag_zero_turns_the_inventorys_off():
    assert resolve(spec(stall_timeout=0.0), inv()).stall_timeout is None


def test_stall_timeout_inventory_wins_over_builtin_off():
    assert resolve(spec(), inv()).stall_timeout == 600.0
    assert resolve(spec(), inv(BARE)).stall_timeout is None


def test_stall_timeout_under_a_second_is_refused():
    with pytest.raises(UsageError, match=r"--stall-timeout 0.5: under a second"):
        resolve(spec(stall_timeout=0.5), inv(BARE))


def test_progress_regex_flag_wins_over_inventory():
    assert resolve(spec(progress_regex=r"it (\d+)"), inv()).progress_regex == r"it (\d+)"


def test_progress_regex_inventory_wins_over_builtin_any_line():
    assert resolve(spec(), inv()).progress_regex == "loss"
    assert resolve(spec(), inv(BARE)).progress_regex is None


def test_a_bad_progress_regex_flag_is_refused():
    with pytest.raises(UsageError, match="2 groups"):
        resolve(spec(progress_regex="(a)(b)"), inv())


# ---- restarts (new attempts of an attached SSH run): --max-restarts > restarts: > --nodes MAX-MIN > none ----

RESTARTS = "restarts: 1\n" + BARE


def test_restarts_flag_wins_over_inventory():
    s = resolve(spec(max_restarts=3), inv(RESTARTS), (1, 3))
    assert (s.restarts, s.restarts_by) == (3, "--max-restarts 3")


def test_restarts_inventory_wins_over_nodes_range():
    s = resolve(spec(), inv(RESTARTS), (1, 4))
    assert (s.restarts, s.restarts_by) == (1, "restarts: 1 (the inventory's)")
    s = resolve(spec(), inv("restarts: 0\n" + BARE), (1, 3))  # 0 is the inventory's word, not its absence
    assert (s.restarts, s.restarts_by) == (0, "restarts: 0 (the inventory's)")


def test_restarts_nodes_range_wins_over_builtin_none():
    s = resolve(spec(), inv(BARE), (1, 3))
    assert (s.restarts, s.restarts_by) == (2, "--nodes 1:3")


def test_restarts_builtin_is_none():
    assert resolve(spec(), inv(BARE)).restarts == 0
    assert resolve(spec(max_restarts=0), inv(BARE), None).restarts == 0


# ---- fanout (check, exec, leases; not up): --fanout > the inventory's fanout: > built-in 32 ----

def test_fanout_flag_wins_over_inventory():
    assert fanout_of(3, inv("fanout: 8\n" + BARE)) == 3


def test_fanout_inventory_wins_over_builtin():
    assert fanout_of(None, inv("fanout: 8\n" + BARE)) == 8


def test_fanout_builtin_is_32():
    assert fanout_of(None, inv(BARE)) == 32


# ---- once ----

def test_a_spec_is_resolved_once_into_a_type_of_its_own():
    s = resolve(spec(), inv(BARE))
    assert isinstance(s, ResolvedSpec) and not isinstance(spec(), ResolvedSpec)
    assert (s.master_port, s.port_fixed) == (29500, False)
    # again, its chosen port would pass for a flag's (fixed): refused, not re-run nor passed through
    with pytest.raises(TypeError, match="resolved once"):
        resolve(s, inv())
    # what only resolution knows is not a field of what the user asked
    asked = {f.name for f in dataclasses.fields(RunSpec)}
    assert {"port_fixed", "restarts", "restarts_by"} <= {f.name for f in dataclasses.fields(ResolvedSpec)} - asked
    assert "resolved" not in asked


def test_only_the_commands_that_read_the_inventory_resolve_a_runs_flags():
    """`up`'s request and `schedule add` resolve the flags as they read the inventory; nothing that plans
    from the spec (the SSH plan, the Slurm plan, a backend's prepare) resolves it again."""
    import ast
    from pathlib import Path
    root = Path(__file__).resolve().parents[2] / "clusterddp"
    callers = set()
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        named = any(isinstance(n, ast.ImportFrom) and (n.module or "").endswith("runspec")
                    and any(a.name == "resolve" for a in n.names) for n in ast.walk(tree))
        for n in ast.walk(tree):
            if isinstance(n, ast.Call) and (
                    (named and isinstance(n.func, ast.Name) and n.func.id == "resolve")
                    or (isinstance(n.func, ast.Attribute) and n.func.attr == "resolve"
                        and isinstance(n.func.value, ast.Name) and n.func.value.id == "runspec")):
                callers.add(path.relative_to(root).as_posix())
    assert callers == {"cli/up.py", "cli/schedule.py"}  # (and runspec.master_port_of, for check)


def test_the_flags_that_have_no_inventory_counterpart_pass_through():
    s = resolve(spec(name="n", env=(("A", "1"),), max_restarts=2, local_rank_arg="--local_rank",
                     script_args=("--x",)), inv())
    assert (s.name, s.env, s.max_restarts, s.local_rank_arg, s.script_args) == \
        ("n", (("A", "1"),), 2, "--local_rank", ("--x",))
