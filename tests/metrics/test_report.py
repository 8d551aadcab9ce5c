"""`clusterddp report`: one HTML file, outcome and root cause first, charts whose lines are the run's numbers, the
timeline; a run with no samples still gets its outcome and timeline. Opened in headless Chromium with the network
off (a network namespace of its own): what it renders holds the run's data."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from clusterddp.failure import Failure
from clusterddp.metrics import report as report_module
from clusterddp.metrics import samples as samples_module
from clusterddp.metrics.series import series_of
from clusterddp.record import Attempt, RunStatus
from helpers import make_record
from test_samples import HEADER, line

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
LOSS = [2.5, 2.0, 1.6, 1.3, 1.1, 0.9]


def nodes() -> list:
    out = []
    for host, util in (("a", 95.0), ("b", 60.0)):
        data = HEADER + b"".join(line(1000.0 + 5 * i, values={"loss": LOSS[i] + (host == "b") * 0.1},
                                      gpus=[{"index": 0, "util": util, "mem": 1000.0 + i},
                                            {"index": 1, "util": util - 5, "mem": 2000.0}])
                                 for i in range(len(LOSS)))
        data += b'{"t": 2000, "dt": 5, "progress": 1, "m": {"loss": NaN}}\n'
        out.append(series_of(samples_module.parse(data, host)))
    return out


def failed_record():
    f = Failure(host="b", kind="exception", summary="RuntimeError: CUDA error: an illegal memory access", rank=3)
    return make_record("R1", status=RunStatus.FAILED, failure=f, ended_at="2026-11-29T10:30:00+00:00",
                       attempts=(Attempt(2, "2026-11-29T10:10:00+00:00", ("c",), ("b",), "c was lost"),))


def test_the_page_leads_with_the_outcome_and_root_cause_and_draws_each_series(tmp_path):
    page = report_module.render(failed_record(), tmp_path, nodes(), [])
    assert page.index('id="outcome"') < page.index('id="root-cause"') < page.index("<svg")
    assert "root cause: b, rank 3: RuntimeError: CUDA error" in page
    for gid in ("series:metric-loss:a:m.loss", "series:rate:b:rate", "series:gpu-util:a:gpu1.util",
                "series:gpu-mem:b:gpu0.mem"):
        assert f'id="{gid}"' in page
    assert "c lost; spare b in: c was lost" in page  # the host lost and its spare, on the timeline
    fetches = r"""(src|href)=["']?(https?:|//)|url\((?!#)|<link|<script src|<img"""
    assert not re.search(fetches, page)  # nothing to fetch
    assert "not shown" in page  # the NaN is said, not drawn
    data = json.loads(re.search(r'id="clusterddp-data">(.*?)</script>', page, re.S).group(1))
    loss = data["charts"]["metric-loss"]["lines"][0]
    assert [v for _, v in loss["points"]] == LOSS


def test_a_run_without_samples_still_gets_its_outcome_and_timeline(tmp_path):
    page = report_module.render(failed_record(), tmp_path, [], [])
    assert 'id="root-cause"' in page and 'id="no-samples"' in page and "<svg" not in page
    assert page.count("<tr>") == 4  # header, start, the attempt, the end


def test_the_timeline_says_when_the_idle_policy_found_the_run_idle(tmp_path):
    from datetime import datetime

    from test_samples import IDLE
    at = datetime.fromisoformat("2026-11-29T10:05:00+00:00").timestamp()
    idle_nodes = [series_of(samples_module.parse(HEADER + line(1000.0) + IDLE.replace(b"12.5", str(at).encode()),
                                                 "a"))]
    rows = report_module.timeline(make_record("R1", status=RunStatus.SUCCEEDED, ended_at="2026-11-29T10:30:00+00:00"),
                                  tmp_path, idle_nodes)
    assert rows[1][0] == "2026-11-29T10:05:00+00:00" and rows[1][1].startswith(
        "idle: every GPU of the run (2 node(s)) below 5% for 30 min, found by b")
    assert [w for w, _ in rows] == sorted(w for w, _ in rows) and rows[-1][1] == "ended: succeeded"
    page = report_module.render(make_record("R1"), tmp_path, idle_nodes, [])
    assert "the run went on (idle_policy without stop)" in page
    assert "idle:" not in " ".join(w for _, w in report_module.timeline(make_record("R1"), tmp_path, nodes()))


def _path_points(svg_group: str) -> int:
    d = re.search(r'<path[^>]* d="([^"]+)"', svg_group).group(1)
    return len(re.findall(r"[ML]", d))


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no chromium (scripts/install-system-deps.sh installs it)")
def test_chromium_offline_renders_charts_that_hold_the_runs_numbers(tmp_path):
    path = tmp_path / "run.html"
    report_module.write(str(path), report_module.render(failed_record(), tmp_path, nodes(), []))
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-dev-shm-usage",
             f"--user-data-dir={tmp_path / 'profile'}"]
    # unshare -n: a network namespace with only a loopback that is down, so nothing can be fetched
    shot = subprocess.run(["unshare", "-n", CHROMIUM, *flags, f"--screenshot={tmp_path / 'shot.png'}",
                           "--window-size=1200,3000", path.as_uri()], capture_output=True, timeout=120)
    assert (tmp_path / "shot.png").stat().st_size > 10_000, shot.stderr[-2000:]
    dom = subprocess.run(["unshare", "-n", CHROMIUM, *flags, "--dump-dom", path.as_uri()], capture_output=True,
                         timeout=120, check=True).stdout.decode()
    assert "root cause: b, rank 3" in dom
    for node in ("a", "b"):
        group = re.search(rf'<g id="series:metric-loss:{node}:m\.loss">(.*?)</g>', dom, re.S)
        assert group is not None, f"no loss line for {node} in the rendered page"
        assert _path_points(group.group(1)) == len(LOSS)  # one vertex a sample: the NaN is not drawn
    data = json.loads(re.search(r'id="clusterddp-data">(.*?)</script>', dom, re.S).group(1))
    assert [v for _, v in data["charts"]["metric-loss"]["lines"][1]["points"]] == pytest.approx(
        [v + 0.1 for v in LOSS])
    # the loss axis' tick labels are text in the page, spanning the loss's range
    chart = re.search(r'<figure id="chart-metric-loss">(.*?)</figure>', dom, re.S).group(1)
    ticks = [float(t) for t in re.findall(r">\s*([0-9]+\.[0-9]+)\s*<", chart)]
    assert ticks and min(ticks) <= 1.0 and max(ticks) >= 2.5


def test_a_runs_notification_names_its_report():
    from clusterddp.notify import run_event
    ev = run_event(failed_record(), report="/w/run.html")
    assert ev["report"] == "/w/run.html" and ev["text"].endswith("(report: /w/run.html)")
    assert "report" not in run_event(failed_record())
