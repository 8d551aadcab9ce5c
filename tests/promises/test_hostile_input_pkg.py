"""Issue 23's hostile inputs for the inventory, schedule and store side: each a located refusal
(exit 2, naming the file, field or flag) or a fix, never a traceback. (FIFOs and devices as the
inventory, `-e @FILE` and known_hosts: tests/files/test_files.py.)"""

from __future__ import annotations

import json
import re
import shutil
import sys

import pytest
from typer.testing import CliRunner

from clusterddp import inventory
from clusterddp import schedule as schedules
from clusterddp.cli.app import app
from clusterddp.cli.common import host_slots, masked_argv
from clusterddp.errors import InventoryError, SpecError, UsageError
from clusterddp.record import RunStatus
from clusterddp.runspec import RunSpec
from clusterddp.schedule import crontab as crontab_mod
from clusterddp.store import RunStore
from helpers import make_record

UNICODE_DIGITS = ["²", "٣", "۳", "१"]  # superscript two; Arabic-Indic, extended Arabic-Indic, Devanagari three


@pytest.mark.parametrize("digit", UNICODE_DIGITS)
@pytest.mark.parametrize("key", ["slots", "port"])
def test_unicode_digits_in_a_hostfile_are_a_located_refusal(key, digit):
    with pytest.raises(InventoryError) as e:
        inventory.parse_hostfile(f"gpu-01 slots=2\ngpu-02 {key}={digit}\n", "hf")
    assert str(e.value).startswith(f"hf:2: {key}: ") and e.value.exit_code == 2


@pytest.mark.parametrize("digit", UNICODE_DIGITS)
def test_unicode_digits_in_hosts_gpus_are_refused(digit):
    with pytest.raises(UsageError, match="is not a GPU number for node-1"):
        host_slots(f"node-1:{digit}")
    with pytest.raises(UsageError, match="is not a GPU number"):
        host_slots("node-1:" + "9" * 30)
    assert host_slots("node-1:0,1,node-2") == (["node-1", "node-2"], {"node-1": (0, 1)})


def test_hosts_with_a_unicode_digit_exits_2_on_the_command_line(tmp_path):
    (tmp_path / "t.py").write_text("print('hi')\n")
    (tmp_path / "inv.yaml").write_text("hosts: [{name: node-1, address: 10.0.0.1}]\n")
    r = CliRunner().invoke(app, ["up", str(tmp_path / "inv.yaml"), str(tmp_path / "t.py"), "--hosts", "node-1:²",
                                 "--runs-dir", str(tmp_path / "runs"), "--dry-run"])
    assert r.exit_code == 2 and "'²' is not a GPU number for node-1" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("gpus", ["1025", str(10 ** 30)])
def test_inventory_gpus_is_bounded_as_the_flag_is(gpus):
    with pytest.raises(InventoryError, match=r"hosts\[0\]\.gpus: must be at most 1024"):
        inventory.parse(f"hosts: [{{name: a, gpus: {gpus}}}]\n", "i.yaml")
    with pytest.raises(InventoryError, match=r"defaults\.gpus: must be at most 1024"):
        inventory.parse(f"defaults: {{gpus: {gpus}}}\nhosts: [{{name: a}}]\n", "i.yaml")
    assert inventory.parse("hosts: [{name: a, gpus: 1024}]\n", "i.yaml").hosts[0].gpus == 1024


@pytest.mark.parametrize("glob, words", [("/etc/*", "must be relative to the run folder"),
                                         ("../up/*", "must be relative to the run folder"),
                                         ("ckpt\n[local] PASS", "holds the control character U+000A")])
def test_a_collect_glob_the_node_would_refuse_is_refused_in_the_inventory_and_on_the_command_line(tmp_path, glob,
                                                                                                  words):
    with pytest.raises(InventoryError, match=r"collect\[0\]: " + re.escape(words)):
        inventory.parse(f"collect: [{json.dumps(glob)}]\nhosts: [{{name: a}}]\n", "i.yaml")
    (tmp_path / "t.py").write_text("print('hi')\n")
    r = CliRunner().invoke(app, ["up", "local", str(tmp_path / "t.py"), "--collect", glob,
                                 "--runs-dir", str(tmp_path / "runs"), "--dry-run"])
    assert r.exit_code == 2 and f"--collect {glob[:40]!r}: {words}" in r.output and "Traceback" not in r.output
    assert inventory.parse("collect: ['ckpt/**', './a']\nhosts: [{name: a}]\n", "i.yaml").collect == ("ckpt/**", "./a")


@pytest.mark.parametrize("name", [".", ".."])
def test_schedule_names_dot_and_dotdot_are_refused(name):
    with pytest.raises(UsageError, match="schedule name"):
        schedules.check_name(name)
    assert schedules.check_name("...") == "..." and schedules.check_name(".x") == ".x"


@pytest.mark.parametrize("expr", ["*/99999999999999999999 * * * *", "0 */99 * * *", "*/60 * * * *",
                                  "0 0 1-99999999999 * *"])
