"""A requeued Slurm job runs again in the same node folders: each attempt's sample file is kept
(``<host>@attempt-N/``, as an SSH host's earlier attempt's control folder) and comes back as SSH's do
(``metrics/<host>/attempt-N.jsonl`` beside ``samples.jsonl``); an earlier attempt's idle.json is not the
new one's. The node script's lines run for real in bash; the copy through a local transport, as the
login host's shared folder is read."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from clusterddp.backends.slurm import plan as slurm_plan
from clusterddp.backends.slurm.job import copy_samples
from clusterddp.metrics.samples import load_run
from clusterddp.store import RunStore
from clusterddp.transport.local import LocalTransport

RUN = "20261206-083000-5a11"


def attempt(ctl: Path, restart: int, header: str) -> None:
    """One attempt of the node script on this node: its lines, then the sampler's file written anew."""
    script = "\n".join([f"CTL={ctl}", *slurm_plan.keep_samples_lines()])
    subprocess.run(["bash", "-c", script], check=True, env={**os.environ, "SLURM_RESTART_COUNT": str(restart)})
    head = {"kind": "clusterddp-samples", "schema": 1, "host": header}
    first = {"t": 1.0, "dt": 1.0, "progress": restart + 1}
    (ctl / "metrics.jsonl").write_text(json.dumps(head) + "\n" + json.dumps(first) + "\n")
    (ctl / "idle.json").write_text("{}")


def test_each_attempt_s_samples_are_kept_and_come_back_as_ssh_s(tmp_path):
    ctl = tmp_path / "shared" / ".clusterddp" / "nodes" / "node-1"
    ctl.mkdir(parents=True)
    attempt(ctl, 0, "first")
    attempt(ctl, 1, "second")
    attempt(ctl, 2, "third")
    assert (ctl.parent / "node-1@attempt-1" / "metrics.jsonl").read_text().count('"first"') == 1
    assert '"second"' in (ctl.parent / "node-1@attempt-2" / "metrics.jsonl").read_text()
    # a node that sat out attempt 3 and runs attempt 4: its file is attempt 3's, named so
    attempt(ctl, 3, "fourth")
    assert '"third"' in (ctl.parent / "node-1@attempt-3" / "metrics.jsonl").read_text()
    (ctl / "idle.json").unlink()
    script = "\n".join([f"CTL={ctl}", *slurm_plan.keep_samples_lines()])
    (ctl / "idle.json").write_text("{}")
    subprocess.run(["bash", "-c", script], check=True, env={**os.environ, "SLURM_RESTART_COUNT": "4"})
    assert not (ctl / "idle.json").exists()  # an earlier attempt's idle decision is not the new one's
    (ctl / "metrics.jsonl").write_text('{"kind": "clusterddp-samples", "schema": 1}\n{"t": 1.0, "dt": 1.0, '
                                       '"progress": 5}\n')

    store = RunStore(tmp_path / "runs")
    (tmp_path / "runs" / RUN).mkdir(parents=True)
    copy_samples(LocalTransport("shared"), store, RUN, "node-1", str(ctl))
    kept = sorted(p.name for p in (tmp_path / "runs" / RUN / "metrics" / "node-1").iterdir())
    assert kept == ["attempt-1.jsonl", "attempt-2.jsonl", "attempt-3.jsonl", "attempt-4.jsonl", "samples.jsonl"]
    got = {n.key: [s.progress for s in n.samples] for n in load_run(tmp_path / "runs" / RUN)}
    assert got == {"node-1@attempt-1": [1], "node-1@attempt-2": [2], "node-1@attempt-3": [3],
                   "node-1@attempt-4": [4], "node-1": [5]}
    # a host whose folder holds no samples: nothing kept, no error
    copy_samples(LocalTransport("shared"), store, RUN, "node-2", str(ctl.parent / "node-2"))
    assert not (tmp_path / "runs" / RUN / "metrics" / "node-2").exists()


def test_the_node_script_keeps_samples_only_when_the_sampler_runs():
    from clusterddp.runspec import RunSpec
    from helpers import parse_inventory, resolved
    inv = parse_inventory("slurm:\n  partition: p\n  nodes: 2\n  shared_dir: /s\n", "c.yaml")
    on = slurm_plan.build(inv, resolved(RunSpec("t.py", max_restarts=2), inv), RUN, "/s").node_script
    off = slurm_plan.build(inv, resolved(RunSpec("t.py", max_restarts=2, metrics_interval=0), inv), RUN,
                           "/s").node_script
    assert '"$CTL@attempt-$cddp_att"' in on and "@attempt-" not in off
