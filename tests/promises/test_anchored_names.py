"""Names and counts checked whole: a pattern ending in `$` also matches before a final newline."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from clusterddp import schedule
from clusterddp.cli.app import app
from clusterddp.errors import UsageError


@pytest.mark.parametrize("name", ["nightly\n", "nightly\r", "night ly", ""])
def test_a_schedule_name_with_a_trailing_newline_is_refused(name):
    with pytest.raises(UsageError, match="schedule name"):
        schedule.check_name(name)
    assert schedule.check_name("nightly-eval.v2") == "nightly-eval.v2"


def test_a_checkpoint_name_with_a_trailing_newline_is_not_a_checkpoint(tmp_path):
    import clusterddp.train as train
    for n in ("step-1.pt\n", "step-9.pt.tmp", "xstep-8.pt", "step-2.pt"):
        (tmp_path / n).write_bytes(b"")
    assert [step for step, _ in train._checkpoints(tmp_path)] == [2]


@pytest.mark.parametrize("gpus, ok", [("1", True), ("1024", True), ("1025", False), (str(10**30), False)])
def test_gpus_is_bounded(tmp_path, gpus, ok):
    (tmp_path / "t.py").write_text("print('hi')\n")
    (tmp_path / "inv.yaml").write_text("hosts:\n  - {name: a, address: a.invalid}\n")
    r = CliRunner().invoke(app, ["up", str(tmp_path / "inv.yaml"), str(tmp_path / "t.py"), "--gpus", gpus,
                                 "--runs-dir", str(tmp_path / "runs"), "--dry-run"])
    assert (r.exit_code == 0) == ok, r.output
    if not ok:
        assert r.exit_code == 2 and "--gpus" in r.output and "Traceback" not in r.output