def test_a_cron_number_out_of_its_fields_range_is_refused(expr):
    with pytest.raises(UsageError, match="is out of range") as e:
        schedules.check_cron(expr)
    assert e.value.exit_code == 2 and "field" in str(e.value)


def _spec(tmp_path) -> schedules.ScheduleSpec:
    return schedules.ScheduleSpec(
        name="nightly",
        cron="0 2 * * *",
        launch_dir=str(tmp_path),
        runs_dir=str(tmp_path / "runs"),
        executable=("/venv/bin/clusterddp",),
        bin_dir="/venv/bin",
        inventory="local",
        run=RunSpec(script="/x/t.py"),
    )


def test_a_deeply_nested_schedule_spec_is_a_located_refusal(tmp_path):
    s = _spec(tmp_path)
    schedules.save_spec(s)
    with open(s.spec_path, "w") as f:
        f.write("[" * 50_000 + "]" * 50_000)
    with pytest.raises(SpecError, match="nested too deeply") as e:
        schedules.load_spec(s.spec_path)
    assert e.value.exit_code == 2 and s.spec_path in str(e.value)


@pytest.fixture
def crontab(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    text = {"text": ""}
    for mod in (schedules, crontab_mod):
        monkeypatch.setattr(mod, "read_crontab", lambda: text["text"])
        monkeypatch.setattr(mod, "write_crontab", lambda t: text.update(text=t))
    return text


def test_schedule_list_remove_and_run_take_runs_dir(tmp_path, crontab):
    s = _spec(tmp_path)
    schedules.add(s)
    other = str(tmp_path / "elsewhere")
    r = CliRunner().invoke(app, ["schedule", "list", "--runs-dir", other])
    assert r.exit_code == 0 and "no schedules" in r.output and "nightly" not in r.output, r.output
    r = CliRunner().invoke(app, ["schedule", "list", "--runs-dir", s.runs_dir])
    assert r.exit_code == 0 and r.output.splitlines()[1].startswith("nightly "), r.output
    for verb in ("remove", "run"):
        r = CliRunner().invoke(app, ["schedule", verb, "nightly", "--runs-dir", other])
        assert r.exit_code == 2 and f"keeps its runs in {s.runs_dir}, not in {other}" in r.output, r.output
    assert schedules.find(crontab["text"], "nightly") is not None  # nothing removed
    r = CliRunner().invoke(app, ["schedule", "remove", "nightly", "--runs-dir", s.runs_dir])
    assert r.exit_code == 0 and schedules.find(crontab["text"], "nightly") is None, r.output


def test_a_hand_deleted_run_folder_does_not_stop_listing_or_prune(tmp_path):
    from clusterddp.prune import Policy, select
    store = RunStore(tmp_path / "runs")
    for i, rid in enumerate(("20261129-100000-aaaa", "20261129-110000-bbbb", "20261129-120000-cccc")):
        store.create(make_record(rid, status=RunStatus.SUCCEEDED, started_at=f"2026-11-29T1{i}:00:00+00:00"))
    shutil.rmtree(store.run_dir("20261129-110000-bbbb"))
    assert [r["run_id"] for r in store.list()] == ["20261129-120000-cccc", "20261129-100000-aaaa"]
    sel = select(store, Policy(keep=1))
    assert [r.run_id for r in sel.remove] == ["20261129-100000-aaaa"] and sel.damaged == ()


def test_a_crash_report_hides_env_values():
    argv = ["clusterddp", "up", "inv.yaml", "t.py", "-e", "HF_TOKEN=hf_s3cret", "-eA=s2", "--env=B=s3", "--env",
            "C=s4", "-e", "PLAIN", "-e", "@secrets.env", "--name", "x=y", "--", "-e", "K=script-arg"]
    shown = masked_argv(argv)
    assert not any(s in " ".join(shown[:-3]) for s in ("hf_s3cret", "s2", "s3", "s4"))
    assert shown == ["clusterddp", "up", "inv.yaml", "t.py", "-e", "HF_TOKEN=***", "-eA=***", "--env=B=***",
                     "--env", "C=***", "-e", "PLAIN", "-e", "@secrets.env", "--name", "x=y", "--", "-e", "K=script-arg"]


def test_the_crash_report_file_has_no_env_value(tmp_path, monkeypatch):
    import clusterddp.backends
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(sys, "argv", ["clusterddp", "up", "local", "t.py", "-e", "TOKEN=hunter2"])

    def broken(*a, **k):
        raise RuntimeError("boom")
    monkeypatch.setattr(clusterddp.backends, "load_inventory", broken)
    (tmp_path / "t.py").write_text("print('hi')\n")
    r = CliRunner().invoke(app, ["up", "local", str(tmp_path / "t.py"), "-e", "TOKEN=hunter2",
                                 "--runs-dir", str(tmp_path / "runs")])
    assert r.exit_code == 1 and "internal error" in r.output, r.output
    (report,) = (tmp_path / "state" / "clusterddp").iterdir()
    text = report.read_text()
    assert "TOKEN=***" in text and "hunter2" not in text
