"""Benchmark: the same MLP trained for a fixed number of steps with nn.DataParallel and with DDP.

    python examples/dp_vs_ddp.py            # all visible GPUs (on CPU: 2 processes)
    python examples/dp_vs_ddp.py --tiny     # seconds on a CPU, for CI

(a) DataParallel: one process drives every visible GPU, scattering each batch and gathering
    outputs and gradients through GPU 0 (on a CPU-only machine: a plain single process).
(b) DDP: the script re-launches itself with ``python -m torch.distributed.run --standalone
    --nproc-per-node N ... --ddp-worker``; one process per GPU, gradients all-reduced.

Both see the same global batch per step (DDP: ``--batch-size / N`` per process), random
data already on the device, and untimed warm-up steps. On CPU the ratio mostly measures
how the cores are shared, not what DDP buys on GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

try:
    import clusterddp.train as ct
except ImportError:  # running from a source checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import clusterddp.train as ct

RESULT_TAG = "DDP_RESULT "


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="small model, few steps (CI)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 50, tiny 10)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps (default 5, tiny 2)")
    p.add_argument("--batch-size", type=int, default=None, help="global batch (default 512, tiny 32)")
    p.add_argument("--features", type=int, default=None, help="input width (default 1024, tiny 32)")
    p.add_argument("--hidden", type=int, default=None, help="hidden width (default 4096, tiny 64)")
    p.add_argument("--layers", type=int, default=None, help="hidden layers (default 4, tiny 2)")
    p.add_argument("--nproc", type=int, default=None, help="DDP processes (default: GPUs, or 2)")
    p.add_argument("--ddp-worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    defaults = dict(steps=(50, 10), warmup=(5, 2), batch_size=(512, 32), features=(1024, 32),
                    hidden=(4096, 64), layers=(4, 2))
    for name, (full, tiny) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, tiny if args.tiny else full)
    if args.nproc is None:
        args.nproc = torch.cuda.device_count() or 2
    return args


def make_model(args: argparse.Namespace) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(args.features, args.hidden), nn.ReLU()]
    for _ in range(args.layers - 1):
        layers += [nn.Linear(args.hidden, args.hidden), nn.ReLU()]
    layers.append(nn.Linear(args.hidden, 10))
    return nn.Sequential(*layers)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(model: nn.Module, batch: int, args: argparse.Namespace, device: torch.device) -> float:
    """Run warm-up + timed steps; return the seconds the timed steps took."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(batch, args.features, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    loss_fn = nn.CrossEntropyLoss()
    start = 0.0
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            sync(device)
            start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
    sync(device)
    return time.perf_counter() - start


def run_dataparallel(args: argparse.Namespace) -> float:
    if torch.cuda.is_available():
        device = torch.device("cuda", 0)
        model: nn.Module = make_model(args).to(device)
        if torch.cuda.device_count() > 1:
            model = nn.DataParallel(model)
    else:
        device, model = torch.device("cpu"), make_model(args)
    seconds = train(model, args.batch_size, args, device)
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # give GPU 0's memory back before the DDP processes start
    return args.batch_size * args.steps / seconds


def ddp_worker(args: argparse.Namespace) -> None:
    """Body of each torchrun process: train with DDP and report from rank 0."""
    ctx = ct.init()
    if ctx.device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        # Share the cores instead of each process grabbing all of them.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // ctx.local_world_size))
    per_proc = max(1, args.batch_size // ctx.world_size)
    model = ct.wrap(make_model(args))
    if ctx.distributed:
        torch.distributed.barrier()  # start the clocks together
    seconds = torch.tensor([train(model, per_proc, args, ctx.device)], device=ctx.device)
    if ctx.distributed:  # the step rate is set by the slowest rank
        torch.distributed.all_reduce(seconds, op=torch.distributed.ReduceOp.MAX)
    rate = per_proc * ctx.world_size * args.steps / seconds.item()
    ct.print0(RESULT_TAG + json.dumps({"samples_per_s": rate, "world_size": ctx.world_size}))
    del model  # the DDP wrapper holds the process group: let it go first (see ddp_train.py)
    ct.cleanup(barrier=True)


def run_ddp(args: argparse.Namespace, argv: list[str]) -> tuple[float, int]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(args.nproc), str(Path(__file__).resolve()), *argv, "--ddp-worker"]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    match = re.search("^" + RESULT_TAG + "(.*)$", proc.stdout, re.MULTILINE)
    if proc.returncode != 0 or match is None:
        sys.stdout.write(proc.stdout)
        sys.exit(f"DDP run failed (exit {proc.returncode}): {' '.join(cmd)}")
    result = json.loads(match.group(1))
    return result["samples_per_s"], result["world_size"]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.ddp_worker:
        ddp_worker(args)
        return
    gpus = torch.cuda.device_count()
    print(f"device: {f'{gpus} GPU(s)' if gpus else 'cpu'}, global batch {args.batch_size}, "
          f"{args.steps} timed steps", flush=True)
    dp = run_dataparallel(args)
    print(f"DataParallel: {dp:.1f} samples/s", flush=True)
    ddp, world = run_ddp(args, argv)
    print(f"DDP ({world} procs): {ddp:.1f} samples/s", flush=True)
    print(f"DDP/DataParallel speed-up: {ddp / dp:.2f}x", flush=True)


if __name__ == "__main__":
    main()
