"""Training-side helpers for scripts started by ``torchrun`` (and so by ``clusterddp up``).

Depends only on torch and the standard library (not numpy, which torch's wheels do not
pull in), so it can be copied next to a training script on machines where clusterddp
itself is not installed::

    import clusterddp.train as ct

    ctx = ct.init()                                  # world of one outside torchrun
    model = ct.wrap(MyModel())                       # DDP when distributed
    loader = ct.make_loader(dataset, batch_size=32)  # DistributedSampler + set_epoch
    start = 0
    if (found := ct.load_latest()) is not None:
        state, start = found
        ...
    for epoch in loader.epochs(start, 10):
        for x, y in loader:
            ...
        ct.save_checkpoint({...}, step=epoch + 1)
    del model                 # it holds the process group (see cleanup)
    ct.cleanup(barrier=True)  # every rank ends here

``save_checkpoint`` and ``load_latest`` are collective: every rank must call them.
"""

from __future__ import annotations

import datetime
import gc
import hashlib
import inspect
import io
import json
import math
import os
import re
import secrets
import shlex
import sys
import warnings
import weakref
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

__all__ = [
    "Context",
    "DistLoader",
    "cleanup",
    "context",
    "init",
    "load_latest",
    "log_metrics",
    "make_loader",
    "print0",
    "save_checkpoint",
    "unwrap",
    "wrap",
]

# Only these names are complete checkpoints; temp files (".step-N.*.tmp") never match.
_CKPT_RE = re.compile(r"step-(\d+)\.pt")  # fullmatch: "$" also matches before a final newline
_TMP_PREFIX = ".step-"
_TMP_SUFFIX = ".tmp"


@dataclass(frozen=True)
class Context:
    """Where this process sits in the job. ``distributed`` is False for a plain ``python`` run."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str | None
    distributed: bool
    master_addr: str | None = None
    master_port: int | None = None

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the only rank that prints and writes checkpoints."""
        return self.rank == 0


_CTX: Context | None = None


_HOOKED: list[Any] = []  # the excepthook record_errors() replaced, once installed


