"""What a backend cannot reach is refused saying why, never an internal "cannot connect: 'slurm'":
`top` of a Slurm job that has not started (its row says so; the run named: exit 2), `prune` of a
Slurm run whose job Slurm still runs (its folder kept), and `exec`/`leases`/`top --inventory` on a
`slurm:` inventory, which lists no hosts (exit 2). Slurm here is a login host that answers as it
would (test_slurm_stacks.py's); the real thing is test_slurm_reach.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from clusterddp import prune as pruning
from clusterddp import top as top_view
from clusterddp.backends import for_record
from clusterddp.record import RunStatus
from helpers import cddp, parse_inventory
from test_slurm_stacks import _Slurm, recorded


def test_top_of_a_slurm_job_not_started_yet_says_so_in_its_row(tmp_path, monkeypatch):
    login = _Slurm({}, nodelist="", state="PENDING")
    prep = recorded(tmp_path, monkeypatch, login)
    rec = prep.store.load(prep.plan.run_id)
    with top_view.Watch([rec], reach=lambda r: for_record(r).reach(prep.store, r, "top"), clock=lambda: 0.0) as w:
        [run] = w.look().runs
    assert run.nodes == [] and run.error is not None
    assert run.error.startswith(f"top: run {rec.run_id} is a slurm run, and its slurm job 4242 has not started yet "
                                "(pending)"), run.error
    assert login.srun == {}  # no step asked for
    from rich.console import Console

    from clusterddp.cli.top import table
    console = Console(width=400, record=True)
    console.print(table(top_view.Snapshot(0.0, [run])))
    row = next(ln for ln in console.export_text().splitlines() if ln.startswith(rec.run_id))
    assert "has not started yet (pending)" in row, row  # the row says why, where a node's last line goes


def test_prune_keeps_a_slurm_runs_folder_while_slurm_still_runs_its_job(tmp_path, monkeypatch):
    login = _Slurm({})  # RUNNING, whatever the record says
    prep = recorded(tmp_path, monkeypatch, login)
    run_id = prep.plan.run_id
    prep.store.update(run_id, lambda r: replace(r, status=RunStatus.FAILED, ended_at="2020-01-01T00:00:00+00:00"))
    sel = pruning.select(prep.store, pruning.Policy(keep=0))
    [res] = pruning.prune(prep.store, sel, reach=lambda r: for_record(r).reach(prep.store, r, "prune"))
    assert not res.removed
    assert res.why_kept == (f"prune: run {run_id} is a slurm run, and its slurm job 4242 is still running: its "
                            f"folder is in use; hint: `clusterddp stop {run_id}` ends it; then prune again")
    assert prep.store.load(run_id).run_id == run_id


@pytest.mark.parametrize("verb", [["exec", "{inv}", "--", "hostname"], ["leases", "{inv}"],
                                  ["top", "--once", "--inventory", "{inv}"]])
def test_commands_on_an_inventorys_hosts_refuse_a_slurm_inventory(tmp_path, verb):
    inv = tmp_path / "cluster.yaml"
    inv.write_text("slurm:\n  nodes: 2\n")
    r = cddp(*[w.format(inv=inv) for w in verb], "--runs-dir", str(tmp_path / "runs"), check_rc=2) \
        if verb[0] == "top" else cddp(*[w.format(inv=inv) for w in verb], check_rc=2)
    name = "top --inventory" if verb[0] == "top" else verb[0]
    assert f"error: {name}: not available for a `slurm:` inventory ({inv}): it lists no hosts" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_slurm_node_is_no_ssh_host_and_a_transport_handed_one_says_why_not(tmp_path):
    from clusterddp.backends.slurm.jobpart import NodeSettings
    from clusterddp.backends.slurm.section import settings_of
    from clusterddp.errors import HostError
    from clusterddp.inventory import Host, Node
    from clusterddp.transport import connect
    inv = parse_inventory("slurm:\n  nodes: 2\n  python: /opt/py\n", "c.yaml")
    node = NodeSettings.of(settings_of(inv)).node("n1")  # what a Slurm run's node record holds
    assert isinstance(node, Node) and not isinstance(node, Host)  # no SSH settings to pretend with
    assert (node.name, node.address, node.python) == ("n1", "n1", "/opt/py")
    with pytest.raises(HostError) as e:
        connect(node)
    assert str(e.value) == ("n1: not reached by a connection of its own; a command for a run's nodes goes through "
                            "the backend that ran it"), e.value
