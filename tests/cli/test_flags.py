"""`up`'s options become the run spec and the launch request in one place each: cli.flags.run_spec
fills every RunSpec field named as a launch option, by name; cli.up.request resolves the spec once."""

from __future__ import annotations

import dataclasses

import pytest
import typer

from clusterddp import launch
from clusterddp.cli import flags, up
from clusterddp.cli.app import app
from clusterddp.errors import UsageError
from clusterddp.runspec import ResolvedSpec, RunSpec

GIVEN = {"name": "n", "gpus": 2, "master_port": 29601, "env": ["A=1"], "collect": ["ckpt/*"],
         "checkpoints": ["out/*.pt"], "max_restarts": 3, "local_rank_arg": "local_rank", "stall_timeout": 30.0,
         "progress_regex": r"step (\d+)", "metrics_interval": 2.0, "metrics_regex": r"loss (?P<loss>\S+)"}
EXPECTED = {"name": "n", "gpus": 2, "master_port": 29601, "env": (("A", "1"),), "collect": ("ckpt/*",),
            "checkpoints": ("out/*.pt",), "max_restarts": 3, "local_rank_arg": "--local_rank",
            "stall_timeout": 30.0, "progress_regex": r"step (\d+)", "metrics_interval": 2.0,
            "metrics_regex": r"loss (?P<loss>\S+)"}


def test_every_runspec_field_named_as_a_launch_option_is_filled_from_it():
    named = {f.name for f in dataclasses.fields(RunSpec)} & set(launch.BY_NAME)
    assert named == set(GIVEN)  # a new RunSpec field of a launch option's name: add it here
    defaults = {o.name: o.default for o in launch.OPTIONS}
    spec = flags.run_spec("t.py", ["--x"], {**defaults, **GIVEN})
    assert {k: getattr(spec, k) for k in EXPECTED} == EXPECTED
    assert (spec.script, spec.script_args) == ("t.py", ("--x",)) and not isinstance(spec, ResolvedSpec)


@pytest.mark.parametrize("name, value, words", [
    ("collect", ["/abs"], "--collect '/abs'"), ("checkpoints", ["../x"], "--checkpoints '../x'"),
    ("local_rank_arg", "--rank", "--local-rank-arg '--rank'"),
])
def test_a_bad_flag_is_refused_naming_it(name, value, words):
    with pytest.raises(UsageError, match=words):
        flags.run_spec("t.py", None, {name: value})


def test_up_takes_every_launch_option_from_its_one_declaration():
    cmd = typer.main.get_command(app).commands["up"]
    params = {p.name for p in cmd.params}
    assert set(launch.BY_NAME) <= params
    assert params - set(launch.BY_NAME) == {"inventory", "script", "script_args", "runs_dir", "schedule"}


def test_the_request_carries_the_spec_resolved_against_the_inventory(tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts: [{name: a, address: 10.0.0.1}]\nmaster: {port: 29777}\nstall_timeout: 600\n"
                   "collect: [logs/*]\n")
    o = {opt.name: opt.default for opt in launch.OPTIONS}
    req = up.request(str(inv), "t.py", None, "./runs", {**o, "collect": ["out/*"], "hosts": "a:0,1"})
    s = req.spec
    assert isinstance(s, ResolvedSpec) and (s.master_port, s.port_fixed, s.stall_timeout) == (29777, True, 600.0)
    assert s.collect == ("logs/*", "out/*") and (req.hosts, req.slots) == (["a"], {"a": (0, 1)})
