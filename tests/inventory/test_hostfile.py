"""DeepSpeed/MPI hostfiles as inventories, `--exclude`, and the `--local-rank-arg` pieces (pure code)."""

from __future__ import annotations

import string
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterddp import inventory, plan
from clusterddp.backends import base
from clusterddp.errors import InventoryError, SpecError
from clusterddp.inventory import _hostfile
from clusterddp.node import worker
from clusterddp.nodescript import torchrun_entry, worker_command
from clusterddp.runspec import RunSpec
from helpers import REPO, resolved


def load(tmp_path, text: str, name: str = "hostfile"):
    p = tmp_path / name
    p.write_text(text)
    return inventory.load(p)


def error_of(tmp_path, text: str) -> str:
    with pytest.raises(InventoryError) as e:
        load(tmp_path, text)
    return str(e.value)


def test_a_deepspeed_hostfile_is_an_inventory_in_file_order(tmp_path):
    inv = load(tmp_path, "# lab\nworker-1 slots=4\n\n  worker-2 slots=8   # the big one\nworker-3\n"
                         "worker-4 slots=2 max_slots=8 port=2222 workdir=/scratch/me python=/opt/py/bin/python\n")
    assert [(h.name, h.gpus, h.address) for h in inv.hosts] == [
        ("worker-1", 4, "worker-1"), ("worker-2", 8, "worker-2"), ("worker-3", "auto", "worker-3"),
        ("worker-4", 2, "worker-4")]
    w4 = inv.hosts[3]
    assert (w4.port, w4.workdir, w4.python) == (2222, "/scratch/me", "/opt/py/bin/python")
    assert inv.master.host == "worker-1" and inv.master.port == 29500 and inv.name == "hostfile"
    assert inv.hosts[0].user is None and inv.hosts[0].host_key_policy == "strict"  # ssh_config and defaults decide


@pytest.mark.parametrize(("text", "where", "words"), [
    ("a slots=2\nb slots=0\n", ":2: slots:", "must be >= 1"),
    ("a slots=two\n", ":1: slots:", "whole number"),
    ("a slots=2\n# c\nb\na slots=1\n", ":4:", "duplicate host name 'a' (also line 1)"),
    ("a slots=1 colour=red\n", ":1:", "'colour': unknown key"),
    ("a slots=1 port=70000\n", ":1: port:", "65535"),
    ("a slots\n", ":1:", "expected key=value"),
    ("a slots=1 slots=2\n", ":1:", "slots given twice"),
    ("ok\nb@d slots=1\n", ":2:", "is not a host name"),
    ("local slots=1\n", ":1:", "is not a host name"),
    ("a host_key_policy=none\n", ":1: host_key_policy:", "'strict' or 'accept-new'"),
    ("a connect_timeout=0\n", ":1: connect_timeout:", "greater than 0"),
    ("a address=x\x1b[2J\n", ":1: address:", "control character"),
])
def test_bad_hostfiles_are_refused_naming_file_line_and_field(tmp_path, text, where, words):
    msg = error_of(tmp_path, text)
    assert f"hostfile{where}" in msg and words in msg, msg


def test_yaml_inventories_are_not_read_as_hostfiles():
    for text in ((REPO / "inventory" / "lab.yaml").read_text(), "hosts:\n  - name: a\n", "{hosts: [{name: a}]}",
                 "---\nhosts: []\n", "- a\n- b\n", "", "# only a comment\n"):
        assert not _hostfile.is_hostfile(text), text


HOST = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True).filter(lambda s: s != "local")
SPACE = st.sampled_from([" ", "  ", "\t", " \t "])


@st.composite
def hostfiles(draw):
    """A valid hostfile (comments, blank lines, odd spacing) and the (name, gpus) it describes."""
    names = draw(st.lists(HOST, min_size=1, max_size=8, unique=True))
    lines, want = [], []
    for name in names:
        for _ in range(draw(st.integers(0, 2))):
            lines.append(draw(st.sampled_from(["", "#", "# " + draw(st.text(string.printable, max_size=20))
                                               .replace("\n", " ").replace("\r", " "), "   "])))
        slots = draw(st.one_of(st.none(), st.integers(1, 1024)))
        words = [name] + ([] if slots is None else [f"slots={slots}"])
        if draw(st.booleans()):
            words.append(f"max_slots={draw(st.integers(1, 64))}")
        line = draw(st.sampled_from(["", " "])) + draw(SPACE).join(words)
        if draw(st.booleans()):
            line += draw(SPACE) + "# " + draw(st.text(string.ascii_letters + " ", max_size=10))
        lines.append(line)
        want.append((name, "auto" if slots is None else slots))
    return "\n".join(lines) + draw(st.sampled_from(["", "\n", "\r\n"])), want


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(hostfiles())
def test_generated_hostfiles_read_back_as_written(tmp_path, case):
    text, want = case
    assert _hostfile.is_hostfile(text)
    inv = inventory.parse_hostfile(text, "hf")
    assert [(h.name, h.gpus) for h in inv.hosts] == want
    assert inv.master.host == want[0][0]


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=300))
def test_any_text_gives_an_inventory_or_a_located_error(text):
    if not _hostfile.is_hostfile(text):
        return
    try:
        inv = inventory.parse_hostfile(text, "hf")
    except InventoryError as e:
        assert str(e).startswith("hf"), e
    else:
        assert inv.hosts and all(inventory.HOST_NAME_RE.fullmatch(h.name) for h in inv.hosts)


