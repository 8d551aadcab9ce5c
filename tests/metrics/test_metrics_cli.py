"""`clusterddp metrics` and `clusterddp report` on a recorded run: its samples kept in the run folder (a
finished run, a failed one, one without samples), every output, and bad input."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from clusterddp.cli.app import app
from clusterddp.metrics import samples as samples_module
from clusterddp.record import RunStatus
from clusterddp.store import RunStore
from helpers import make_record
from test_samples import HEADER, line

RUN_ID = "20261206-100000-ab12"


def stored(tmp_path, with_samples=True, **fields):
    store = RunStore(tmp_path / "runs")
    store.create(make_record(RUN_ID, status=RunStatus.SUCCEEDED, ended_at="2026-11-29T10:05:00+00:00", **fields))
    if with_samples:
        for host, loss in (("a", [2.0, 1.0]), ("b", [2.2, 1.1])):
            samples_module.save(store.run_dir(RUN_ID), host, {None: HEADER + b"".join(
                line(10.0 * i, values={"loss": v}, gpus=[{"index": 0, "util": 90.0}]) for i, v in enumerate(loss))
                + b"garbage\n"})
    return store


def cli(*args):
    return CliRunner().invoke(app, list(args))


def test_metrics_shows_each_node_and_exports_json_prometheus_and_csv(tmp_path):
    stored(tmp_path)
    runs = str(tmp_path / "runs")
    r = cli("metrics", "ab12", "--runs-dir", runs)
    assert r.exit_code == 0, r.output
    assert "a: 2 sample(s)" in r.output and "m.loss" in r.output and "last 1" in r.output
    assert "note: a: 1 line(s) of its sample file were not samples" in r.output
    r = cli("metrics", "ab12", "--runs-dir", runs, "--json", "--prometheus", str(tmp_path / "m.prom"),
            "--csv", str(tmp_path / "m.csv"))
    got = json.loads(r.output)
    assert got["nodes"]["b"]["series"]["m.loss"] == [[0.0, 2.2], [10.0, 1.1]] and got["running"] is False
    assert 'clusterddp_metric_loss{run="20261206-100000-ab12",host="b"} 1.1' in (tmp_path / "m.prom").read_text()
    assert len((tmp_path / "m.csv").read_text().splitlines()) > 8


def test_a_run_without_samples_says_so_and_its_report_has_outcome_and_timeline(tmp_path):
    stored(tmp_path, with_samples=False)
    runs = str(tmp_path / "runs")
    r = cli("metrics", "ab12", "--runs-dir", runs)
    assert r.exit_code == 0 and "no samples kept" in r.output, r.output
    r = cli("report", "ab12", "--runs-dir", runs, "-o", str(tmp_path / "r.html"))
    assert r.exit_code == 0, r.output
    page = (tmp_path / "r.html").read_text()
    assert 'id="outcome"' in page and "succeeded" in page and 'id="timeline"' in page and 'id="no-samples"' in page


def test_an_unknown_run_is_bad_input(tmp_path):
    stored(tmp_path)
    r = cli("metrics", "zz99", "--runs-dir", str(tmp_path / "runs"))
    assert r.exit_code == 2 and "Traceback" not in r.output
