#!/usr/bin/env bash
# The GPU check, for a machine with NVIDIA GPUs (run from the repository root):
#   1. examples/dp_vs_ddp.py on every GPU present: nn.DataParallel against DDP, samples/s;
#   2. `clusterddp up local` of a NCCL all_reduce job on every GPU: bus bandwidth per size;
#   3. `clusterddp check --collective` on this one machine, where this clusterddp has it.
# Figures go to stdout. On a machine without a GPU (none that nvidia-smi lists, or none that torch
# sees) it refuses: exit 2. Any step that fails makes the script exit 1 after the others ran.
#
#   bash bench/gpu_check.sh              # PYTHON=python3 by default; GPU_CHECK_INVENTORY=local
set -u
PYTHON=${PYTHON:-python3}
INVENTORY=${GPU_CHECK_INVENTORY:-local}
cd "$(dirname "$0")/.." || exit 2

refuse() { echo "gpu_check: $*" >&2; exit 2; }

command -v nvidia-smi >/dev/null 2>&1 || refuse "no nvidia-smi on PATH: this machine has no NVIDIA GPU (or no driver); nothing to check"
listed=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "${listed:-0}" -gt 0 ] || refuse "nvidia-smi lists no GPU; nothing to check"
seen=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null) \
  || refuse "$PYTHON cannot import torch; install a CUDA build of torch, then clusterddp (pip install -e .)"
[ "${seen:-0}" -gt 0 ] || refuse "nvidia-smi lists $listed GPU(s) but torch sees none (a CPU build of torch?); install a CUDA build"
"$PYTHON" -c 'import clusterddp' 2>/dev/null || refuse "$PYTHON cannot import clusterddp; pip install -e . first"

status=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "== machine"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
"$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", ".".join(map(str, torch.cuda.nccl.version())))'

echo "== 1. examples/dp_vs_ddp.py on $seen GPU(s)"
OMP_NUM_THREADS=1 "$PYTHON" examples/dp_vs_ddp.py || { echo "dp_vs_ddp.py failed" >&2; status=1; }

echo "== 2. clusterddp up local, NCCL all_reduce on $seen GPU(s)"
cat > "$work/allreduce.py" <<'PY'
import time
import torch
import torch.distributed as dist
import clusterddp.train as ct

ctx = ct.init()  # NCCL on GPUs
assert ctx.backend == "nccl", ctx.backend
n = ctx.world_size
for size in (1 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20):
    x = torch.ones(size // 4, device=ctx.device)
    for _ in range(3):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    iters = 20
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / iters
    bus = size / dt * 2 * (n - 1) / n / 1e9 if n > 1 else 0.0  # nccl-tests' bus bandwidth
    ct.print0(f"all_reduce {size:>10} B  {dt * 1e6:9.1f} us  algbw {size / dt / 1e9:7.2f} GB/s  busbw {bus:7.2f} GB/s")
ct.cleanup()
PY
started=$(date +%s%N)
(cd "$work" && "$PYTHON" -m clusterddp up local allreduce.py --runs-dir "$work/runs") || { echo "up local failed" >&2; status=1; }
echo "up local wall time: $(( ($(date +%s%N) - started) / 1000000 )) ms"

echo "== 3. clusterddp check --collective ($INVENTORY)"
if "$PYTHON" -m clusterddp check --help 2>/dev/null | grep -q -- '--collective'; then
  "$PYTHON" -m clusterddp check "$INVENTORY" --collective || { echo "check --collective failed" >&2; status=1; }
else
  echo "skipped: this clusterddp has no \`check --collective\` yet"
fi
exit $status