def test_exclude_after_hosts_refuses_unknown_names_and_an_empty_result(tmp_path):
    inv = load(tmp_path, "a\nb\nc\nd\n")
    assert [h.name for h in inv.narrow(None, ["b", "d"]).hosts] == ["a", "c"]
    assert [h.name for h in inv.narrow(["d", "b", "a"], ["b"]).hosts] == ["a", "d"]  # inventory order
    assert inv.narrow(None, ["a"]).master.host == "b"  # the master left: the first host left leads
    assert inv.narrow(["b"], ["a"]).hosts[0].name == "b"  # excluding a known host outside --hosts is fine
    with pytest.raises(InventoryError, match=r"--exclude names x, y, not in the inventory"):
        inv.narrow(None, ["a", "x", "y"])
    with pytest.raises(InventoryError, match="--exclude leaves no host"):
        inv.narrow(["a", "b"], ["a", "b"])


def test_worker_command_puts_the_local_rank_before_the_users_arguments():
    assert worker_command("py", "t.py", ["--x", "a b"]) == ("py", "-u", "t.py", "--x", "a b")
    assert torchrun_entry("py", "t.py", ["--x"]) == ("t.py", "--x")
    entry = torchrun_entry("/opt/py", "t.py", ["--x", "$HOME"], "--local_rank")
    assert entry[:3] == ("--no-python", "/opt/py", "-S") and entry[3].startswith("-c")
    assert entry[4:] == ("--local_rank", "t.py", "--x", "$HOME")
    assert worker.command(["--local_rank", "t.py", "--x"], {"LOCAL_RANK": "3"}, "py") == [
        "py", "-u", "t.py", "--local_rank=3", "--x"]
    assert worker.command(["--local-rank", "t.py"], {"SLURM_LOCALID": "1"}, "py")[3] == "--local-rank=1"  # srun
    for argv, env in ((["--rank", "t.py"], {"LOCAL_RANK": "0"}), (["--local_rank", "t.py"], {"LOCAL_RANK": "x"})):
        with pytest.raises(ValueError):
            worker.command(argv, env, "py")


def test_the_plan_renders_the_shim_quoted_and_only_when_asked(tmp_path):
    inv = load(tmp_path, "a slots=2\nb slots=2\n")
    off = plan.build_plan(inv, resolved(RunSpec("t.py", ("$HOME",)), inv), "r1")
    on = plan.build_plan(inv, resolved(RunSpec("t.py", ("$HOME",), local_rank_arg="--local_rank"), inv), "r1")
    assert "--no-python" not in off.nodes[0].launch_script
    assert off.nodes[0].argv[-2:] == ("t.py", "$HOME")
    assert on.nodes[1].argv[-3:] == ("--local_rank", "t.py", "$HOME") and "--no-python" in on.nodes[1].argv
    assert "'$HOME'" in on.nodes[1].launch_script  # every user word stays quoted


def test_up_warns_when_a_script_parses_local_rank_and_the_option_is_off(tmp_path):
    s = tmp_path / "d.py"
    s.write_text("import argparse\np = argparse.ArgumentParser()\np.add_argument(\"--local-rank\", type=int)\n")
    warning = base.local_rank_warning(RunSpec(str(s)))
    assert warning and f"{s}:3 parses --local-rank" in warning and "--local-rank-arg=--local-rank" in warning
    assert base.local_rank_warning(RunSpec(str(s), local_rank_arg="--local-rank")) is None
    s.write_text("import os\nrank = int(os.environ['LOCAL_RANK'])  # --local_rank is not parsed here\n")
    assert base.local_rank_warning(RunSpec(str(s))) is None


def test_local_rank_arg_spellings_on_the_command_line():
    from clusterddp.cli.common import local_rank_flag
    from clusterddp.errors import UsageError
    assert [local_rank_flag(v) for v in ("--local_rank", "local_rank", "--local-rank", "local-rank", None)] == [
        "--local_rank", "--local_rank", "--local-rank", "--local-rank", None]
    with pytest.raises(UsageError, match="expected --local_rank or --local-rank"):
        local_rank_flag("--rank")


def test_top_and_its_help_import_no_ssh_library_and_the_cli_no_rich():
    """rich is imported when a view is drawn (typer's own --help formatting aside), paramiko when a node
    is asked: `clusterddp top --help` stays as fast as every other --help."""
    import subprocess
    code = ("import sys\nfrom clusterddp.cli.app import app\nprint('rich' in sys.modules)\ntry:\n"
            "    app(['top', '--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('paramiko', 'fabric', 'yaml', 'pydantic') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert out.startswith("False\n") and out.strip().endswith("[]") and "--progress-regex" in out, out


def test_a_schedule_keeps_local_rank_arg_and_older_specs_read_as_before():
    from clusterddp import schedule as schedules
    base = dict(name="nightly", cron="0 2 * * *", launch_dir="/p", runs_dir="/srv/runs", executable=("/v/bin/cddp",),
                bin_dir="/v/bin", inventory="/p/hostfile", hosts=("gpu-01",))
    on = schedules.ScheduleSpec(
        run=RunSpec(script="/p/t.py", script_args=("x",), local_rank_arg="--local_rank"), **base
    )
    off = schedules.ScheduleSpec(run=RunSpec(script="/p/t.py"), **base)
    assert schedules.spec_from_json(on.to_json(), on.spec_path) == on
    assert "local_rank_arg" not in off.to_json() and schedules.spec_from_json(off.to_json(), off.spec_path) == off
    assert schedules.up_argv(on)[-3:] == ["--local-rank-arg=--local_rank", "--", "x"]
    with pytest.raises(SpecError, match="local_rank_arg: '--rank' is not --local_rank or --local-rank"):
        schedules.spec_from_json({**on.to_json(), "local_rank_arg": "--rank"}, on.spec_path)
