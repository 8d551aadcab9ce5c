"""Each launch option is declared once (clusterddp.launch) and round-trips through a schedule's spec:
what `schedule add` is given is what the `up` that `schedule fire` starts is given."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from clusterddp import launch
from clusterddp import schedule as schedules
from clusterddp.cli.app import app
from clusterddp.errors import SpecError
from clusterddp.schedule import crontab as crontab_mod

COMMANDS = typer.main.get_command(app)
UP = COMMANDS.commands["up"]
ADD = COMMANDS.commands["schedule"].commands["add"]
# `up`'s parameters that are not launch options: what to run, where runs go, and the mark fire sets itself
NOT_OPTIONS = {"inventory", "script", "script_args", "runs_dir", "schedule"}
# A value other than the default, for each option, as typed
SAMPLES = {"name": "nightly eval", "hosts": "a,b", "exclude": "b", "gpus": "2", "master_port": "29601",
           "env": "A=1", "collect": "ckpt/*", "max_restarts": "2", "local_rank_arg": "--local_rank",
           "wait": None, "max_upload": "500M", "skip_check": None, "raw": None, "quiet": None, "join_timeout": "7.5",
           "stall_timeout": "30", "progress_regex": "step (\\d+)", "notify": "command:true",
           "nodes": "1:2", "resume": "previous", "checkpoints": "out/*.pt", "metrics_interval": "2",
           "metrics_regex": "loss (?P<loss>\\S+)", "report": "run.html",
           "packages": "requirements.txt"}


def _params(cmd) -> dict:
    return {p.name: p for p in cmd.params}


def test_every_up_option_is_declared_once_with_its_flags():
    up = _params(UP)
    assert set(up) - NOT_OPTIONS == set(launch.BY_NAME)
    for o in launch.OPTIONS:
        assert set(up[o.name].opts + up[o.name].secondary_opts) == set(o.flags), o.name
    add = {tuple(p.opts): p for p in ADD.params}
    for o in launch.OPTIONS:
        if o.recorded is not None:  # what a schedule records, `schedule add` takes, declared as `up` declares it
            theirs = add[tuple(up[o.name].opts)]
            assert theirs.help == up[o.name].help and theirs.default == up[o.name].default, o.name
    assert set(SAMPLES) == {o.name for o in launch.OPTIONS if o.recorded is not None}


@pytest.fixture
def added(tmp_path, monkeypatch):
    """`schedule add` with some options; returns the spec it wrote (the crontab is a dict here)."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("CLUSTERDDP_QUIET", raising=False)
    monkeypatch.delenv("CLUSTERDDP_MAX_UPLOAD", raising=False)
    crontab = {"text": ""}
    monkeypatch.setattr(crontab_mod, "read_crontab", lambda: crontab["text"])
    monkeypatch.setattr(crontab_mod, "write_crontab", lambda text: crontab.update(text=text))
    (tmp_path / "t.py").write_text("print('hi')\n")
    (tmp_path / "inv.yaml").write_text("hosts: [{name: a, address: 10.0.0.1}, {name: b, address: 10.0.0.2}]\n")
    monkeypatch.chdir(tmp_path)

    def add(*words: str) -> schedules.ScheduleSpec:
        r = CliRunner().invoke(app, ["schedule", "add", "n", "inv.yaml", "t.py", "--cron", "@daily",
                                     "--runs-dir", str(tmp_path / "runs"), *words, "--", "x"])
        assert r.exit_code == 0, r.output
        return schedules.load_spec(str(tmp_path / "runs" / "schedules" / "n.json"))
    return add


def _up_values(spec: schedules.ScheduleSpec) -> dict:
    """The options the `up` that the spec fires is given, parsed by `up` itself."""
    argv = schedules.up_argv(spec, env_file="/dev/fd/9" if spec.run.env else None)
    ctx = UP.make_context("up", argv[2:], resilient_parsing=True)
    return ctx.params


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_recorded_up_option_round_trips_through_the_spec(added, name):
    o = launch.BY_NAME[name]
    words = [o.flag] if SAMPLES[name] is None else [f"{o.flag}={SAMPLES[name]}"]
    spec = added(*words)
    assert schedules.spec_from_json(json.loads(json.dumps(spec.to_json())), spec.spec_path) == spec
    got = _up_values(spec)
    if name == "env":  # the values travel in a file, never on the command line
        assert list(got["env"]) == ["@/dev/fd/9"] and spec.run.env == (("A", "1"),)
    elif name == "exclude":  # recorded as the hosts left
        assert got["hosts"] == "a" and got["exclude"] is None
    else:  # what fire gives `up` is what `up` would have made of the words typed to `schedule add`
        assert got[name] == UP.make_context("up", ["i", "s", *words], resilient_parsing=True).params[name]
        assert got[name] != _params(UP)[name].default
    others = {k: v for k, v in got.items() if k not in NOT_OPTIONS | {name, "hosts"}}
    assert all(v == _params(UP)[k].default or (v in ([], (), None) and not _params(UP)[k].default)
               for k, v in others.items()), others  # nothing else set
    assert list(got["script_args"]) == ["x"]


def test_a_spec_without_up_options_reads_as_before_and_a_bad_one_is_refused(added):
    spec = added()
    assert "up" not in spec.to_json() and spec.up == ()
    data = {**spec.to_json(), "up": {"join_timeout": "soon"}}
    with pytest.raises(SpecError, match="up.join_timeout: expected a number"):
        schedules.spec_from_json(data, spec.spec_path)
    for bad in ({"dry_run": True}, {"gpus": 2}, []):
        with pytest.raises(SpecError, match="up"):
            schedules.spec_from_json({**spec.to_json(), "up": bad}, spec.spec_path)
