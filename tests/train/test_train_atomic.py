"""A rank killed in the middle of ``clusterddp.train.save_checkpoint`` leaves no file that anything takes
for a checkpoint (issue 26, section 2): not ``load_latest``, not the checkpoint mirror's choice (from
the node's own collect program), and the next save removes the temp file it left. A real process, a
real torch.save, SIGKILL while it writes."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time

import torch

from clusterddp import mirror, train
from clusterddp.node import collect

# The job's own process: step-1 saved whole, then step-2's save stopped in the middle of torch.save's
# writes (a file object that, past 1 MiB, says so and waits to be killed).
JOB = r"""
import os, sys, time
from pathlib import Path
import torch
from clusterddp import train

train.save_checkpoint({"w": torch.ones(1000)}, step=1, dir=sys.argv[1])
real = os.fdopen


class Stalls:
    def __init__(self, f):
        self.f, self.n = f, 0

    def write(self, b):
        n = self.f.write(b)
        self.n += n
        if self.n > 1 << 20:
            self.f.flush()
            Path(sys.argv[2]).touch()
            time.sleep(600)
        return n

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


os.fdopen = lambda fd, *a, **k: Stalls(real(fd, *a, **k))
train.save_checkpoint({"w": torch.ones(4 << 20)}, step=2, dir=sys.argv[1])  # 16 MiB
print("the save ended", flush=True)
"""


def test_a_rank_killed_while_saving_leaves_no_checkpoint_anything_takes(tmp_path):
    ckpt, stalled = tmp_path / "run" / "checkpoints", tmp_path / "stalled"
    p = subprocess.Popen([sys.executable, "-c", JOB, str(ckpt), str(stalled)], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 120
        while not stalled.exists():
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()[0]
            time.sleep(0.05)
        os.kill(p.pid, signal.SIGKILL)
    finally:
        out = p.communicate(timeout=60)[0]
    assert b"the save ended" not in out
    names = sorted(n.name for n in ckpt.iterdir())
    partial = [n for n in names if n.startswith(".step-2.") and n.endswith(".tmp")]
    assert len(partial) == 1 and names == sorted(["step-1.pt", *partial]), names
    assert (ckpt / partial[0]).stat().st_size > 1 << 20  # half a checkpoint, under its temp name

    found = train.load_latest(ckpt, announce=False)
    assert found is not None and found[1] == 1 and float(found[0]["w"].sum()) == 1000.0

    # the mirror looks through the node's collect program (list mode): the temp file is not a checkpoint
    out_buf = io.BytesIO()
    assert collect.main([str(tmp_path / "run"), str(tmp_path / "none.log")],
                        io.StringIO(json.dumps({"globs": ["checkpoints/**"], "have": {}, "list": True})), out_buf) == 0
    rx = collect.Receiver(lambda rel: tmp_path / "here" / rel, request={"globs": ["checkpoints/**"], "list": True})
    rx.feed(out_buf.getvalue())
    rx.finish()
    assert list(rx.listing) == ["checkpoints/step-1.pt"] and not rx.errors and not rx.missing
    chosen = mirror.choose(rx.listing, mirror.DEFAULT_GLOBS, before=rx.listing)
    assert [c.files[0][0] for c in chosen] == ["checkpoints/step-1.pt"]

    train.save_checkpoint({"w": torch.ones(3)}, step=3, dir=ckpt)  # the next save sweeps the leftover
    assert sorted(n.name for n in ckpt.iterdir()) == ["step-1.pt", "step-3.pt"]
