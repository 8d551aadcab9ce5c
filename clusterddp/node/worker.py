"""``worker``: the shim that gives a worker its local rank as an argument, for scripts written for
``python -m torch.distributed.launch`` (``parser.add_argument('--local_rank', type=int)``).

torchrun passes the local rank only in ``LOCAL_RANK``. With ``up --local-rank-arg``,
``plan.worker_command`` makes each worker process run this program first (``python -S -c``, no
site-packages: it starts in milliseconds), which replaces itself (``exec``, same pid, so
torchrun's signals and exit codes are untouched) with what torchrun would have run,
``python -u SCRIPT ARGS``, plus ``--local_rank=<LOCAL_RANK>`` before the script's own arguments.
Under Slurm's ``srun`` (no torchrun) the rank is ``SLURM_LOCALID``. Python 3.8 grammar.
"""

from __future__ import annotations

import os
import sys

FLAGS = ("--local_rank", "--local-rank")
RANK_VARS = ("LOCAL_RANK", "SLURM_LOCALID")


def command(argv: list[str], environ: dict, python: str) -> list[str]:
    """The worker's command line: ``python -u SCRIPT FLAG=RANK ARGS``. argv: the flag, the script,
    its arguments. Raises ValueError when the flag is not one of FLAGS or no local rank is set."""
    flag, script, args = argv[0], argv[1], argv[2:]
    if flag not in FLAGS:
        raise ValueError("unknown flag %r (expected %s)" % (flag, " or ".join(FLAGS)))
    rank = next((environ[v] for v in RANK_VARS if environ.get(v, "").isdigit()), None)
    if rank is None:
        raise ValueError("no local rank: %s is not set to a number" % " or ".join(RANK_VARS))
    return [python, "-u", script, "%s=%s" % (flag, rank)] + args


def main(argv: list[str]) -> int:
    try:
        cmd = command(argv, dict(os.environ), sys.executable)
    except (ValueError, IndexError) as e:
        sys.stderr.write("[clusterddp] worker: %s\n" % e)
        return 2
    sys.stdout.flush()
    os.execv(cmd[0], cmd)
    return 0  # not reached: execv replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
