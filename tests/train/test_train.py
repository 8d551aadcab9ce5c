"""Tests for clusterddp.train and the examples, in-process and under a real 2-process torchrun (gloo, CPU).

Every child process (torchrun, its workers, the examples) runs with GPUs hidden and numpy
unimportable: torch's wheels do not depend on numpy, so a fresh ``pip install torch`` has
none, and the helpers and examples must work there (``*_object`` collectives do not).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset

import clusterddp.train as train

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLES = ROOT / "examples"
TORCHRUN_ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                     "MASTER_PORT", "GROUP_RANK", "TORCHELASTIC_RUN_ID")


# numpy absent even where it is installed, so these tests mean the same on every machine. A None
# in sys.modules is the import system's own "not there": `import numpy` (and numpy.*) raises
# ModuleNotFoundError and importlib.util.find_spec gives None, which torch._dynamo relies on (a
# finder that raises breaks that probe, which a really missing numpy never does).
NO_NUMPY_SITECUSTOMIZE = """
import atexit
import os
import sys

sys.modules["numpy"] = None
TRACE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "trace")


def trace():
    # One file per process that exits normally: whether numpy stayed out to the end, and argv.
    os.makedirs(TRACE, exist_ok=True)
    hidden = "numpy" in sys.modules and sys.modules["numpy"] is None
    # Written then renamed: a process killed meanwhile (a restart's first attempt) leaves only a
    # .tmp file, never a half-written entry.
    path = os.path.join(TRACE, f"{os.getpid()}-{os.urandom(4).hex()}")
    with open(path + ".tmp", "w") as f:
        f.write("\\0".join([str(hidden), *sys.argv]))
    os.replace(path + ".tmp", path)


atexit.register(trace)
"""


def _no_numpy_site(cwd: Path) -> Path:
    site = cwd / ".no-numpy"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(NO_NUMPY_SITECUSTOMIZE)
    return site


def _numpy_hidden_at_exit(cwd: Path, script: str) -> list[bool]:
    """Per ``script`` process started in ``cwd`` that exited normally: numpy stayed hidden."""
    trace = cwd / ".no-numpy" / "trace"
    files = [f for f in trace.iterdir() if not f.name.endswith(".tmp")] if trace.is_dir() else []
    entries = [f.read_text().split("\0") for f in files]
    return [hidden == "True" for hidden, argv0, *_ in entries if argv0.endswith(script)]


def _env(site: Path) -> dict[str, str]:
    """Environment for child processes: 1 thread each (2-core CI box), package importable,
    CPU only, numpy hidden by ``site``'s sitecustomize."""
    # Without TORCH_DISABLE_SHARE_RDZV_TCP_STORE the restart test exercises ct.init's own fix.
    env = {k: v for k, v in os.environ.items()
           if k not in TORCHRUN_ENV_VARS and k != "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"}
    env["OMP_NUM_THREADS"] = "1"
    # These tests mean gloo on CPU; on a GPU machine ct.init would pick nccl and cuda devices.
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), str(ROOT), env.get("PYTHONPATH")]))
    return env


