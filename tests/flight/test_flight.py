"""torch's flight recorder on a failed run (clusterddp.flight, clusterddp/node/flight.py): launch.sh's env
lines and their precedence, reading real torch 2.13 dumps (and refusing what is not data), where each rank
stands, the record's ``failure.flight``, and one real `up local` run (gloo: torch 2.13 records its flight
recorder for gloo too but never dumps it on a timeout, so the job writes torch's own dump where
launch.sh pointed NCCL's; bench/gpu_check.sh checks NCCL's own dump on a GPU machine)."""

from __future__ import annotations

import json
import os
import pickle
import stat
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from clusterddp import failure as failures
from clusterddp import flight
from clusterddp.errors import RecordError
from clusterddp.node import flight as node_flight
from clusterddp.node.reply import ReplyError
from clusterddp.record import RunRecord
from clusterddp.runspec import RunSpec
from helpers import REPO, cddp, make_record, record, resolved, run_id_of

FIXTURES = REPO / "tests" / "fixtures" / "flight"


def fixture_dumps(host: str = "node-1") -> list[tuple[str, int, bytes | None, str]]:
    return [(host, r, (FIXTURES / f"rank{r}").read_bytes(), "") for r in (0, 1)]


# ---- launch.sh's lines ----

def run_lines(tmp_path: Path, exports: str = "") -> dict[str, str]:
    ctl = tmp_path / "ctl"
    ctl.mkdir(exist_ok=True)
    script = "\n".join([f"CTL={ctl}", exports, *flight.env_lines(),
                        'printf "%s\\n" "$TORCH_FR_BUFFER_SIZE" "$TORCH_NCCL_DUMP_ON_TIMEOUT" '
                        '"$TORCH_FR_DUMP_TEMP_FILE" "${TORCH_NCCL_TRACE_BUFFER_SIZE-unset}" '
                        '"${TORCH_NCCL_DEBUG_INFO_TEMP_FILE-unset}"'])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_NCCL_", "TORCH_FR_"))}
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=60, check=True)
    size, dump, temp, old_size, old_temp = out.stdout.split("\n")[:5]
    return {"size": size, "dump": dump, "temp": temp, "old": old_size + " " + old_temp}


def test_launch_lines_turn_the_dump_on_into_the_private_control_folder(tmp_path):
    got = run_lines(tmp_path)
    # torch's newer names only: torch 2.13 warns on every rank that the older ones are deprecated
    assert got == {"size": "2000", "dump": "1", "temp": f"{tmp_path}/ctl/flight/rank", "old": "unset unset"}
    assert stat.S_IMODE((tmp_path / "ctl" / "flight").stat().st_mode) == 0o700


def test_a_users_own_values_win_even_empty_and_the_newer_buffer_name(tmp_path):
    got = run_lines(tmp_path, "export TORCH_NCCL_DUMP_ON_TIMEOUT=0 TORCH_NCCL_DEBUG_INFO_TEMP_FILE= "
                              "TORCH_FR_BUFFER_SIZE=50")
    assert got == {"size": "50", "dump": "0", "temp": "", "old": "unset "}
    assert run_lines(tmp_path, "export TORCH_NCCL_TRACE_BUFFER_SIZE=7")["size"] == "7"
    assert run_lines(tmp_path, "export TORCH_FR_DUMP_TEMP_FILE=/data/fr_")["temp"] == "/data/fr_"


def test_launch_sh_has_the_lines_after_the_users_env(tmp_path):
    from clusterddp import inventory
    from clusterddp import plan as ssh_plan
    inv = inventory.parse("defaults: {env: {TORCH_NCCL_DUMP_ON_TIMEOUT: '0'}}\nhosts: [{name: a, address: 10.0.0.1}]\n",
                          "inv.yaml")
    text = ssh_plan.build_plan(inv, resolved(RunSpec("train.py"), inv), "r1").nodes[0].launch_script
    assert text.index("export TORCH_NCCL_DUMP_ON_TIMEOUT=0") < text.index(flight.ENV_LINES[1]) < text.index(
        "torch.distributed.run")


