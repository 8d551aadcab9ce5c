"""`up local` keeps its samples too: a plain script (no clusterddp.train) printing `loss X`, run with a
metrics regex, then `metrics --json` and the report read the loss back. (Its control folder is `node`, not
the host's name: the samples were once left behind on `up local`.)"""

from __future__ import annotations

import json

import pytest

from helpers import cddp

pytestmark = pytest.mark.slow

SCRIPT = """\
import time
for step in range(6):
    print(f"step {step} loss {1.0 / (step + 1):.4f}", flush=True)
    time.sleep(0.6)
"""


def test_up_local_brings_its_samples_back_and_metrics_and_the_report_read_them(tmp_path):
    (tmp_path / "plain.py").write_text(SCRIPT)
    r = cddp("up", "local", "plain.py", "--gpus", "1", "--runs-dir", "runs", "--metrics-interval", "0.5",
             "--metrics-regex", r"loss (?P<loss>[0-9.]+)", "--report", "run.html", cwd=tmp_path, check_rc=0)
    run_id = r.stdout.split("run ", 1)[1].split()[0]
    data = json.loads(cddp("metrics", run_id, "--json", "--runs-dir", "runs", cwd=tmp_path, check_rc=0).stdout)
    text = json.dumps(data)
    assert '"local"' in text and '"m.loss"' in text, text[:2000]
    losses = list(_values(data, "m.loss"))
    assert 1.0 in losses or any(abs(v - 1.0) < 1e-9 for v in losses), losses
    page = (tmp_path / "run.html").read_text()
    assert "No samples were kept" not in page and "loss" in page


def _values(obj, key):
    """Every number found under ``key`` anywhere in ``obj`` (a series of numbers, or [t, v] pairs)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == key:
                yield from _numbers(v)
            else:
                yield from _values(v, key)
    elif isinstance(obj, list):
        for v in obj:
            yield from _values(v, key)


def _numbers(v):
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        yield float(v)
    elif isinstance(v, list):
        for x in v:
            yield from _numbers(x)
    elif isinstance(v, dict):
        for x in v.values():
            yield from _numbers(x)
