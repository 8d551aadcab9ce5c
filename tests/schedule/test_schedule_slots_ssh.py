"""A schedule whose GPU slots another run holds, for real: root's crontab (through `schedule run`, the
project's copy of cron's rules) and an SSH bed host with 2 slots, held by a detached run.

Without --wait the firing is skipped for its slots, in words and an exit code (75) of its own, not
taken for the schedule's lock (3); `schedule list` shows it, naming no run, and its notification names
no run id that `clusterddp runs` would not list. With --wait it waits in the queue and runs once the
slots free up.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from clusterddp import schedule as schedules
from clusterddp.store import RunStore
from helpers import cddp, job_script, run_id_of, wait_for_line
from test_schedule_cron import crontab  # noqa: F401 - the fixture: root's crontab, put back afterwards

pytestmark = pytest.mark.integration

# Plain python under the real torchrun (no torch import): says it ran, then holds its slots until the
# file named by HOLD_UNTIL exists (the holder's), or ends at once (the scheduled runs').
JOB = r'''
import os, time
print("job ran", flush=True)
until = os.environ.get("HOLD_UNTIL")
deadline = time.time() + 300
while until and not os.path.exists(until) and time.time() < deadline:
    time.sleep(0.1)
'''


@pytest.mark.timeout(600)
def test_a_firing_refused_for_its_slots_is_its_own_skip_and_with_wait_it_waits_its_turn(
        crontab, make_bed, tmp_path):  # noqa: F811
    bed = make_bed(1)
    inv = bed.write_inventory(tmp_path / "inv.yaml")  # gpus: 2
    job = job_script(tmp_path, "job.py", JOB)
    runs, release, events = tmp_path / "runs", tmp_path / "release", tmp_path / "events.json"
    store = RunStore(runs)
    first = run_id_of(cddp("up", str(inv), str(job), "--runs-dir", str(runs), "--detach", "-e",
                           f"HOLD_UNTIL={release}", check_rc=0).stdout)  # holds both slots until released
    try:
        cddp("schedule", "add", "busy", "--cron", "0 2 * * *", str(inv), str(job), "--runs-dir", str(runs),
             "--notify", f"command:cat > {events}", cwd=tmp_path, check_rc=0)
        r = cddp("schedule", "run", "busy", timeout=240)
        said = r.stdout + r.stderr
        assert r.returncode == schedules.BUSY_EXIT == 75, said
        assert "schedule busy: skipped, the GPU slots it needs are taken (nothing started)" in r.stderr, said
        assert "lock" not in r.stderr, said  # not the schedule's lock: that is another skip, exit 3
        assert f"held by run {first}" in said, said  # `up`'s own words, from the schedule's log
        (firing,) = store.firings("busy")
        assert (firing["outcome"], firing["run_id"]) == ("skipped: slots busy", None), firing
        assert "--wait" in firing["reason"]
        assert [x["run_id"] for x in store.list()] == [first]  # nothing recorded: no run to name
        told = json.loads(events.read_text())
        assert told["schedule"] == "busy" and told["run_id"] is None, told  # no id `runs` never lists
        listed = cddp("schedule", "list", check_rc=0).stdout
        assert re.search(r"^busy .* skipped: slots busy +- +1$", listed, re.M), listed

        cddp("schedule", "add", "queued", "--cron", "0 2 * * *", str(inv), str(job), "--runs-dir", str(runs),
             "--wait", cwd=tmp_path, check_rc=0)
        p = subprocess.Popen([sys.executable, "-m", "clusterddp", "schedule", "run", "queued"], text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            line = wait_for_line(p, "waiting in the queue", timeout=240)[-1]
            assert f"slots are held by run {first}" in line, line
            release.touch()
            out, _ = p.communicate(timeout=240)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert p.returncode == 0, out
        run = store.last_run("queued")
        assert run and run["status"] == "succeeded" and "job ran" in out, out
        (firing,) = store.firings("queued")
        assert (firing["outcome"], firing["run_id"]) == ("succeeded", run["run_id"])
        listed = cddp("schedule", "list", check_rc=0).stdout
        assert re.search(rf"^queued .* succeeded +{run['run_id']} +0$", listed, re.M), listed
        assert run["run_id"] in cddp("runs", "--runs-dir", str(runs), check_rc=0).stdout
    finally:
        release.touch()