# ---- one dump ----

def test_real_torch_dumps_read_as_their_entries():
    d0, d1 = (flight.parse_dump((FIXTURES / f"rank{r}").read_bytes()) for r in (0, 1))
    assert isinstance(d0, flight.Dump) and isinstance(d1, flight.Dump), (d0, d1)
    assert [(e.op, e.seq, e.group) for e in d0.entries] == [("gloo:all_reduce", n, "0 (default_pg)")
                                                            for n in (1, 2, 3, 4)]
    assert len(d1.entries) == 3 and d1.entries[-1].where == "skip.py:13 step" and d0.version == "2.10"
    assert ("?", (0, 1)) in d0.members  # gloo's pg_config names no group


def test_the_json_form_reads_too():
    value = flight._unpickle((FIXTURES / "rank0").read_bytes())
    got = flight.parse_dump(json.dumps(value).encode())
    assert isinstance(got, flight.Dump) and got.entries[-1].seq == 4


class Boom:
    def __reduce__(self):
        return (os.system, ("touch BOOM",))


@pytest.mark.parametrize("data", [
    pickle.dumps(Boom(), protocol=2), pickle.dumps({"entries": [Boom()]}, protocol=4),
    b"cos\nsystem\n(S'touch BOOM'\ntR.", pickle.dumps(bytearray(b"x"), protocol=5),
    b"\x80\x02}r\x00\x00\x00\x02.",            # LONG_BINPUT 2**25: the C unpickler would size its memo so (512 MiB)
    (FIXTURES / "rank0").read_bytes()[:700],   # cut short, as by a rank killed while writing
    b"", b"\x00" * 100, b"{not json", b'{"entries": 5}'])
def test_what_is_not_a_dump_of_data_is_refused_and_nothing_in_it_runs(data, tmp_path, monkeypatch):
    import tracemalloc
    monkeypatch.chdir(tmp_path)
    t0 = time.process_time()
    tracemalloc.start()
    try:
        got = flight.parse_dump(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(got, str) and got, got
    assert not (tmp_path / "BOOM").exists() and time.process_time() - t0 < 1.0 and peak < 16 << 20, peak


def test_a_dump_over_the_bound_is_not_read():
    assert "over" in flight.parse_dump(b"\x80" * (flight.MOST_BYTES + 1))


# ---- where each rank stands ----

def test_the_rank_that_skipped_the_collective_is_named_behind():
    f = flight.read(fixture_dumps())
    assert f is not None and f.behind == (1,)
    assert f.summary == ("rank 1 (node-1) never entered gloo:all_reduce #4 of group 0 (default_pg), where rank 0 "
                         "(node-1) waits (rank 1's last: gloo:all_reduce #3, scheduled)")
    assert [(e.rank, e.op, e.seq, e.state) for e in f.ranks] == [(0, "gloo:all_reduce", 4, "scheduled"),
                                                                (1, "gloo:all_reduce", 3, "scheduled")]


def entry(record, seq, state="completed", op="nccl:all_reduce", pg=("0", "default_pg")):
    return {"record_id": record, "collective_seq_id": seq, "p2p_seq_id": 0, "is_p2p": False, "state": state,
            "profiling_name": op, "process_group": pg, "frames": [{"name": "step", "filename": "/w/train.py",
                                                                   "line": 41}]}


def dump(*entries, ranks="[0, 1, 2]"):
    return pickle.dumps({"version": "2.10", "entries": list(entries),
                         "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": ranks}}})


def test_all_completed_none_waits_and_all_waiting_in_one_none_behind_and_a_missing_rank_is_a_note():
    done = flight.read([("a", r, dump(entry(0, 1), entry(1, 2)), "") for r in (0, 1, 2)])
    assert done is not None and done.behind == () and done.summary.startswith("no rank waits")
    same = flight.read([("a", 0, dump(entry(0, 5, "started")), ""), ("b", 1, dump(entry(0, 5, "scheduled")), "")])
    assert same is not None and same.behind == ()
    assert same.summary.startswith("ranks 0-1 (a, b) wait in nccl:all_reduce #5 of group 0 (default_pg)")
    assert same.notes == ("group 0 (default_pg): no dump from rank 2 (a node that did not answer, or a rank "
                          "that did not write one)",)
    assert "rank 1 (b): last entered nccl:all_reduce #5 of group 0 (default_pg), scheduled, at train.py:41 step" \
        in "\n".join(same.lines())


