"""`up`'s connections open beside its own work (issue 45 section 3): from when the run's hosts are known
(the inventory read, checked and narrowed), while `up` scans the script folder, plans, reads the locks and
packs the upload; a dry run opens none, and a refusal after that point leaves none open. Fake connections
(pure logic at the transport seam); the real ones: test_up_ssh.py and bench/up_ssh.py --trace."""

from __future__ import annotations

import threading
import time

import pytest

from clusterddp.backends.ssh import launch
from clusterddp.errors import UsageError
from clusterddp.runspec import RunSpec
from clusterddp.transport import CommandResult
from helpers import resolved

INVENTORY = ("defaults: {user: me, gpus: 1, workdir: /w}\n"
             "master: {host: b}\n"
             "hosts: [{name: a, address: 10.0.0.1}, {name: b, address: 10.0.0.2}, {name: c, address: 10.0.0.3}]\n")


class Fake:
    def __init__(self, name: str) -> None:
        self.name, self.closed = name, False

    def run(self, command, **kw) -> CommandResult:
        raise AssertionError(f"no command goes to {self.name} before the plan is run: {command[:80]}")

    stream = run

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def connects(monkeypatch):
    """Every connection `up` opens: (host, thread, fake), each held until ``go`` is set."""
    got: list[tuple[str, str, Fake]] = []
    go = threading.Event()

    def connect(host):
        t = Fake(host.name)
        got.append((host.name, threading.current_thread().name, t))
        assert go.wait(30), "never let go"
        return t
    real = launch.Connecting
    monkeypatch.setattr(launch, "Connecting", lambda inventory: real(inventory, connect=connect))
    return got, go


def within(cond, seconds: float = 30) -> bool:
    end = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def test_the_connections_open_while_up_plans_and_packs(tmp_path, connects):
    got, go = connects
    inv = tmp_path / "inv.yaml"
    inv.write_text(INVENTORY)
    (tmp_path / "t.py").write_text("print(1)\n")
    spec = resolved(RunSpec(str(tmp_path / "t.py")), inv)
    prep = launch.prepare(str(inv), spec, str(tmp_path / "runs"), contact=True)
    # prepare has returned and the upload is still to pack: every host is being connected to already,
    # none of them answered yet (each is held), and not on this thread
    assert within(lambda: len(got) == 3), got
    assert prep.connecting is not None and prep.connecting.fleet.connected() == []
    packed = launch.pack(prep)
    assert packed is not None and prep.connecting.fleet.connected() == []
    packed.discard()
    go.set()
    opened = prep.connecting.result()
    assert sorted(opened.succeeded) == ["a", "b", "c"] and {th for _, th, _ in got} != {threading.main_thread().name}
    # in the plan's order (the master first), for the run's nodes
    assert [h.name for h in prep.connecting.fleet.hosts] == [n.host.name for n in prep.plan.nodes] == ["b", "a", "c"]
    prep.connecting.close()
    assert all(t.closed for _, _, t in got)


def test_a_dry_run_opens_none(tmp_path, connects):
    got, go = connects
    go.set()
    inv = tmp_path / "inv.yaml"
    inv.write_text(INVENTORY)
    (tmp_path / "t.py").write_text("print(1)\n")
    prep = launch.prepare(str(inv), resolved(RunSpec(str(tmp_path / "t.py")), inv), str(tmp_path / "runs"))
    assert prep.connecting is None and got == []


def test_a_refusal_after_the_hosts_are_known_leaves_no_connection_open(tmp_path, connects):
    got, go = connects
    inv = tmp_path / "inv.yaml"
    inv.write_text(INVENTORY)
    (tmp_path / "t.py").write_text("print(1)\n")
    with pytest.raises(UsageError, match="no run matches .nosuchrun."):  # refused after the connections started opening
        launch.prepare(str(inv), resolved(RunSpec(str(tmp_path / "t.py")), inv), str(tmp_path / "runs"),
                       contact=True,
                       resume="nosuchrun")
    assert within(lambda: len(got) == 3), got
    go.set()  # they open only now, after the refusal: each is closed as it does
    assert within(lambda: all(t.closed for _, _, t in got)), [(h, t.closed) for h, _, t in got]