def _run(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    # Own session, so a hung run is killed with all its workers, not just the torchrun agent.
    with subprocess.Popen(args, cwd=cwd, env=_env(_no_numpy_site(cwd)), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True) as proc:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            pytest.fail(f"timed out after {timeout}s: {args}\n{out}")
    return subprocess.CompletedProcess(args, proc.returncode, out)


def _torchrun(script: Path, *args: str, cwd: Path, extra: tuple[str, ...] = (),
              timeout: float = 180) -> subprocess.CompletedProcess[str]:
    # --standalone picks a free rendezvous port, so runs never collide.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           *extra, str(script), *args]
    return _run(cmd, cwd, timeout)


@pytest.fixture
def solo(monkeypatch: pytest.MonkeyPatch):
    """A clean non-torchrun world: no torchrun env vars, no cached context, no group left over."""
    for name in TORCHRUN_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    train.cleanup()
    yield
    train.cleanup()


def _load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------- world of one


def test_init_outside_torchrun_is_world_of_one(solo, capsys) -> None:
    ctx = train.init()
    assert (ctx.rank, ctx.world_size, ctx.local_rank, ctx.distributed, ctx.is_main) == (0, 1, 0, False, True)
    assert ctx.backend is None
    assert ctx.device == (torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu"))
    assert not dist.is_initialized()
    assert train.init() is ctx  # cached
    with pytest.raises(AttributeError):
        ctx.rank = 1  # type: ignore[misc]  # frozen
    model = torch.nn.Linear(2, 2)
    assert train.wrap(model) is model
    train.print0("hello", 1)
    train.print0("a", "b", sep="-", end="!")
    assert capsys.readouterr().out == "hello 1\na-b!"
    train.cleanup()
    train.cleanup()  # idempotent


def test_print0_is_silent_on_other_ranks(solo, monkeypatch, capsys) -> None:
    monkeypatch.setenv("RANK", "1")  # before init, print0 reads RANK rather than initialising
    train.print0("nope")
    assert capsys.readouterr().out == ""


def test_loader_reshuffles_per_epoch_and_replays_after_resume(solo) -> None:
    data = TensorDataset(torch.arange(20))
    loader = train.make_loader(data, batch_size=4)
    assert len(loader) == 5

    def order() -> list[int]:
        return [int(v) for (batch,) in loader for v in batch]

    plain = [order() for _ in range(3)]  # no set_epoch at all: epochs 0, 1, 2
    assert all(sorted(o) == list(range(20)) for o in plain)
    assert plain[0] != plain[1] != plain[2]
    resumed = train.make_loader(data, batch_size=4)  # a restarted job resuming at epoch 1
    assert [e for e in resumed.epochs(1, 3)] == [1, 2]
    replay = []
    for _ in resumed.epochs(1, 3):
        replay.append([int(v) for (batch,) in resumed for v in batch])
    assert replay == plain[1:]
    loader.set_epoch(0)
    assert order() == plain[0]
    assert loader.epoch == 0


# ----------------------------------------------------------------------------- checkpoints


def test_save_and_load_round_trip(solo, tmp_path) -> None:
    assert train.load_latest(tmp_path / "none") is None
    for step in (1, 2):
        path = train.save_checkpoint({"w": torch.full((3,), float(step)), "step": step}, step, tmp_path)
        assert path == tmp_path / f"step-{step}.pt"
    obj, step = train.load_latest(tmp_path)
    assert step == 2 and torch.equal(obj["w"].cpu(), torch.full((3,), 2.0))
    assert obj["w"].device == train.context().device  # map_location's default (a GPU where there is one)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-1.pt", "step-2.pt"]
    assert (tmp_path / "step-2.pt").stat().st_mode & 0o777 != 0o600  # not mkstemp's private mode


def test_an_inventory_run_that_starts_over_where_an_earlier_one_left_checkpoints_says_so(solo, tmp_path, monkeypatch,
                                                                                         capsys) -> None:
    """Issue 24: each inventory run has a folder of its own, so a relative checkpoint folder is new each
    time and the same command starts over, where `up local` carries on: rank 0 says so, with the
    newest earlier run's folder that holds some and what to add to the command to carry on."""
    runs = tmp_path / "work" / "runs"

    def run(run_id: str, script: str = "train.py", step: int | None = None) -> Path:
        (runs / run_id / ".clusterddp").mkdir(parents=True)
        (runs / run_id / script).write_text("# the script\n")
        if step is not None:
            train.save_checkpoint({"step": step}, step, runs / run_id / "checkpoints")
        return runs / run_id
    run("20261201-090000-aaaa", step=1)
    run("20261201-100000-bbbb", step=3)                     # the newest earlier run of train.py that saved
    run("20261201-103000-cccc", script="other.py", step=9)  # another script's
    run("20261201-104000-dddd")                             # an earlier run of train.py that saved nothing
    here = run("20261201-110000-eeee")                      # this run
    run("20261201-120000-ffff", step=99)                    # a later run (started after this one)
    monkeypatch.chdir(here)
    monkeypatch.setenv("CLUSTERDDP_RUN_ID", here.name)
    monkeypatch.setattr(sys, "argv", [str(here / "train.py"), "--local_rank=0", "--epochs", "3"])
    earlier = runs / "20261201-100000-bbbb" / "checkpoints"
    assert train.load_latest("checkpoints", option="--checkpoint-dir") is None  # it starts from scratch, as before
    assert capsys.readouterr().err == (
        f"no checkpoint in checkpoints ({here / 'checkpoints'}): this run starts from scratch. Each run of an "
        "inventory has a folder of its own, and an earlier run of train.py on this host (20261201-100000-bbbb) "
        f"left step-3.pt in {earlier}: to carry on from it, run the same `clusterddp up` command with the "
        f"script's arguments (after `--`): --epochs 3 --checkpoint-dir {earlier}\n")
    # the folder given among the arguments is swapped for the earlier one; without an option name, said so
    monkeypatch.setattr(sys, "argv", ["train.py", "--ckpt=checkpoints"])
    train.load_latest("checkpoints", option="--ckpt")
    assert capsys.readouterr().err.endswith(f"(after `--`): --ckpt={earlier}\n")
    train.load_latest("checkpoints")
    assert capsys.readouterr().err.endswith(f"command with {earlier} as the script's checkpoint folder\n")
    # once this run has its own, nothing more is said but where it resumed from
    train.save_checkpoint({"step": 4}, 4, "checkpoints")
    assert train.load_latest("checkpoints") == ({"step": 4}, 4)
    assert "earlier run" not in capsys.readouterr().err
    # an absolute folder, a folder no run used, `up local` (not in a run folder): nothing said
    assert train.load_latest(here / "nothing") is None and train.load_latest("fresh") is None
    monkeypatch.chdir(tmp_path)
    assert train.load_latest("checkpoints") is None
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("fail_in", ["torch.save", "os.replace"])
def test_failed_save_keeps_previous_checkpoint(solo, tmp_path, monkeypatch, fail_in) -> None:
    train.save_checkpoint({"v": 1}, 1, tmp_path)
    real_save = torch.save

    def partial_save(obj, f, *a, **kw):  # half a file reaches the disk, then the "crash"
        buf = __import__("io").BytesIO()
        real_save(obj, buf)
        f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
        raise OSError("disk full")

    def failing_replace(src, dst):
        raise OSError("crash before rename")

    if fail_in == "torch.save":
        monkeypatch.setattr(torch, "save", partial_save)
    else:
        monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError):
        train.save_checkpoint({"v": 2}, 2, tmp_path)
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["step-1.pt"]  # no step-2.pt, temp removed
    assert train.load_latest(tmp_path) == ({"v": 1}, 1)


def test_hard_crash_mid_save_leaves_only_a_temp_file(solo, tmp_path) -> None:
    # os._exit in place of os.replace: like SIGKILL after the data is written, no cleanup runs.
    script = tmp_path / "crash.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        import clusterddp.train as ct
        ct.save_checkpoint({"v": 1}, 1, sys.argv[1])
        os.replace = lambda *a: os._exit(9)
        ct.save_checkpoint({"v": 2}, 2, sys.argv[1])
    """))
    ckpt = tmp_path / "ck"
    proc = _run([sys.executable, str(script), str(ckpt)], tmp_path, timeout=60)
    assert proc.returncode == 9, proc.stdout
    names = sorted(p.name for p in ckpt.iterdir())
    assert names[1] == "step-1.pt" and names[0].startswith(".step-2.") and names[0].endswith(".tmp")
    assert train.load_latest(ckpt) == ({"v": 1}, 1)
    train.save_checkpoint({"v": 3}, 3, ckpt)  # the next save sweeps the leftover temp file
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-1.pt", "step-3.pt"]


def test_only_step_int_pt_names_count(solo, tmp_path) -> None:
    torch.save({"v": 1}, tmp_path / "step-1.pt")
    for stray in ("step-9.pt.tmp", ".step-8.123.ab.tmp", "step-x.pt", "step-7.pt.bak", "step--6.pt",
                  "xstep-5.pt"):
        torch.save({"v": "stray"}, tmp_path / stray)
    assert train.load_latest(tmp_path) == ({"v": 1}, 1)


def test_corrupt_newest_checkpoint_is_skipped(solo, tmp_path) -> None:
    train.save_checkpoint({"v": 1}, 1, tmp_path, keep=None)
    train.save_checkpoint({"v": 2}, 2, tmp_path, keep=None)
    data = (tmp_path / "step-2.pt").read_bytes()
    (tmp_path / "step-2.pt").write_bytes(data[: len(data) // 2])  # truncated
    (tmp_path / "step-3.pt").write_bytes(b"")  # empty
    (tmp_path / "step-4.pt").write_bytes(b"garbage" * 10)
    # A flipped byte inside the pickle of a well-formed zip: torch.load reports it as a
    # weights_only refusal, only the zip CRC tells it apart from a real one.
    flipped = bytearray((tmp_path / "step-1.pt").read_bytes())
    flipped[flipped.index(b"\x80\x02") + 2] ^= 0xFF
    (tmp_path / "step-5.pt").write_bytes(bytes(flipped))
    with pytest.raises(pickle.UnpicklingError):  # the refusal that the CRC check must tell apart
        torch.load(tmp_path / "step-5.pt")
    assert train.load_latest(tmp_path) == ({"v": 1}, 1)


def test_weights_only_refusal_is_not_mistaken_for_corruption(solo, tmp_path) -> None:
    train.save_checkpoint({"v": 1}, 1, tmp_path)
    train.save_checkpoint({"args": argparse.Namespace(lr=0.1)}, 2, tmp_path)
    # torch's default weights_only=True refuses Namespace: raise, don't silently resume from step 1.
    with pytest.raises(pickle.UnpicklingError):
        train.load_latest(tmp_path)
    obj, step = train.load_latest(tmp_path, weights_only=False)
    assert step == 2 and obj["args"].lr == 0.1


def test_keep_prunes_by_step_number_not_mtime(solo, tmp_path) -> None:
    for step in (100, 20, 3):
        torch.save({"v": step}, tmp_path / f"step-{step}.pt")
    # Make mtimes run opposite to steps: step-3 newest on disk, step-100 oldest.
    for age, step in enumerate((3, 20, 100)):
        os.utime(tmp_path / f"step-{step}.pt", (1_000_000 - age * 1000,) * 2)
    train.save_checkpoint({"v": 50}, 50, tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-100.pt", "step-50.pt"]
    train.save_checkpoint({"v": 1}, 1, tmp_path, keep=None)
    assert len(list(tmp_path.iterdir())) == 3
    with pytest.raises(ValueError):
        train.save_checkpoint({}, 5, tmp_path, keep=0)


# ----------------------------------------------------------------------------- real torchrun

WORKER = """
import json, sys
from pathlib import Path
import torch
import clusterddp.train as ct
from torch.utils.data import TensorDataset

base = Path(sys.argv[1])
try:  # the test's sitecustomize hides numpy (torch's import already tried it)
    import numpy
    refused = None
except ImportError as e:
    refused = str(e)
hidden_by_test = "numpy" in sys.modules and sys.modules["numpy"] is None
ctx = ct.init()
assert ct.init() is ctx
out = {"numpy_refused": refused, "numpy_hidden_by_test": hidden_by_test,
       "rank": ctx.rank, "world_size": ctx.world_size, "local_rank": ctx.local_rank,
       "backend": ctx.backend, "distributed": ctx.distributed, "is_main": ctx.is_main,
       "wrapped": type(ct.wrap(torch.nn.Linear(2, 2))).__name__}

# Each case dir has rank0/ and rank1/: like two nodes with their own local disks.
def load(case):
    found = ct.load_latest(base / case / f"rank{ctx.rank}")
    return None if found is None else [found[0]["who"], found[1]]
for case in ("agree", "missing", "corrupt", "empty", "stale"):
    out[case] = load(case)

shared = base / "shared"
path = ct.save_checkpoint({"who": "saved"}, 7, shared)
out["saved_path"] = None if path is None else path.name
out["visible_after_barrier"] = (shared / "step-7.pt").exists()  # the barrier ordered it

loader = ct.make_loader(TensorDataset(torch.arange(10)), batch_size=2)
out["shard"] = [int(v) for (b,) in loader for v in b]
# One file per rank: both ranks share torchrun's stdout, where lines can interleave.
(base / f"result-{ctx.rank}.json").write_text(json.dumps(out))

# A trained DDP model, dropped before cleanup as examples/ddp_train.py does: the group must go
# with cleanup, and gloo's threads with it, not live on into interpreter exit.
import os, warnings
model = ct.wrap(torch.nn.Linear(2, 1))
model(torch.ones(4, 2)).sum().backward()  # DDP's all-reduces run from backward
del model
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    ct.cleanup(barrier=True)  # every rank ends here (see examples/ddp_train.py)
threads = sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
(base / f"exit-{ctx.rank}.json").write_text(json.dumps({
    "gloo_threads": [t for t in threads if t.startswith(("pt_gloo", "gloo"))],
    "warnings": [str(w.message) for w in caught]}))
"""


@pytest.fixture(scope="module")
def torchrun_results(tmp_path_factory) -> dict[int, dict]:
    """One 2-process torchrun shared by the tests below (each torchrun costs seconds)."""
    base = tmp_path_factory.mktemp("tr")

    def put(case: str, rank: int, step: int, who: str | None) -> None:
        d = base / case / f"rank{rank}"
        d.mkdir(parents=True, exist_ok=True)
        if who is None:
            (d / f"step-{step}.pt").write_bytes(b"truncated")
        else:
            torch.save({"who": who}, d / f"step-{step}.pt")

    # agree: rank 1's disk has a stray newer step-3 that rank 0's does not; rank 0 decides.
    for r in (0, 1):
        put("agree", r, 1, f"r{r}")
        put("agree", r, 2, f"r{r}")
    put("agree", 1, 3, "r1-stray")
    # missing: rank 1 has nothing; it must get step 2 from rank 0 over the process group.
    put("missing", 0, 1, "r0")
    put("missing", 0, 2, "r0")
    (base / "missing" / "rank1").mkdir(parents=True)
    # corrupt: rank 0's step-3 is truncated (rank 1's is fine), so everyone falls back to 2.
    put("corrupt", 0, 3, None)
    put("corrupt", 1, 3, "r1")
    put("corrupt", 0, 2, "r0")
    put("corrupt", 1, 2, "r1")
    # stale: node-local folders; rank 1's step-10.pt is another training's (other weights): it
    # must end with rank 0's, not its own (DDP, wrapped before the load, never re-syncs them).
    put("stale", 0, 10, "r0")
    put("stale", 1, 10, "r1-other-training")
    # empty: rank 0 has no checkpoint, rank 1 has one; rank 0 decides "none".
    (base / "empty" / "rank0").mkdir(parents=True)
    put("empty", 1, 5, "r1")

    script = base / "worker.py"
    script.write_text(WORKER)
    proc = _torchrun(script, str(base), cwd=base)
    assert proc.returncode == 0, proc.stdout
    return {r: {**json.loads((base / f"result-{r}.json").read_text()),
                "exit": json.loads((base / f"exit-{r}.json").read_text())} for r in (0, 1)}


def test_torchrun_workers_run_without_numpy(torchrun_results) -> None:
    # So the load/save results below hold where numpy is absent, even on machines that have it.
    for r in torchrun_results.values():
        assert r["numpy_refused"] and r["numpy_hidden_by_test"], r


def test_init_under_torchrun(torchrun_results) -> None:
    for rank, r in torchrun_results.items():
        assert (r["world_size"], r["local_rank"], r["backend"], r["distributed"]) == (2, rank, "gloo", True)
        assert r["is_main"] == (rank == 0)
        assert r["wrapped"] == "DistributedDataParallel"


def test_load_latest_agrees_across_ranks(torchrun_results) -> None:
    r0, r1 = torchrun_results[0], torchrun_results[1]
    # every rank ends with rank 0's checkpoint: its step (not rank 1's stray 3), its bytes
    assert r0["agree"] == ["r0", 2] and r1["agree"] == ["r0", 2]
    assert r0["missing"] == ["r0", 2] and r1["missing"] == ["r0", 2]  # shipped from rank 0
    assert r0["corrupt"] == ["r0", 2] and r1["corrupt"] == ["r0", 2]
    assert r0["stale"] == ["r0", 10] and r1["stale"] == ["r0", 10]
    assert r0["empty"] is None and r1["empty"] is None


def test_save_and_loader_under_torchrun(torchrun_results) -> None:
    r0, r1 = torchrun_results[0], torchrun_results[1]
    assert r0["saved_path"] == "step-7.pt" and r1["saved_path"] is None
    assert r1["visible_after_barrier"]
    assert len(r0["shard"]) == len(r1["shard"]) == 5
    assert sorted(r0["shard"] + r1["shard"]) == list(range(10))  # disjoint shards cover the data


def test_cleanup_ends_gloo_threads_before_interpreter_exit(torchrun_results) -> None:
    # DDP imports torch.distributed.nn.functional, whose default arguments would pin the group it
    # finds (ct.init imports it first). A gloo thread left at exit, dropping a finished backward
    # all-reduce, aborts the process now and then ("terminate called without an active exception").
    for r in torchrun_results.values():
        assert r["exit"] == {"gloo_threads": [], "warnings": []}, r["exit"]


def test_cleanup_warns_while_a_model_still_holds_the_group(solo, monkeypatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    train.init(backend="gloo")
    model = train.wrap(torch.nn.Linear(2, 1))
    with pytest.warns(RuntimeWarning, match=r"still referenced .*\(del model\)"):
        train.cleanup(barrier=True)
    assert not dist.is_initialized()
    del model  # the group, and its threads, go now


# ----------------------------------------------------------------------------- examples


def test_ddp_train_restarts_after_crash_then_resumes_at_world_size_1(tmp_path, solo, capsys) -> None:
    """One torchrun (each costs seconds of both CI cores) for the example's whole checkpoint story: a fresh
    start, a crash, torchrun's restart resuming from the last checkpoint, then a later run resuming in
    process at another world size."""
    ckpt = tmp_path / "ck"
    proc = _torchrun(EXAMPLES / "ddp_train.py", "--checkpoint-dir", str(ckpt), "--crash-at-epoch", "1",
                     "--crash-rank", "1", cwd=tmp_path, extra=("--max-restarts", "1"))
    assert proc.returncode == 0, proc.stdout
    assert "simulated crash at epoch 1" in proc.stdout
    # the first attempt started afresh: nothing said of resuming before the crash
    assert "resumed" not in proc.stdout.split("simulated crash at epoch 1")[0], proc.stdout
    assert "resumed from step 8" in proc.stdout
    # 512 samples / 2 ranks / batch 32 = 8 steps per epoch, 3 epochs; rank 0 alone prints, once.
    assert proc.stdout.count("done world_size=2 final_step=24") == 1, proc.stdout
    assert (ckpt / ".crashed-1").exists()
    assert sorted(p.name for p in ckpt.glob("step-*")) == ["step-16.pt", "step-24.pt", "step-8.pt"]
    # The restarted ranks; the first attempt's may be killed before they can tell.
    hidden = _numpy_hidden_at_exit(tmp_path, "ddp_train.py")
    assert len(hidden) >= 2 and all(hidden), hidden

    # A later run, in-process as a plain `python ddp_train.py`: resumes at world size 1.
    _load_example("ddp_train").main(["--checkpoint-dir", str(ckpt), "--epochs", "4"])
    out = capsys.readouterr()
    assert f"resumed from step 24: {ckpt / 'step-24.pt'} (to start afresh" in out.err, out.err  # load_latest said so
    assert "done world_size=1 final_step=40" in out.out, out.out


def test_ddp_train_echo_args(solo, tmp_path, monkeypatch, capsys) -> None:
    argv = ["--checkpoint-dir", str(tmp_path), "--epochs", "0", "--echo-args", "a b", "", "ünï",
            "$HOME", "'\"\\", "--not-an-option=1", "-x"]
    monkeypatch.setenv("CDDP_TEST_X", "v a l")
    monkeypatch.setenv("CLUSTERDDP_Y", "y")
    monkeypatch.setenv("OTHER_Z", "z")
    _load_example("ddp_train").main(argv)
    lines = capsys.readouterr().out.splitlines()
    assert json.loads(lines[0].removeprefix("ARGS ")) == argv
    assert json.loads(lines[1].removeprefix("ENV ")) == {"CDDP_TEST_X": "v a l", "CLUSTERDDP_Y": "y"}
    assert lines[-1] == "done world_size=1 final_step=0"
    with pytest.raises(SystemExit):  # without --echo-args, unknown options are still errors
        _load_example("ddp_train").parse_args(["--bogus"])


def test_dp_vs_ddp_tiny(tmp_path) -> None:
    proc = _run([sys.executable, str(EXAMPLES / "dp_vs_ddp.py"), "--tiny"], tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stdout
    lines = proc.stdout.splitlines()
    assert any(line.startswith("DataParallel: ") and line.endswith(" samples/s") for line in lines), proc.stdout
    assert any(line.startswith("DDP (2 procs): ") and line.endswith(" samples/s") for line in lines)
    assert any(line.startswith("DDP/DataParallel speed-up: ") and line.endswith("x") for line in lines)
    assert _numpy_hidden_at_exit(tmp_path, "dp_vs_ddp.py") == [True] * 3  # itself and its 2 DDP workers