def test_a_damaged_or_missing_dump_is_a_note_and_the_others_still_read():
    f = flight.read([*fixture_dumps(), ("node-2", 2, b"garbage", ""), ("node-2", 3, None, "over 1 bytes: not sent"),
                     ("node-2", 4, None, "a\nfake line" + "x" * 5000)])
    assert f is not None and f.behind == (1,)
    assert f.notes[0].startswith("rank 2 (node-2): its dump is not read: not a flight recorder dump")
    assert f.notes[1] == "rank 3 (node-2): its dump is not read: over 1 bytes: not sent"
    assert f.notes[2].startswith("rank 4 (node-2): its dump is not read: a\\nfake linexxx") and len(f.notes[2]) < 600
    assert flight.Flight.from_json(f.to_json()) == f
    assert flight.read([]) is None
    alone = flight.read([fixture_dumps()[0]], world=4)  # gloo names no group: the run's size says who is missing
    assert alone is not None and alone.notes == ("group 0 (default_pg): no dump from ranks 1-3 (a node that did not "
                                                 "answer, or a rank that did not write one)",)


# ---- run.json ----

def test_the_flight_round_trips_through_run_json_and_a_damaged_one_is_refused_naming_the_field():
    fl = flight.read(fixture_dumps())
    fail = failures.Failure("node-1", "exception", "RuntimeError: timed out", rank=0, flight=fl)
    rec = make_record("r1", failure=fail)
    again = RunRecord.from_json(json.loads(json.dumps(rec.to_json())), "run.json")
    assert again.failure == fail and "  flight recorder: rank 1 (node-1) never entered" in "\n".join(fail.lines())
    data = rec.to_json()
    data["failure"]["flight"]["ranks"][0]["seq"] = -1
    with pytest.raises(RecordError, match=r"failure\.flight.*ranks\[0\]\.seq"):
        RunRecord.from_json(data, "run.json")
    assert RunRecord.from_json(make_record("r2", failure=replace(fail, flight=None)).to_json(), "p").failure.flight \
        is None


# ---- the node program and its answer ----

