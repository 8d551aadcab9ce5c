#!/usr/bin/env bash
# The GPU check, for a machine with NVIDIA GPUs (run from the repository root):
#   1. examples/dp_vs_ddp.py on every GPU present: nn.DataParallel against DDP, samples/s;
#   2. `clusterddp up local` of a NCCL all_reduce job on every GPU: bus bandwidth per size;
#   3. `clusterddp check --collective` on this one machine, where this clusterddp has it;
#   4. the flight recorder (issue 25): `clusterddp up local` of a NCCL job on 2 GPUs where rank 1 skips
#      a collective (short NCCL timeout): NCCL's own dump on timeout must be found in the run's control
#      folder, fetched, parsed, and rank 1 named as the rank that never entered it. With one GPU (NCCL
#      refuses two ranks on one GPU) one rank whose all_reduce cannot complete (the GPU held by a spin
#      kernel) must be named as waiting in it, from its dump.
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

echo "== 4. flight recorder: NCCL's dump on timeout, fetched and read"
nflight=$(( seen >= 2 ? 2 : 1 ))
mkdir -p "$work/flight"
cat > "$work/flight/skip.py" <<'PY'
import datetime, os, time
import torch
import torch.distributed as dist

local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=float(os.environ["FLIGHT_TIMEOUT_S"])),
                        device_id=torch.device("cuda", local))
r, n = dist.get_rank(), dist.get_world_size()
x = torch.ones(1 << 20, device="cuda")


def step():
    dist.all_reduce(x)


for _ in range(3):
    step()
torch.cuda.synchronize()
print(f"rank {r}: 3 all_reduces done", flush=True)
if n == 1:
    torch.cuda._sleep(1 << 62)  # the GPU spins before the 4th all_reduce: it never completes
    step()
    torch.cuda.synchronize()
elif r == 1:
    time.sleep(900)  # takes another branch: never enters the 4th all_reduce
else:
    step()
    torch.cuda.synchronize()
print(f"rank {r}: not reached", flush=True)
PY
started=$(date +%s%N)
(cd "$work/flight" && timeout -s INT -k 30 420 "$PYTHON" -m clusterddp up local skip.py --gpus "$nflight" --runs-dir "$work/flight/runs" \
   -e FLIGHT_TIMEOUT_S=20 >"$work/flight/out" 2>"$work/flight/err"); code=$?
echo "up local exit $code after $(( ($(date +%s%N) - started) / 1000000 )) ms (exit 1 expected: the job times out)"
sed -n '/root cause/,$p' "$work/flight/err" | head -30
"$PYTHON" - "$work/flight/runs" "$nflight" "$code" <<'PY' || { echo "flight recorder check failed" >&2; status=1; }
import json, sys
from pathlib import Path
from clusterddp import flight
runs, n, code = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
found = [d for d in runs.iterdir() if (d / "run.json").exists()] if runs.is_dir() else []
if len(found) != 1:
    print(f"FAIL: {len(found)} runs recorded under {runs}, not 1\nflight recorder check: FAILED")
    sys.exit(1)
run = found[0]
problems = [] if code == 1 else [f"up local exited {code}, not 1"]
kept = sorted((run / "flight" / "local").glob("rank*")) if (run / "flight" / "local").is_dir() else []
print("dumps fetched:", ", ".join(f"{p.name} ({p.stat().st_size} B)" for p in kept) or "none")
for p in kept:
    d = flight.parse_dump(p.read_bytes())
    if isinstance(d, str):
        problems.append(f"{p.name}: not read: {d}")
    else:
        print(f"{p.name}: torch dump version {d.version}, {len(d.entries)} entries, last: "
              f"{d.entries[-1] if d.entries else None}")
if not any(p.name == "rank0" for p in kept):
    problems.append("no dump from rank 0, whose all_reduce timed out")
f = (json.loads((run / "run.json").read_text()).get("failure") or {}).get("flight")
print("run.json failure.flight:", json.dumps(f))
if not f:
    problems.append("run.json has no failure.flight")
elif n == 2:
    if f["behind"] != [1]:
        problems.append(f"the rank that skipped is not named: behind={f['behind']} ({f['summary']})")
    if not f["summary"].startswith("rank 1 (local) never entered nccl:"):
        problems.append(f"summary: {f['summary']}")
else:
    last = [e for e in f["ranks"] if e["rank"] == 0]
    if not last or not last[0]["op"].startswith("nccl:") or last[0]["state"] == "completed":
        problems.append(f"rank 0's last collective: {last}")
    if not f["summary"].startswith("rank 0 (local) waits in nccl:"):
        problems.append(f"summary: {f['summary']}")
for p in problems:
    print("FAIL:", p)
print("flight recorder check:", "FAILED" if problems else "ok")
sys.exit(1 if problems else 0)
PY
exit $status
