"""The upload on the test bed (issue 39, section 3): with the inventory beside train.py, as the README's
walk-through has it, and a notify webhook_file there, a real `up` leaves the inventory, the webhook file,
an -e @FILE and another inventory on this machine, says so, and the job on the node never sees them.
Issue 40: an `up` killed outright leaves its tarball in the temporary folder; the next `up` removes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import cddp, cddp_popen, run_id_of, wait_for_line

pytestmark = pytest.mark.integration

LISTS = """
import os
if os.environ["RANK"] == "0":
    print("run folder holds:", " ".join(sorted(os.listdir("."))), flush=True)
"""


def test_up_leaves_the_runs_secrets_and_inventories_home_and_says_so(bed, tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (job / "train.py").write_text(LISTS)
    (job / "data.txt").write_text("1 2 3\n")
    for name, text in (("hook.url", "https://hooks.invalid/T0K3N\n"), ("sec.env", "SECRET_X=1\n")):
        (job / name).write_text(text)
        (job / name).chmod(0o600)
    (job / "old-lab.yml").write_text("hosts:\n  - gpu-07\n")
    (job / ".clusterddpignore").write_text("!hook.url\n!lab.yaml\n")  # no rule sends them
    bed.write_inventory(job / "lab.yaml", bed.nodes[:1],
                        extra={"notify": [{"webhook_file": "hook.url", "on": ["skipped"]}]})
    r = cddp("up", "lab.yaml", "train.py", "--gpus", "1", "--runs-dir", str(tmp_path / "runs"), "-e", "@sec.env",
             cwd=job, check_rc=0, timeout=240)
    run_dir = Path(bed.nodes[0].workdir) / "runs" / run_id_of(r.stdout)
    assert (run_dir / "train.py").is_file() and (run_dir / "data.txt").is_file()
    assert not [n for n in ("hook.url", "lab.yaml", "sec.env", "old-lab.yml") if (run_dir / n).exists()]
    assert "run folder holds: .clusterddp .clusterddpignore data.txt train.py" in r.stdout, r.stdout
    for line in ("upload: left out hook.url: a notify webhook_file (lab.yaml: notify[0]), a secret",
                 "upload: left out lab.yaml: the inventory",
                 "upload: left out sec.env: an env file (-e @sec.env), a secret",
                 "upload: left out old-lab.yml: an inventory (a YAML file with hosts: or slurm:); a !NAME line in "
                 ".clusterddpignore sends it"):
        assert line in r.stdout.splitlines(), r.stdout
    assert "T0K3N" not in r.stdout + r.stderr


WAITS = """
import os, time
print(f"rank {os.environ['RANK']} ready", flush=True)
time.sleep(600)
"""


def test_the_tarball_of_an_up_killed_outright_is_removed_by_the_next_up(bed, tmp_path):
    job, temp, runs = tmp_path / "job", tmp_path / "tmp", str(tmp_path / "runs")
    job.mkdir()
    temp.mkdir()
    (job / "waits.py").write_text(WAITS)
    (job / "lists.py").write_text(LISTS)
    bed.write_inventory(tmp_path / "inv.yaml", bed.nodes[:1])
    p = cddp_popen("up", str(tmp_path / "inv.yaml"), "waits.py", "--gpus", "1", "--runs-dir", runs, cwd=job,
                   env={"TMPDIR": str(temp)})
    run_id = ""
    try:
        seen = wait_for_line(p, "rank 0 ready", timeout=180)
        run_id = run_id_of(next(line for line in seen if line.startswith("run ")))
        left = [f.name for f in temp.iterdir() if f.name.startswith("clusterddp-upload-")]
        assert len(left) == 1 and left[0].startswith(f"clusterddp-upload-{p.pid}-"), left
        p.kill()  # SIGKILL: no finally of it runs
        p.wait(60)
        assert [f.name for f in temp.iterdir()] == left  # the leftover issue 40 found
    finally:
        p.kill()
        p.wait(60)
        if run_id:
            cddp("stop", run_id, "--runs-dir", runs, "--grace", "2", timeout=120)
    r = cddp("up", str(tmp_path / "inv.yaml"), "lists.py", "--gpus", "1", "--runs-dir", runs, cwd=job,
             env={"TMPDIR": str(temp)}, check_rc=0, timeout=240)
    assert "run folder holds:" in r.stdout
    assert list(temp.iterdir()) == []  # the killed one's removed at the start, its own at its end