def test_node_program_sends_rank_files_only_regular_ones_bounded(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "flight"
    folder.mkdir()
    (folder / "rank0").write_bytes((FIXTURES / "rank0").read_bytes())
    (folder / "rank1").symlink_to(FIXTURES / "rank1")   # a link is not followed
    os.mkfifo(folder / "rank2")                          # nor a pipe read (it would block)
    (folder / "rank3").write_bytes(b"x" * 20)
    (folder / "notes.txt").write_text("ignored")
    monkeypatch.setattr(node_flight, "MOST_BYTES", 10)
    assert node_flight.main([str(tmp_path)]) == 0
    monkeypatch.setattr(node_flight, "MOST_BYTES", flight.MOST_BYTES)
    got = flight.parse_reply(b"Welcome\n" + capsys.readouterr().out.encode())
    assert [(r, d is not None) for r, d, _ in got] == [(0, False), (1, False), (2, False), (3, False)]
    assert "over 10 bytes" in got[0][2] and got[1][2].startswith("cannot open") and got[2][2] == "not a regular file"
    assert node_flight.main([str(tmp_path)]) == 0
    got = flight.parse_reply(capsys.readouterr().out.encode())
    assert got[0] == (0, (FIXTURES / "rank0").read_bytes(), "") and got[3] == (3, b"x" * 20, "")
    assert node_flight.main([str(tmp_path / "nothing")]) == 0 and flight.parse_reply(
        capsys.readouterr().out.encode()) == []


@pytest.mark.parametrize("line", [
    b"", b"CLUSTERDDP_FLIGHT []", b'CLUSTERDDP_FLIGHT {"dumps": [{"rank": -1, "data": null, "note": ""}]}',
    b'CLUSTERDDP_FLIGHT {"dumps": [{"rank": 0, "data": "!!", "note": ""}]}',
    b'CLUSTERDDP_FLIGHT {"dumps": [{"rank": true, "data": null, "note": ""}]}'])
def test_an_answer_that_is_not_the_programs_is_a_reply_error(line):
    with pytest.raises(ReplyError):
        flight.parse_reply(line + b"\n")


def test_a_compressed_bomb_is_refused_without_inflating_it():
    import base64
    import tracemalloc
    import zlib
    bomb = base64.b64encode(zlib.compress(b"\0" * (256 << 20), 1))  # 256 MiB in 1 MiB
    tracemalloc.start()
    try:
        with pytest.raises(ReplyError, match="over"):
            flight.parse_reply(b'CLUSTERDDP_FLIGHT {"dumps": [{"rank": 0, "data": "' + bomb + b'", "note": ""}]}\n')
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * flight.MOST_BYTES, peak


# ---- a real run ----

# The job says its env in one os.write: with PYTHONUNBUFFERED, print's pieces go out one by one, and two
# ranks' interleave.
JOB = '''import datetime, os, time
import torch, torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
r, x = dist.get_rank(), torch.ones(4)
prefix = os.environ["TORCH_FR_DUMP_TEMP_FILE"]
os.write(1, ("env %s %s\\n" % (os.environ["TORCH_FR_BUFFER_SIZE"], os.environ["TORCH_NCCL_DUMP_ON_TIMEOUT"])).encode())
def dump():  # what NCCL's watchdog writes on a timeout, by torch's own writer
    with open(prefix + str(r), "wb") as f:
        f.write(_dump_fr_trace())
def step():
    dist.all_reduce(x)
for _ in range(3):
    step()
if r == 1:  # takes another branch: skips the 4th all_reduce, and waits to be stopped
    dump()
    while True:
        time.sleep(1)
deadline = time.time() + 120
while not os.path.exists(prefix + "1") and time.time() < deadline:
    time.sleep(0.05)
try:
    step()
finally:
    dump()
'''


def test_up_local_names_the_rank_that_skipped_a_collective_from_the_flight_recorder(tmp_path):
    (tmp_path / "skip.py").write_text(JOB)
    r = cddp("up", "local", "skip.py", "--gpus", "2", "--runs-dir", "runs", "-e", "TORCH_NCCL_DUMP_ON_TIMEOUT=7",
             cwd=tmp_path, check_rc=1)
    assert "env 2000 7" in r.stdout + r.stderr  # launch.sh's buffer size; the user's -e wins
    assert ("  flight recorder: rank 1 (local) never entered gloo:all_reduce #4 of group 0 (default_pg), where "
            "rank 0 (local) waits (rank 1's last: gloo:all_reduce #3, scheduled)") in r.stderr, r.stderr
    assert "    rank 0 (local): last entered gloo:all_reduce #4 of group 0 (default_pg), scheduled, at skip.py:12 " \
           "step" in r.stderr
    run_id = run_id_of(r.stdout)
    fl = record(tmp_path / "runs", run_id)["failure"]["flight"]
    assert fl["behind"] == [1] and [(e["rank"], e["seq"]) for e in fl["ranks"]] == [(0, 4), (1, 3)], fl
    for rank in (0, 1):
        kept = tmp_path / "runs" / run_id / "flight" / "local" / f"rank{rank}"
        assert stat.S_IMODE(kept.stat().st_mode) == 0o600 and isinstance(flight.parse_dump(kept.read_bytes()),
                                                                         flight.Dump)
    node_folder = tmp_path / "runs" / run_id / "node" / "flight"
    assert stat.S_IMODE(node_folder.stat().st_mode) == 0o700
    s = cddp("status", run_id, "--runs-dir", "runs", cwd=tmp_path)
    assert "flight recorder: rank 1 (local) never entered" in s.stdout + s.stderr