def record_errors() -> None:
    """What ``torch.distributed.elastic.multiprocessing.errors.record`` does for a decorated
    ``main``, for the whole script: an uncaught exception is written, in torch elastic's format, to
    the error file torchrun gives each worker (``TORCHELASTIC_ERROR_FILE``), then reported as usual.
    ``clusterddp up`` reads these files to say which rank failed first and why. :func:`init` calls
    it; without that variable (plain ``python``) it does nothing. The file also carries the rank and
    a sub-second time (torch's own is whole seconds), so the first failure can be told apart from
    the failures it causes on other ranks a moment later."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or _HOOKED:
        return
    previous = sys.excepthook
    _HOOKED.append(previous)

    def hook(tp: type[BaseException], value: BaseException, tb: Any) -> None:
        import json
        import time
        import traceback
        try:
            data = {"message": {"message": f"{tp.__name__}: {value}", "extraInfo": {
                "py_callstack": "".join(traceback.format_exception(tp, value, tb)),
                "timestamp": str(int(time.time())),
                "clusterddp": {"rank": _env_int("RANK", 0), "time": time.time()}}}}
            with open(path, "w", encoding="utf-8") as f:
                json.dump(data, f)
        except Exception as e:  # noqa: BLE001 - the report must not hide the exception itself
            print(f"[clusterddp] could not write the error file {path}: {e}", file=sys.stderr)
        previous(tp, value, tb)
    sys.excepthook = hook


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


def init(backend: str | None = None, timeout: datetime.timedelta | None = None) -> Context:
    """Initialise the process group from torchrun's environment and return the Context.

    Reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT.
    ``backend`` defaults to ``nccl`` when CUDA is available and ``gloo`` otherwise. The CUDA
    device is set from LOCAL_RANK *before* the group is created so NCCL binds each process to
    its own GPU. Without RANK/WORLD_SIZE in the environment (plain ``python train.py``) it
    returns a world of one with ``distributed=False`` and creates no process group.
    Calling it again returns the same Context (until :func:`cleanup`).
    """
    global _CTX
    record_errors()
    if _CTX is not None:
        if backend is not None and _CTX.distributed and backend != _CTX.backend:
            raise ValueError(f"already initialised with backend {_CTX.backend!r}, not {backend!r}")
        return _CTX

    cuda = torch.cuda.is_available()
    distributed = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    rank = _env_int("RANK", 0) if distributed else 0
    world_size = _env_int("WORLD_SIZE", 1) if distributed else 1
    local_rank = _env_int("LOCAL_RANK", 0) if distributed else 0
    local_world_size = _env_int("LOCAL_WORLD_SIZE", 1) if distributed else 1

    if cuda:
        device = torch.device("cuda", local_rank)
        # Before init_process_group: otherwise every rank's NCCL communicator lands on GPU 0.
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")

    chosen = None
    if distributed:
        chosen = backend or ("nccl" if cuda else "gloo")
        if not dist.is_initialized():  # the script may have initialised the group itself
            kwargs: dict[str, Any] = {"backend": chosen}
            if timeout is not None:
                kwargs["timeout"] = timeout
            store = _restart_safe_store(rank, timeout)
            if store is not None:
                kwargs.update(store=store, rank=rank, world_size=world_size)
            # device_id lets NCCL create its communicator eagerly and lets barrier() pick the
            # right GPU; it only exists in torch >= 2.3 and only makes sense for a CUDA device.
            if device.type == "cuda" and "device_id" in inspect.signature(dist.init_process_group).parameters:
                kwargs["device_id"] = device
            _import_before_group()
            dist.init_process_group(**kwargs)
        else:
            chosen = dist.get_backend()

    port = os.environ.get("MASTER_PORT")
    _CTX = Context(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        device=device,
        backend=chosen,
        distributed=distributed,
        master_addr=os.environ.get("MASTER_ADDR") if distributed else None,
        master_port=int(port) if distributed and port else None,
    )
    return _CTX


def _restart_safe_store(rank: int, timeout: datetime.timedelta | None) -> dist.Store | None:
    """A store whose keys cannot collide with those of an earlier torchrun restart, or None.

    Since torch 2.5 torchrun's c10d rendezvous shares its agent's TCPStore with the workers
    (TORCHELASTIC_USE_AGENT_STORE=True), and in torch 2.13 that store outlives a restart
    with no per-attempt key prefix: after ``--max-restarts`` kicks in, gloo/NCCL read the
    previous attempt's peer addresses and fail with "Connection refused" or hang
    (pytorch/pytorch#135712, #167288). On a single node every worker sees the same
    TORCHELASTIC_RESTART_COUNT, so prefixing the keys with it isolates attempts. Across
    nodes the count is per agent and may differ, so there the only fix is launching torchrun
    with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (a fresh store per attempt); warn if missing.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    if _env_int("GROUP_WORLD_SIZE", 1) != 1:
        if rank == 0 and _env_int("TORCHELASTIC_MAX_RESTARTS", 0) > 0:
            warnings.warn("torchrun shares its TCPStore with workers and restarts are enabled: "
                          "restarted workers may fail to connect; launch torchrun with "
                          "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1", RuntimeWarning, stacklevel=3)
        return None
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timeout or default_pg_timeout)
    return dist.PrefixStore(f"clusterddp/restart_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def _import_before_group() -> None:
    """Import ``torch.distributed.nn.functional`` while no default group exists.

    Its functions take ``group=group.WORLD`` as a default argument, evaluated once, at import: the
    default group of that moment. DDP imports it on first use (``DistributedDataParallel()`` loads
    ``torch._dynamo``, which loads FSDP and ``_shard``), so after ``init_process_group`` it pins the
    group for good: ``destroy_process_group`` then cannot free it, and gloo's worker threads live
    on into interpreter exit, where one still dropping a finished collective aborts the process
    (see :func:`cleanup`). Imported first, those defaults are None.
    """
    import torch.distributed.nn.functional  # noqa: F401


def context() -> Context:
    """The current Context, initialising (as :func:`init` with defaults) if needed."""
    return _CTX if _CTX is not None else init()


def cleanup(barrier: bool = False) -> None:
    """Destroy the process group if one is initialised; safe to call more than once.

    ``barrier=True`` (at the normal end of training, reached by every rank) first waits for every
    rank, so no rank tears its connections down while a peer still uses them. Leave it off where
    only some ranks may call it (an error path): the others would wait for it forever.

    Delete the DDP model (and anything else holding the group) before calling it: the group, and
    with gloo its worker threads, must go here, not at interpreter exit. A gloo worker drops each
    finished collective itself, and one launched by DDP during backward carries a Python object
    (autograd's saved ``contextvars`` context), so dropping it takes the GIL; a worker that asks
    for the GIL once the interpreter is finalizing is ended by CPython with ``pthread_exit``, whose
    unwinding through that C++ destructor calls ``std::terminate``: SIGABRT, "terminate called
    without an active exception", after the script's last line. Freed here, the group joins its
    threads first. If something still holds it, this warns (RuntimeWarning) and names the fix.
    """
    global _CTX
    if dist.is_available() and dist.is_initialized():
        if barrier and dist.get_world_size() > 1:
            dist.barrier()
        group = weakref.ref(dist.group.WORLD) if dist.group.WORLD is not None else None
        dist.destroy_process_group()
        if group is not None and group() is not None:
            gc.collect()  # a model in a reference cycle is still freed in time
        if group is not None and group() is not None:
            warnings.warn("cleanup(): the default process group is still referenced after "
                          "destroy_process_group, so it outlives this call (a DDP model still alive?): "
                          "delete the model (del model) before cleanup(); with gloo, its threads can "
                          "otherwise abort the process at exit (SIGABRT)", RuntimeWarning, stacklevel=2)
    _CTX = None


def print0(*args: Any, sep: str | None = " ", end: str | None = "\n", file: TextIO | None = None,
           flush: bool = True) -> None:
    """``print`` on global rank 0 only, and always flushed: unflushed lines show up late, or
    never if the rank is killed.

    The line goes out in one ``write``: torchrun runs workers with ``python -u``, where
    ``print`` writes each piece separately, so lines from ranks sharing a pipe can interleave.
    """
    rank = _CTX.rank if _CTX is not None else _env_int("RANK", 0)  # no init just to print
    if rank != 0:
        return
    out = sys.stdout if file is None else file
    out.write((" " if sep is None else sep).join(map(str, args)) + ("\n" if end is None else end))
    out.flush()


METRICS_MARK = "[clusterddp.metrics] "  # the node's sampler (clusterddp/node/sampler.py) reads these lines


def log_metrics(step: int, file: TextIO | None = None, **values: float) -> None:
    """Print this rank's numbers at ``step`` as one JSON line (``[clusterddp.metrics] {"rank": 0, "step": 7,
    "loss": 0.52}``), which the run's sampler keeps by rank and node for `clusterddp metrics` and `report`:
    e.g. ``ct.log_metrics(step, loss=loss.item(), lr=sched.get_last_lr()[0])``. Every rank may call it (each
    is kept as its own series); a value that is no finite number is written as null and said as such there.
    One ``write``, flushed: lines of ranks sharing a pipe never interleave."""
    rank = _CTX.rank if _CTX is not None else _env_int("RANK", 0)
    rec: dict[str, Any] = {"rank": rank, "step": int(step)}
    for k, v in values.items():
        f = float(v)
        rec[k] = f if math.isfinite(f) else None
    out = sys.stdout if file is None else file
    out.write(METRICS_MARK + json.dumps(rec, separators=(",", ":")) + "\n")
    out.flush()


def wrap(model: torch.nn.Module, **ddp_kwargs: Any) -> torch.nn.Module:
    """Move ``model`` to this rank's device and wrap it in DistributedDataParallel.

    Returns the (moved) model unchanged when not distributed. ``ddp_kwargs`` go to DDP.
    """
    ctx = context()
    model = model.to(ctx.device)
    if not ctx.distributed:
        return model
    if ctx.device.type == "cuda":
        ddp_kwargs.setdefault("device_ids", [ctx.device.index])
        ddp_kwargs.setdefault("output_device", ctx.device.index)
    return DistributedDataParallel(model, **ddp_kwargs)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The bare module inside DDP/DataParallel, so state_dict keys carry no ``module.`` prefix."""
    while isinstance(model, (DistributedDataParallel, torch.nn.DataParallel)):
        model = model.module
    return model


# --------------------------------------------------------------------------- checkpoints


def _barrier(ctx: Context) -> None:
    if ctx.distributed:
        dist.barrier()


def _wire_device(ctx: Context) -> torch.device:
    # NCCL only moves CUDA tensors; gloo gets CPU ones, where the data already is.
    return ctx.device if ctx.backend == "nccl" else torch.device("cpu")


# Plain tensors only, no *_object collectives: those pickle through numpy, which torch's
# wheels do not depend on, so they fail with "Numpy is not available" on a fresh install.


def _broadcast_int(ctx: Context, value: int) -> int:
    """Rank 0's ``value`` on every rank."""
    if not ctx.distributed:
        return value
    box = torch.tensor([value], dtype=torch.int64, device=_wire_device(ctx))
    dist.broadcast(box, src=0)
    return int(box.item())


def _sha256(path: Path) -> bytes | None:
    """The sha256 of the file at ``path``, read in pieces; None when it cannot be read."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    except OSError:
        return None
    return h.digest()


def _broadcast_digest(ctx: Context, digest: bytes | None) -> bytes:
    """Rank 0's 32-byte ``digest`` on every rank (zeros when rank 0 has none)."""
    box = torch.tensor(list(digest or bytes(32)), dtype=torch.uint8, device=_wire_device(ctx))
    dist.broadcast(box, src=0)
    return bytes(box.cpu().tolist())


def _read_bytearray(path: Path) -> bytearray:
    # readinto, not bytearray(read_bytes()): no second copy of a multi-GB checkpoint.
    with open(path, "rb") as f:
        data = bytearray(os.fstat(f.fileno()).st_size)
        read = f.readinto(data)
    del data[read:]
    return data


def _broadcast_file(ctx: Context, path: Path) -> bytearray:
    """The bytes of rank 0's ``path`` on every rank (only rank 0 reads it): a length, then the bytes."""
    data = _read_bytearray(path) if ctx.is_main else bytearray()
    size = _broadcast_int(ctx, len(data))
    if not ctx.is_main:
        data = bytearray(size)
    if size == 0:  # torch.frombuffer refuses an empty buffer
        return data
    # frombuffer shares the bytearray's memory, so what lands in the tensor already is the
    # bytes: no numpy (.numpy().tobytes()), no raw pointer (ctypes.string_at), and not
    # bytes(untyped_storage()), which converts element by element (minutes for a few MB).
    view = torch.frombuffer(data, dtype=torch.uint8)
    device = _wire_device(ctx)
    if device.type == "cpu":
        dist.broadcast(view, src=0)  # gloo writes into ``data`` in place
    else:
        wire = view.to(device) if ctx.is_main else torch.empty(size, dtype=torch.uint8, device=device)
        dist.broadcast(wire, src=0)
        if not ctx.is_main:
            view.copy_(wire)
    return data


def _checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints in ``directory``, newest (highest step) first."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = [(int(m.group(1)), directory / n) for n in names if (m := _CKPT_RE.fullmatch(n))]
    return sorted(found, reverse=True)


def _fsync_dir(directory: Path) -> None:
    # The rename is only durable once the directory entry is on disk.
    if not hasattr(os, "O_DIRECTORY"):  # e.g. Windows: cannot open a directory
        return
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(obj: Any, step: int, dir: str | os.PathLike[str] = "checkpoints",
                    keep: int | None = 3) -> Path | None:
    """Atomically write ``obj`` to ``<dir>/step-<step>.pt`` on rank 0; collective.

    Rank 0 ``torch.save``s into a temp file in the same directory, flushes and fsyncs it,
    ``os.replace``s it to the final name and fsyncs the directory, so a crash at any point
    leaves either the old set of checkpoints or the new one, never a partial ``step-*.pt``.
    It then deletes all but the newest ``keep`` checkpoints by step number (``keep=None``
    keeps all) plus temp files left behind by earlier crashes. Every rank then waits at a
    barrier, so no rank runs ahead of a checkpoint that is not on disk yet. Every rank must
    call this; ``obj`` is only used on rank 0 (save ``unwrap(model).state_dict()``).

    Returns the checkpoint path on rank 0 and None on the other ranks.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if keep is not None and keep < 1:
        raise ValueError(f"keep must be >= 1 or None, got {keep}")
    ctx = context()
    directory = Path(dir)
    path: Path | None = None
    if ctx.is_main:
        directory.mkdir(parents=True, exist_ok=True)
        # Not tempfile.mkstemp: it creates mode 0600, we want the usual umask-based mode.
        tmp = directory / f"{_TMP_PREFIX}{step}.{os.getpid()}.{secrets.token_hex(4)}{_TMP_SUFFIX}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(obj, f)
                f.flush()
                os.fsync(f.fileno())
            path = directory / f"step-{step}.pt"
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(directory)
        _prune(directory, keep, current=tmp)
    _barrier(ctx)
    return path


def _prune(directory: Path, keep: int | None, current: Path) -> None:
    if keep is not None:
        for _, old in _checkpoints(directory)[keep:]:
            old.unlink(missing_ok=True)
    # Temp files can only be left over by a crashed save: rank 0 is the only writer.
    for name in os.listdir(directory):
        if name.startswith(_TMP_PREFIX) and name.endswith(_TMP_SUFFIX) and directory / name != current:
            (directory / name).unlink(missing_ok=True)


def _intact_zip(source: Path | io.BytesIO) -> bool:
    """True if ``source`` is a zip whose members all match their CRCs (torch.save's format)."""
    try:
        if isinstance(source, io.BytesIO):
            source.seek(0)
        with zipfile.ZipFile(source) as zf:
            return zf.testzip() is None
    except (OSError, EOFError, zipfile.BadZipFile, ValueError):
        return False


def _try_load(source: Path | io.BytesIO, map_location: Any, load_kwargs: dict[str, Any]) -> tuple[bool, Any]:
    """(True, obj), or (False, None) when the file is damaged or missing."""
    try:
        return True, torch.load(source, map_location=map_location, **load_kwargs)
    except Exception:
        # Damaged files fail in many ways (EOFError, zip RuntimeError, and a flipped byte in
        # the pickle even looks like a weights_only refusal), so judge the file, not the error:
        # a file whose zip CRCs check out is intact, and its failure (weights_only=True
        # refusing a type, a class that no longer imports...) must surface instead of
        # silently resuming from an older checkpoint.
        if _intact_zip(source):
            raise
        return False, None


def load_latest(dir: str | os.PathLike[str] = "checkpoints", map_location: Any = None, announce: bool = True,
                option: str | None = None, **load_kwargs: Any) -> tuple[Any, int] | None:
    """Load the newest complete checkpoint in ``dir``: ``(obj, step)``, or None if there is none.

    Collective: every rank must call it and every rank gets the same checkpoint, rank 0's.
    Rank 0 lists ``step-<int>.pt`` files (temp files never count), tries them newest first,
    skips files that fail to load, and broadcasts its choice and the file's sha256; each rank
    then loads that step from its own ``dir`` when its copy has those very bytes. A rank that
    lacks the file, cannot read it, or holds another one of that name (no shared filesystem; a
    stale copy from another training) receives rank 0's bytes over the process group instead,
    so ``dir`` need not be shared.

    A file counts as damaged, and is skipped, when it fails to load and its zip CRCs do not
    check out (truncated, empty, garbage, flipped bytes). An intact file that fails to load
    raises rather than silently resuming from an older step.

    ``map_location`` defaults to this rank's device. ``torch.load`` runs with its own default
    ``weights_only=True`` (safe; enough for state_dicts, tensors, numbers, strings, lists,
    dicts); pass ``weights_only=False`` in ``load_kwargs`` for checkpoints holding other
    Python objects, and only for files you trust.

    Unless ``announce`` is False, rank 0 says on stderr which file it resumed from: a relative
    ``dir`` is found in the folder the job runs in (for ``up local``, the current folder), so a
    second run resumes from the first one's checkpoints, and that must not go unnoticed.

    A run of an inventory runs in a folder of its own on each node (``<workdir>/runs/<run_id>/``), new
    each time, so there a relative ``dir`` is new each time and the same command starts over. When it
    holds nothing and an earlier run of the same script on this host left checkpoints there, rank 0 says
    so on stderr, with what to add to the command to carry on from them (``option``: the script's own
    option that sets ``dir``, such as ``"--checkpoint-dir"``; see :func:`earlier_run_checkpoints`).
    """
    found = _load_latest(Path(dir), map_location, load_kwargs)
    if found is not None and announce:
        where = Path(dir).absolute()
        print0(f"resumed from step {found[1]}: {where / f'step-{found[1]}.pt'} (to start afresh instead, move "
               f"{where} away or pass another checkpoint folder)", file=sys.stderr)
    elif found is None and announce and context().is_main:
        earlier = earlier_run_checkpoints(Path(dir))
        if earlier is not None:
            print0(_starts_over(Path(dir), earlier, option), file=sys.stderr)
    return found


def earlier_run_checkpoints(directory: Path, limit: int = 256) -> Path | None:
    """``directory`` (relative) in the newest earlier run of this script on this host that holds a
    complete checkpoint there, when this process runs in a clusterddp inventory run's folder
    (``<workdir>/runs/<run_id>/``, the run id in ``CLUSTERDDP_RUN_ID``, its ``.clusterddp/`` inside);
    else None (``up local`` runs in the launch folder, where a relative folder is the same each time).
    An earlier run is a folder beside this one whose name sorts before this run's id (run ids start with
    their start time), not a link, holding a file named as this script; at most ``limit`` are looked at."""
    run_id = os.environ.get("CLUSTERDDP_RUN_ID")
    if not run_id or directory.is_absolute() or ".." in directory.parts or not sys.argv or not sys.argv[0]:
        return None
    here = Path.cwd()
    if here.name != run_id or here.parent.name != "runs" or not (here / ".clusterddp").is_dir():
        return None
    script = Path(sys.argv[0]).name
    try:
        names = sorted((n for n in os.listdir(here.parent) if n < run_id), reverse=True)[:limit]
    except OSError:
        return None
    for name in names:
        run = here.parent / name
        if not run.is_symlink() and (run / script).is_file() and _checkpoints(run / directory):
            return run / directory
    return None


_LOCAL_RANK_ARG = re.compile(r"--local[-_]rank=\d+")  # what `up --local-rank-arg` puts before the arguments


def _starts_over(directory: Path, earlier: Path, option: str | None) -> str:
    """What rank 0 says when this inventory run starts over where an earlier one left checkpoints."""
    args = [a for a in sys.argv[1:] if not _LOCAL_RANK_ARG.fullmatch(a)]
    given = str(directory)
    if given in args or any(a == f"{option}={given}" for a in args):  # the folder was given: swap it
        args = [str(earlier) if a == given else f"{option}={earlier}" if a == f"{option}={given}" else a
                for a in args]
        fix = "with the script's arguments (after `--`): " + shlex.join(args)
    elif option:
        fix = "with the script's arguments (after `--`): " + shlex.join([*args, option, str(earlier)])
    else:
        fix = f"with {earlier} as the script's checkpoint folder"
    step = _checkpoints(earlier)[0][0]
    return (f"no checkpoint in {given} ({directory.absolute()}): this run starts from scratch. Each run of an "
            f"inventory has a folder of its own, and an earlier run of {Path(sys.argv[0]).name} on this host "
            f"({earlier.parent.name}) left step-{step}.pt in {earlier}: to carry on from it, run the same "
            f"`clusterddp up` command {fix}")


def _load_latest(directory: Path, map_location: Any, load_kwargs: dict[str, Any]) -> tuple[Any, int] | None:
    ctx = context()
    if map_location is None:
        map_location = ctx.device

    chosen = -1  # none
    obj: Any = None
    if ctx.is_main:
        for step, path in _checkpoints(directory):
            ok, obj = _try_load(path, map_location, load_kwargs)
            if ok:
                chosen = step
                break
    chosen = _broadcast_int(ctx, chosen)
    if chosen < 0:
        return None
    if not ctx.distributed:
        return obj, chosen

    # Only a copy of rank 0's very bytes counts: a node-local folder may hold a stale step-N.pt of
    # another training (same step, other weights), and DDP, wrapped before the load, would never
    # bring that rank back in line.
    path = directory / f"step-{chosen}.pt"
    want = _broadcast_digest(ctx, _sha256(path) if ctx.is_main else None)
    ok = ctx.is_main
    if not ctx.is_main and _sha256(path) == want:
        ok, obj = _try_load(path, map_location, load_kwargs)
    # One all_reduce tells everyone whether rank 0 must ship the file's bytes.
    missing = torch.tensor([0 if ok else 1], device=_wire_device(ctx))
    dist.all_reduce(missing)
    if int(missing.item()) > 0:
        data = _broadcast_file(ctx, directory / f"step-{chosen}.pt")
        if not ok:
            ok, obj = _try_load(io.BytesIO(data), map_location, load_kwargs)
            if not ok:
                raise RuntimeError(f"rank {ctx.rank}: cannot load step-{chosen}.pt received from rank 0")
    return obj, chosen


# --------------------------------------------------------------------------- data


class DistLoader:
    """A DataLoader whose sampler gives each rank its own shard and reshuffles every epoch.

    Iterate it once per epoch. The epoch that seeds the shuffle is the one passed to
    :meth:`set_epoch` (or yielded by :meth:`epochs`) before the iteration; if none was set,
    it is one more than the previous iteration's (0 the first time). So a plain
    ``for epoch in range(n): for batch in loader`` still reshuffles each epoch, and a resumed
    job that uses ``for epoch in loader.epochs(start, stop)`` replays exactly the order the
    uninterrupted job would have used. All ranks must use the same epoch numbers.
    """

    def __init__(self, dataset: Dataset, batch_size: int, shuffle: bool = True, seed: int = 0,
                 **dataloader_kwargs: Any) -> None:
        ctx = context()
        # Used even in a world of one (num_replicas=1) so shuffling is seeded by
        # (seed, epoch) the same way with and without torchrun. The sampler pads the last
        # shard (its drop_last=False) so every rank runs the same number of steps; DDP
        # would hang in backward if one rank had a batch more than another.
        self.sampler: DistributedSampler = DistributedSampler(
            dataset, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=shuffle, seed=seed,
        )
        self.dataloader = DataLoader(dataset, batch_size=batch_size, sampler=self.sampler,
                                     **dataloader_kwargs)
        self._next_epoch = 0
        self.epoch: int | None = None  # epoch of the current/last iteration

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` to seed the shuffle of the next iteration."""
        self._next_epoch = epoch

    def epochs(self, start: int, stop: int) -> Iterator[int]:
        """Yield ``start .. stop-1``, calling :meth:`set_epoch` before each is used."""
        for epoch in range(start, stop):
            self.set_epoch(epoch)
            yield epoch

    def __iter__(self) -> Iterator[Any]:
        self.epoch = self._next_epoch
        self.sampler.set_epoch(self.epoch)
        self._next_epoch = self.epoch + 1
        return iter(self.dataloader)

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return len(self.dataloader)


def make_loader(dataset: Dataset, batch_size: int, shuffle: bool = True, **kwargs: Any) -> DistLoader:
    """A :class:`DistLoader` over ``dataset``; ``batch_size`` is per process, so the
    effective batch is ``batch_size * world_size``. ``seed`` seeds the sampler's shuffle;
    other keyword arguments (``num_workers``, ``pin_memory``, ``drop_last``...) go to the
    DataLoader."""
    return DistLoader(dataset, batch_size, shuffle=shuffle, **kwargs)
