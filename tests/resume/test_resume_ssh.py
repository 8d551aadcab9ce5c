"""Running the same command twice (issue 24, section 2): `up local` carries on from the first run's
checkpoints (tests/promises/test_newcomer.py); an inventory run starts over, each run having a folder of
its own, and says so, with the arguments that carry on. Real sshd host, real torchrun, the example (one
2-step run of 1 process on 1 node)."""

from __future__ import annotations

import re
import shlex
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from clusterddp.store import new_run_id
from helpers import REPO, cddp

pytestmark = pytest.mark.integration


def test_the_same_inventory_command_again_says_it_starts_over_and_how_to_carry_on(bed, tmp_path):
    shutil.copy(REPO / "examples" / "ddp_train.py", tmp_path / "ddp_train.py")
    inventory = bed.write_inventory(tmp_path / "inv.yaml")
    # an earlier run of the same script on node1, as a run leaves its folder there (a second `up` would
    # cost CI a run: the run below has the very layout it stands in for, its own folder found as one)
    # Named a second before now: the newest earlier run, whatever runs of ddp_train.py other tests left on this
    # session bed's node1 (an earlier run is one whose id sorts before this run's: train.load_latest)
    earlier_run = Path(bed.nodes[0].workdir) / "runs" / new_run_id(datetime.now(timezone.utc) - timedelta(seconds=1),
                                                                    "e4r1")
    earlier = earlier_run / "checkpoints"
    earlier.mkdir(parents=True)
    (earlier_run / ".clusterddp").mkdir()
    shutil.copy(REPO / "examples" / "ddp_train.py", earlier_run / "ddp_train.py")
    (earlier / "step-2.pt").write_bytes(b"")
    args = ("--epochs", "1", "--dataset-size", "64")  # 2 steps
    try:
        r = cddp("up", str(inventory), str(tmp_path / "ddp_train.py"), "--hosts", "node1", "--gpus", "1",
                 "--runs-dir", str(tmp_path / "runs"), "--", *args, check_rc=0)
    finally:
        shutil.rmtree(earlier_run)
    said = re.search(r"\[node1\] no checkpoint in checkpoints \(.*\): this run starts from scratch\. (.*)", r.stdout)
    assert said, r.stdout
    assert said.group(1) == (
        "Each run of an inventory has a folder of its own, and an earlier run of ddp_train.py on this host "
        f"({earlier_run.name}) left step-2.pt in {earlier}: to carry on from it, run the same `clusterddp up` "
        f"command with the script's arguments (after `--`): {shlex.join(args)} --checkpoint-dir {earlier}")
    assert "[node1] done world_size=1 final_step=2" in r.stdout and "resumed" not in r.stdout
