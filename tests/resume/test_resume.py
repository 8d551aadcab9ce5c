"""`up --resume RUN` (issue 39, section 2), the pure parts and what reads this machine only: which
checkpoint is the newest, where it is found here, which runs may be resumed from (exit 2 otherwise),
the record's ``resumed_from``, the note for a run that starts without an earlier run's checkpoint, and
the CLI's refusals. The transfer itself is tested on the SSH bed (tests/resume/test_resume_runs_ssh.py)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clusterddp import resume as resuming
from clusterddp.backends.ssh import launch as ssh_launch
from clusterddp.cli.app import app
from clusterddp.errors import HostError, RecordError, RunNotFound, UsageError
from clusterddp.mirror import DEFAULT_GLOBS, INDEX_VERSION, Checkpoint, Held
from clusterddp.record import ResumedFrom, RunRecord, RunStatus
from clusterddp.store import RunStore
from clusterddp.upload import SourceFolder
from helpers import make_record, resolved

INV = "/w/inv.yaml"
DONE = RunStatus.SUCCEEDED


def found(source: str, host: str, series: str, step: tuple[int, ...], path: str, mtime: int) -> resuming.Found:
    return resuming.Found(source, host, Checkpoint(series, step, ((path, 10, mtime),)))


def test_the_newest_is_the_highest_step_then_the_latest_write_then_a_copy_already_here():
    eight = found(resuming.NODE, "a", "step-#.pt", (8,), "step-8.pt", 900)
    ten = found(resuming.MIRROR, "a", "step-#.pt", (10,), "step-10.pt", 100)
    assert resuming.newest([eight, ten]) == resuming.newest([ten, eight]) == [ten]
    older = found(resuming.MIRROR, "a", "snapshot.pt", (), "snapshot.pt", 100)
    newer = found(resuming.NODE, "b", "snapshot.pt", (), "snapshot.pt", 200)
    assert resuming.newest([older, newer]) == resuming.newest([newer, older]) == [newer]
    on_node = replace(older, source=resuming.NODE)
    collected = replace(older, source=resuming.COLLECTED)
    for order in ([on_node, collected, older], [older, collected, on_node], [collected, on_node, older]):
        assert resuming.newest(order) == [older]  # the same file: the mirror's copy, here and checked
    assert resuming.newest([on_node, collected]) == [collected]
    assert [f.checkpoint.series for f in resuming.newest([newer, eight, ten])] == ["snapshot.pt", "step-#.pt"]


def test_what_counts_as_a_checkpoint_is_the_mirrors_default_rule_and_the_runs_collect_globs():
    rec = make_record("20261206-100000-aaaa", collect=("out/*.bin", DEFAULT_GLOBS[0]))
    assert resuming.globs_of(rec) == (*DEFAULT_GLOBS, "out/*.bin")


def _put(store: RunStore, run_id: str, host: str, rel: str, data: bytes) -> Path:
    p = store.artifact_path(run_id, host, rel)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return p


def _mirror(store: RunStore, run_id: str, *held: Held) -> None:
    store.write_mirror_index(run_id, json.dumps({"version": INDEX_VERSION,
                                                 "checkpoints": [h.to_json() for h in held]}).encode())


def test_a_runs_checkpoints_here_are_its_mirrors_checked_copies_and_its_collected_files(tmp_path):
    store = RunStore(tmp_path / "runs")
    rec = store.create(make_record("20261206-100000-aaaa", ("a", "b"), status=DONE))
    four = _put(store, rec.run_id, "a", "checkpoints/step-4.pt", b"four")
    _mirror(store, rec.run_id, Held("checkpoints/step-#.pt", (4,), "a", "t", (
        ("checkpoints/step-4.pt", 4, hashlib.sha256(b"four").hexdigest()),), (123,)))
    _put(store, rec.run_id, "b", "checkpoints/step-6.pt", b"six")
    _put(store, rec.run_id, "b", "checkpoints/step-2.pt", b"two")
    _put(store, rec.run_id, "b", "train.log", b"not a checkpoint")
    _put(store, rec.run_id, "b", "checkpoints/step-9.pt.x1.part", b"half")
    got = resuming.local_found(store, rec, resuming.globs_of(rec))
    assert sorted((f.source, f.host, f.checkpoint.name) for f in got) == [
        ("collected", "b", "checkpoints/step-6.pt"), ("mirror", "a", "checkpoints/step-4.pt")]
    assert [f.checkpoint.name for f in resuming.newest(got)] == ["checkpoints/step-6.pt"]
    four.write_bytes(b"FOUR")  # the end-of-run collect replaced the mirrored copy: a collected file now
    said: list[str] = []
    got = resuming.local_found(store, rec, resuming.globs_of(rec), said.append)
    assert ("mirror", "a") not in {(f.source, f.host) for f in got}
    assert ("collected", "a", "checkpoints/step-4.pt") in {(f.source, f.host, f.checkpoint.name) for f in got}
    store.write_mirror_index(rec.run_id, b"{damaged")
    resuming.local_found(store, rec, resuming.globs_of(rec), said.append)
    assert said and said[-1].startswith(f"resume: run {rec.run_id}'s mirror is not used: ")


def _unreachable(host):
    raise HostError(host.name, "cannot connect: no network in this test")


def test_a_run_that_left_no_checkpoint_is_refused_and_a_node_not_reached_is_said(tmp_path):
    store = RunStore(tmp_path / "runs")
    rec = store.create(make_record("20261206-100000-aaaa", ("a", "b"), status=DONE))
    _put(store, rec.run_id, "a", "train.log", b"not a checkpoint")
    said: list[str] = []
    with pytest.raises(UsageError) as e:
        resuming.find(store, rec, said.append, connect=_unreachable)
    assert e.value.exit_code == 2
    assert str(e.value).startswith(f"--resume {rec.run_id}: that run left no checkpoint: none in its mirror, "
                                   "among its collected files or on its nodes that answered")
    assert sorted(said) == [f"resume: {h} was not asked for its checkpoints: {h}: cannot connect: no network in "
                            "this test" for h in ("a", "b")]
    _put(store, rec.run_id, "b", "checkpoints/step-3.pt", b"three")  # collected: no node needed
    chosen = resuming.find(store, rec, said.append, connect=_unreachable)
    assert [(f.source, f.checkpoint.name) for f in chosen] == [("collected", "checkpoints/step-3.pt")]
    assert resuming.record_of(rec.run_id, chosen) == ResumedFrom(rec.run_id, ("checkpoints/step-3.pt",), 3, "collected")


@pytest.fixture
def runs(tmp_path):
    """A run store with runs of train.py and other.py, of two inventories, ended or running."""
    store = RunStore(tmp_path / "runs")
    for run_id, fields in [
        ("20261206-100000-aaaa", dict(status=DONE, script="train.py", schedule="nightly")),
        ("20261206-110000-bbbb", dict(status=RunStatus.FAILED, script="/home/me/train.py")),
        ("20261206-120000-cccc", dict(status=DONE, script="other.py")),
        ("20261206-130000-dddd", dict(status=DONE, script="train.py", inventory="/w/other.yaml")),
        ("20261206-140000-eeee", dict(status=RunStatus.RUNNING, script="train.py")),
        ("20261206-150000-ffff", dict(status=DONE, script="train.py", local=True, inventory="local")),
    ]:
        store.create(replace(make_record(run_id, inventory=INV), started_at=f"2026-12-06T{run_id[9:11]}:00:00+00:00",
                             **fields))
    return store


def _resolve(store: RunStore, given: str, script: str = "train.py", inventory: str = INV,
             schedule: str | None = None) -> RunRecord | None:
    return resuming.resolve(store, given, inventory=inventory, script=script, schedule=schedule)


@pytest.mark.parametrize("given, words", [
    ("zzzz", "no run matches 'zzzz'"),
    ("cccc", "--resume cccc: run 20261206-120000-cccc ran another script (other.py)"),
    ("dddd", "--resume dddd: run 20261206-130000-dddd ran with another inventory (/w/other.yaml)"),
    ("eeee", "--resume eeee: run 20261206-140000-eeee is still running (as of its record): its checkpoints still "
             "change; `clusterddp stop 20261206-140000-eeee` first"),
    ("ffff", "--resume ffff: run 20261206-150000-ffff ran with `up local`, in the launch folder"),
    ("previous", "--resume previous: means the previous run of a schedule, and this run is not a schedule's"),
])
def test_a_run_that_cannot_be_resumed_from_is_refused_with_exit_2(runs, given, words):
    with pytest.raises(UsageError) as e:
        _resolve(runs, given)
    assert e.value.exit_code == 2 and str(e.value).startswith(words), str(e.value)
    assert "hint:" in str(e.value)
    if given == "zzzz":
        assert isinstance(e.value, RunNotFound)


def test_a_run_is_named_by_its_id_its_end_last_or_previous(runs):
    assert _resolve(runs, "20261206-100000-aaaa").run_id == "20261206-100000-aaaa"
    assert _resolve(runs, "bbbb").run_id == "20261206-110000-bbbb"  # same file name, another folder
    assert _resolve(runs, "last").run_id == "20261206-110000-bbbb"  # not the running one, nor other scripts'
    assert _resolve(runs, "previous", schedule="nightly").run_id == "20261206-100000-aaaa"
    assert _resolve(runs, "previous", schedule="weekly") is None  # its first run: from scratch
    with pytest.raises(UsageError, match="--resume last: no earlier run of new.py with /w/inv.yaml"):
        _resolve(runs, "last", script="new.py")
    with pytest.raises(UsageError, match="`up local` runs in this folder"):
        _resolve(runs, "aaaa", inventory="local")


def test_resumed_from_round_trips_through_run_json_and_older_records_read_without_it(tmp_path):
    rec = make_record("20261206-100000-aaaa")
    assert "resumed_from" not in rec.to_json() and RunRecord.from_json(rec.to_json(), "x").resumed_from is None
    rec = replace(rec, resumed_from=ResumedFrom("20261205-090000-zzzz", ("snapshot.pt", "ckpt/"), 70, "node a"))
    data = json.loads(json.dumps(rec.to_json()))
    assert data["resumed_from"] == {"run": "20261205-090000-zzzz", "checkpoints": ["snapshot.pt", "ckpt/"],
                                    "step": 70, "source": "node a"}
    assert RunRecord.from_json(data, "x") == rec
    assert rec.resumed_from is not None and rec.resumed_from.describe() == (
        "resumed from run 20261205-090000-zzzz: snapshot.pt, ckpt/ (step 70; source: node a)")
    for field, value, why in [("step", -1, "resumed_from.step: must be >= 0"),
                              ("run", "../x", "resumed_from.run: must be a run id"),
                              ("checkpoints", [], "resumed_from.checkpoints: must be 1 to 64 paths")]:
        bad = json.loads(json.dumps(data))
        bad["resumed_from"][field] = value
        with pytest.raises(RecordError) as e:
            RunRecord.from_json(bad, "run.json")
        assert str(e.value).startswith(f"run.json: {why}"), str(e.value)
    store = RunStore(tmp_path)
    store.create(rec)
    assert [r["resumed_from"] for r in store.list()] == ["20261205-090000-zzzz"]  # `runs --json`


def test_the_note_names_the_newest_earlier_run_that_left_a_checkpoint_and_the_command(runs):
    assert resuming.hint(runs, inventory=INV, script="train.py", args=()) is None  # none left one here
    _put(runs, "20261206-110000-bbbb", "a", "checkpoints/step-5.pt", b"five")
    note = resuming.hint(
        runs,
        inventory=INV,
        script="job/train.py",
        args=("--epochs", "9 x"),
        runs_dir_flag=" --runs-dir r",
        before="20261206-160000-gggg",
        inventory_arg="inv.yaml",
    )
    assert note == ("[clusterddp] note: run 20261206-110000-bbbb of train.py left checkpoints/step-5.pt; this run has "
                    "a run folder of its own and starts without it. To carry on from it instead, start with the "
                    "same options and --resume: clusterddp up inv.yaml job/train.py --resume 20261206-110000-bbbb "
                    "--runs-dir r -- --epochs '9 x'")
    assert resuming.hint(runs, inventory=INV, script="other.py", args=()) is None
    assert resuming.hint(runs, inventory="/w/other.yaml", script="train.py", args=()) is None
    # the newest earlier run is the one looked at: a newer run that left none, no note
    runs.create(replace(make_record("20261206-153000-hhhh", inventory=INV), status=DONE, script="train.py",
                        started_at="2026-12-06T15:30:00+00:00"))
    assert resuming.hint(runs, inventory=INV, script="train.py", args=()) is None
    assert resuming.hint(runs, inventory=INV, script="train.py", args=(), before="20261206-153000-hhhh") is not None


class _Said:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.said: list[str] = []

    def say(self, line: str) -> None:
        self.said.append(line)

    def warn(self, line: str) -> None:
        self.lines.append(line)


def test_a_file_of_the_script_folder_where_the_checkpoint_goes_is_left_out_of_the_upload(tmp_path):
    folder = SourceFolder(tmp_path, (("train.py", 10), ("checkpoints/", 0), ("checkpoints/snapshot.pt", 99)))
    prep = ssh_launch.Prepared(plan=None, store=RunStore(tmp_path / "runs"), source_dir=tmp_path,  # type: ignore[arg-type]
                      folder=folder)
    said = _Said()
    out = ssh_launch._without(prep, {"checkpoints/snapshot.pt"}, "20261206-100000-aaaa", said)  # type: ignore[arg-type]
    assert out.folder is not None and out.folder.entries == (("train.py", 10), ("checkpoints/", 0))
    assert said.lines == ["upload: checkpoints/snapshot.pt left out: run 20261206-100000-aaaa's checkpoint takes "
                          "its place"]
    assert ssh_launch._without(prep, {"other.pt"}, "x", said) is prep and len(said.lines) == 1  # type: ignore[arg-type]


def _cli(tmp_path: Path, *words: str):
    (tmp_path / "t.py").write_text("print('hi')\n")
    (tmp_path / "inv.yaml").write_text("hosts: [{name: a, address: 10.0.0.1}, {name: b, address: 10.0.0.2}]\n")
    return CliRunner().invoke(app, [*words[:1], *(["inv.yaml", "t.py"] if words[:1] == ("up",) else []),
                                    *words[1:], "--runs-dir", str(tmp_path / "runs")])


def test_up_refuses_a_run_to_resume_from_before_anything_starts_and_dry_run_says_what_it_will_do(tmp_path,
                                                                                                monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = _cli(tmp_path, "up", "--resume", "nope", "--dry-run")
    assert r.exit_code == 2 and "no run matches 'nope'" in r.output, r.output
    store = RunStore(tmp_path / "runs")
    store.create(replace(make_record("20261206-100000-aaaa"), status=DONE, script="t.py",
                         inventory=os.path.realpath(tmp_path / "inv.yaml")))
    r = _cli(tmp_path, "up", "--resume", "aaaa", "--dry-run")
    assert r.exit_code == 0, r.output
    assert ("resume: the newest checkpoint run 20261206-100000-aaaa left is looked for as the run starts, and put "
            "on every node before its job starts") in r.output
    r = _cli(tmp_path, "up", "--resume", "previous", "--dry-run")
    assert r.exit_code == 2 and "--resume previous: means the previous run of a schedule" in r.output, r.output


def test_a_schedule_takes_only_resume_previous(tmp_path, monkeypatch):
    from clusterddp.schedule import crontab as crontab_mod
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setattr(crontab_mod, "read_crontab", lambda: "")
    monkeypatch.setattr(crontab_mod, "write_crontab", lambda text: None)
    r = _cli(tmp_path, "schedule", "add", "n", "inv.yaml", "t.py", "--cron", "@daily", "--resume", "aaaa")
    assert r.exit_code == 2, r.output
    assert "--resume aaaa: a schedule resumes from the run it started last" in r.output
    assert "give --resume previous" in r.output


@pytest.mark.parametrize("given", ["previous", "aaaa"])
def test_a_schedules_previous_run_that_left_no_checkpoint_starts_this_one_from_scratch(runs, given):
    from types import SimpleNamespace
    prep = ssh_launch.Prepared(plan=None, store=runs, source_dir=Path("."),  # type: ignore[arg-type]
                      resumes=runs.load("20261206-100000-aaaa"))  # the schedule's, with no checkpoint
    said = _Said()
    req = SimpleNamespace(resume=given)
    if given != "previous":  # asked by hand: refused
        with pytest.raises(UsageError, match="that run left no checkpoint"):
            ssh_launch.resume_found(prep, req, said, connect=_unreachable)  # type: ignore[arg-type]
        return
    out, chosen = ssh_launch.resume_found(prep, req, said, connect=_unreachable)  # type: ignore[arg-type]
    assert chosen is None and out.resumes is None
    assert said.lines[-1].startswith("[clusterddp] --resume 20261206-100000-aaaa: that run left no checkpoint")
    assert said.lines[-1].endswith("; this run starts from scratch")


class _Node:
    """A node's end of the seam (:class:`clusterddp.transport.Transport`'s ``run``): takes every seed
    command, or refuses them (``fails``) as a full disk would."""

    def __init__(self, fails: bool) -> None:
        self.fails, self.ran = fails, []

    def run(self, command: str, stdin=None, timeout=None):
        from clusterddp.transport import CommandResult
        self.ran.append((command, stdin))
        return CommandResult(3 if self.fails else 0, b"", b"cat: write error: No space left on device\n")

    def close(self) -> None:
        pass


def test_a_node_that_does_not_take_the_checkpoint_ends_the_run_recorded_failed(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from clusterddp.fleet import Fleet
    from clusterddp.record import NodeState
    from clusterddp.runspec import RunSpec
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("print('hi')\n")
    (tmp_path / "inv.yaml").write_text("hosts: [{name: a, address: 10.0.0.1}, {name: b, address: 10.0.0.2}]\n")
    prep = ssh_launch.prepare("inv.yaml", resolved(RunSpec("t.py"), "inv.yaml"), str(tmp_path / "runs"))
    old = prep.store.create(replace(make_record("20261206-100000-aaaa"), status=DONE))
    _put(prep.store, old.run_id, "a", "checkpoints/step-3.pt", b"three")
    chosen = resuming.find(prep.store, old, connect=_unreachable)
    prep = replace(prep, resumes=old)
    prep.store.create(ssh_launch.new_record(prep, "inv.yaml", resumed_from=resuming.record_of(old.run_id, chosen)))
    nodes = {"a": _Node(False), "b": _Node(True)}
    fleet = Fleet([n.host for n in prep.plan.nodes], connect=lambda h: nodes[h.name])
    said = _Said()
    with pytest.raises(HostError) as e:
        ssh_launch._resume(prep, SimpleNamespace(resume=old.run_id), said, chosen, fleet, None)  # type: ignore[arg-type]
    assert str(e.value) == "b: cannot put the checkpoint checkpoints/step-3.pt there: cat: write error: No space " \
                           "left on device"
    rec = prep.store.load(prep.plan.run_id)
    assert rec.status is RunStatus.FAILED and rec.failed_host == "b" and rec.ended_at
    assert rec.node("b").state is NodeState.FAILED and "No space left" in (rec.node("b").error or "")
    assert rec.resumed_from == ResumedFrom(old.run_id, ("checkpoints/step-3.pt",), 3, "collected")
    (command, stdin), = nodes["a"].ran
    assert hashlib.sha256(b"three").hexdigest() in command and stdin == prep.store.artifact_path(
        old.run_id, "a", "checkpoints/step-3.pt")
    nodes["b"].fails = False
    fleet = Fleet([n.host for n in prep.plan.nodes], connect=lambda h: nodes[h.name])
    ssh_launch._resume(prep, SimpleNamespace(resume=old.run_id), said, chosen, fleet, None)  # type: ignore[arg-type]
    assert len(nodes["a"].ran) == 2 and len(nodes["b"].ran) == 2  # every node, not only rank 0's
    assert said.lines == [] and said.said == [
        f"[clusterddp] resuming from run {old.run_id}: checkpoints/step-3.pt (5 B, from its collected files), put on "
        "a, b at the same path in the run folder (sha256 checked there)"]


def test_a_link_or_a_name_in_the_control_folder_among_the_collected_files_is_passed_over(tmp_path):
    store = RunStore(tmp_path / "runs")
    rec = store.create(make_record("20261206-100000-aaaa", ("a",), status=DONE, collect=(".clusterddp/**",)))
    _put(store, rec.run_id, "a", ".clusterddp/a/step-9.pt", b"the run's own folder: never sent to a node")
    _put(store, rec.run_id, "a", "checkpoints/step-2.pt", b"two")
    os.symlink("/etc/passwd", store.artifact_path(rec.run_id, "a", "checkpoints/step-8.pt"))
    got = resuming.local_found(store, rec, resuming.globs_of(rec))
    assert [f.checkpoint.name for f in got] == ["checkpoints/step-2.pt"]
