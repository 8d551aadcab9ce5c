"""DDP training on synthetic data with clusterddp.train: checkpoints, resume, crash simulation.

    python examples/ddp_train.py                                            # world of one
    python -m torch.distributed.run --standalone --nproc-per-node 2 examples/ddp_train.py
    clusterddp up local examples/ddp_train.py -- --epochs 10

Runs unchanged on CPU (gloo) and GPUs (nccl). Rank 0 prints; every rank trains its shard.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

try:
    import clusterddp.train as ct
except ImportError:  # running from a source checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import clusterddp.train as ct


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32, help="per process")
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--dataset-size", type=int, default=512)
    p.add_argument("--checkpoint-dir", default="checkpoints")
    p.add_argument("--keep", type=int, default=3, help="checkpoints to keep (0 = all)")
    p.add_argument("--epoch-time", type=float, default=0.0, metavar="S",
                   help="make each epoch last at least S seconds (a stand-in for a real model's compute)")
    p.add_argument("--crash-at-epoch", type=int, default=None,
                   help="rank --crash-rank exits with status 13 at the start of this epoch, once")
    p.add_argument("--crash-rank", type=int, default=0)
    p.add_argument("--echo-args", action="store_true",
                   help="rank 0 prints ARGS/ENV lines as JSON (for launcher tests)")
    args, extra = p.parse_known_args(argv)
    # Launcher tests pass arbitrary strings to check they arrive intact; otherwise be strict.
    if extra and not args.echo_args:
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def synthetic_dataset(n: int) -> TensorDataset:
    """y = x @ w + noise, identical on every rank (fixed seed, independent of world size)."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, 1, generator=g)
    y = x @ w + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def maybe_crash(args: argparse.Namespace, ctx: ct.Context, epoch: int) -> None:
    if args.crash_at_epoch != epoch or ctx.rank != args.crash_rank:
        return
    marker = Path(args.checkpoint_dir) / f".crashed-{ctx.rank}"
    if marker.exists():  # crashed once already: this is the restarted run
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()  # before exiting, so the restart does not crash again
    sys.stdout.write(f"rank {ctx.rank}: simulated crash at epoch {epoch}\n")  # one write: no interleaving
    sys.stdout.flush()
    os._exit(13)  # no cleanup, no exception handling: like a segfault or OOM kill


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    ctx = ct.init()
    if args.echo_args:
        ct.print0("ARGS " + json.dumps(argv))
        env = {k: v for k, v in os.environ.items() if k.startswith(("CDDP_TEST_", "CLUSTERDDP_"))}
        ct.print0("ENV " + json.dumps(env, sort_keys=True))

    torch.manual_seed(0)  # same initial weights everywhere (DDP also broadcasts rank 0's)
    model = ct.wrap(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    # lr is per effective batch of batch_size * world_size; scale it yourself if you change W.
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loader = ct.make_loader(synthetic_dataset(args.dataset_size), batch_size=args.batch_size)
    loss_fn = nn.MSELoss()

    start_epoch, step = 0, 0
    found = ct.load_latest(args.checkpoint_dir, option="--checkpoint-dir")  # option: for the hint to resume
    if found is not None:
        state, step = found
        ct.unwrap(model).load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start_epoch = state["epoch"]  # load_latest said which file it resumed from

    for epoch in loader.epochs(start_epoch, args.epochs):
        maybe_crash(args, ctx, epoch)
        began = time.monotonic()
        total = torch.zeros(2, device=ctx.device)  # [sum of losses, batches]
        for x, y in loader:
            x, y = x.to(ctx.device), y.to(ctx.device)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()  # DDP averages gradients across ranks here
            opt.step()
            step += 1
            total += torch.stack([loss.detach(), torch.ones((), device=ctx.device)])
        time.sleep(max(0.0, began + args.epoch_time - time.monotonic()))
        if ctx.distributed:  # report the mean over all ranks, not just rank 0's shard
            torch.distributed.all_reduce(total)
        ct.print0(f"epoch {epoch} step {step} loss {(total[0] / total[1]).item():.4f}")
        ct.save_checkpoint(
            {"model": ct.unwrap(model).state_dict(), "optim": opt.state_dict(), "epoch": epoch + 1},
            step=step, dir=args.checkpoint_dir, keep=args.keep or None,
        )

    ct.print0(f"done world_size={ctx.world_size} final_step={step}")
    # The DDP wrapper holds the group: drop it first, so cleanup() frees the group and joins gloo's
    # threads. Left to the interpreter's exit, a gloo thread still dropping a backward all-reduce
    # now and then aborted the rank ("terminate called without an active exception"; see ct.cleanup).
    del model, opt
    ct.cleanup(barrier=True)


if __name__ == "__main__":
    main()
