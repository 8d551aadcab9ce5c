"""How long does a fleet command take as the host count grows? `clusterddp exec` against pdsh.

Starts a test bed of SSH hosts (network namespaces on this machine, see tests/testbed.py; needs
root) and times, for each host count, the whole command from the shell's point of view:

  clusterddp   python -m clusterddp exec inv.yaml -- true             (default fan-out, 32)
  pdsh         pdsh -R ssh -l root -w <addresses> true                 (its default fan-out, 32)
  paramiko pool  a bare paramiko + thread pool script (PARAMIKO_POOL below): the floor for a Python launcher
  sequential   python -m clusterddp exec inv.yaml --fanout 1 -- true   (one host after another)
  ssh loop     for a in <addresses>; do ssh a true; done               (OpenSSH, one after another)
  mux floor    pdsh over OpenSSH ControlMaster connections opened beforehand: no handshake, no
               launcher start-up, only each host's session and login shell (what no launcher can beat)

Runs are interleaved (every tool once per round) so a busy machine slows all of them alike;
the medians are reported, with the ratios to pdsh and to the sequential runs, as a Markdown
table, a JSON file and, if matplotlib is installed, a plot.

    sudo python bench/exec_fanout.py                      # 4, 16, 32 hosts, 7 rounds
    sudo python bench/exec_fanout.py --hosts 4 16 --rounds 3 --out /tmp/bench
    sudo python bench/exec_fanout.py --hosts 16 64 128 --rounds 5 --no-sequential   # the large beds (opt-in)

Rounds alternate who goes first. Besides the wall times it reports the load average during each host
count's rounds and this machine's CPU (user + system of every process the command started: the
launcher, or pdsh and its ssh clients) per run and per host, with the median of the per-round ratios;
and the nodes' side (every session their sshd reaped during the run: the server's half of each
handshake, the login shell, the command), with the least wall time that CPU allows on this bed, where
the nodes and this machine share the same cores.
128 hosts take about 4 minutes here with --no-sequential (the one-after-another runs would take longer
than all the rest).

The nodes' login shell reads a stock ~/.bashrc by default (Debian's and Ubuntu's /etc/skel one,
which returns at once in a shell that is not interactive), bind-mounted over this machine's in each
node's mount namespace. `--node-bashrc machine` keeps this machine's own: on the team's machines it
runs `pyenv init` in every SSH command's shell (0.1 CPU-s each), which then outweighs every
launcher's own work.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

from _common import STOCK_BASHRC  # noqa: E402
from testbed import TestBed, session_slot  # noqa: E402

# What a launcher built on paramiko cannot beat: import paramiko, connect to every host in a
# thread pool, run the command, close. The gap between this and `clusterddp exec` is our own
# overhead (CLI, inventory validation, setup/env rendering).
PARAMIKO_POOL = r"""
import sys
from concurrent.futures import ThreadPoolExecutor
import paramiko
key, known, *addrs = sys.argv[1:]
def one(a):
    c = paramiko.SSHClient()
    c.load_host_keys(known)
    c.set_missing_host_key_policy(paramiko.RejectPolicy())
    c.connect(a, username="root", key_filename=[key])
    ch = c.get_transport().open_session()
    ch.exec_command("true")
    code = ch.recv_exit_status()
    c.close()
    return code
with ThreadPoolExecutor(32) as pool:
    sys.exit(max(pool.map(one, addrs)))
"""


CPU: dict[str, list[float]] = {}  # the CPU seconds (user + system) of each tool's runs on this machine's side
NODE_CPU: dict[str, list[float]] = {}  # and on the nodes' side: their sshd's sessions (handshake, login shell, `true`)
SSHD_PIDS: list[int] = []  # each node's listening sshd (set once the bed is up)
REAPED_S = 0.3  # a node's sshd reaps a session a moment after the client has gone


def nodes_cpu() -> float:
    """CPU seconds of every SSH session the nodes' sshd have reaped so far (cutime + cstime): each
    connection's key exchange and authentication on the node's side, its login shell and command."""
    total = 0
    for pid in SSHD_PIDS:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[13]) + int(fields[14])
    return total / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd: list[str], env: dict | None = None, shell: bool = False, cpu: str | None = None,
          nodes: bool = True) -> float:
    """The wall time of ``cmd``; its CPU (the launcher's side: every process it started) kept under ``cpu``,
    and, with ``nodes``, the nodes' side too."""
    nodes = nodes and cpu is not None
    n0 = nodes_cpu() if nodes else 0.0
    c0, t0 = children_cpu(), time.perf_counter()
    r = subprocess.run(cmd if not shell else " ".join(cmd), shell=shell, env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True)
    took = time.perf_counter() - t0
    if cpu is not None:
        CPU.setdefault(cpu, []).append(children_cpu() - c0)
    if nodes:
        time.sleep(REAPED_S)
        NODE_CPU.setdefault(cpu, []).append(nodes_cpu() - n0)
    if r.returncode != 0:
        raise SystemExit(f"benchmark command failed (exit {r.returncode}): {cmd if not shell else cmd}\n{r.stderr}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, nargs="+", default=[4, 16, 32])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--node-bashrc", choices=["stock", "machine"], default="stock",
                    help="the nodes' ~/.bashrc: a stock one (default) or this machine's own")
    ap.add_argument("--no-sequential", action="store_true", help="skip the two one-after-another runs")
    ap.add_argument("--out", type=Path, default=REPO / "bench", help="where results-exec.json and the plot go")
    args = ap.parse_args()
    if shutil.which("pdsh") is None:
        raise SystemExit("pdsh is not installed (apt-get install pdsh)")
    n_max = max(args.hosts)
    # What an installed clusterddp runs: byte-compiled. An editable checkout under
    # PYTHONDONTWRITEBYTECODE=1 would otherwise compile its modules again in every run (~0.07 s).
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "clusterddp")], check=True)
    load_before = os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix="cddp-bench-"))
    bed = TestBed(n_max, root / "bed", prefix=f"cd{session_slot()}x", subnet=f"10.{100 + session_slot()}.250",
                  login_rc=STOCK_BASHRC if args.node_bashrc == "stock" else None)
    results: dict[int, dict[str, list[float]]] = {}
    loads: dict[int, list[float]] = {}
    with bed:
        SSHD_PIDS[:] = [int((bed.root / x.name / "sshd.pid").read_text()) for x in bed.nodes]
        ssh_opts = (f"-i {bed.identity_file} -o UserKnownHostsFile={bed.known_hosts} "
                    "-o StrictHostKeyChecking=yes -o BatchMode=yes")
        pdsh_env = {**os.environ, "PDSH_SSH_ARGS_APPEND": ssh_opts}
        if args.node_bashrc == "stock":  # the bind mount took: a node's shell reads the stock file
            seen = subprocess.run(f"ssh {ssh_opts} root@{bed.nodes[0].address} 'cat ~/.bashrc'", shell=True,
                                  check=True, capture_output=True, text=True).stdout
            assert seen == STOCK_BASHRC, f"the nodes' ~/.bashrc is not the stock one:\n{seen}"
        mux = f"-o ControlPath={root}/cm-%h"
        for x in bed.nodes:  # one persistent master connection per host, for the floor below
            subprocess.run(f"ssh {ssh_opts} {mux} -o ControlMaster=yes -o ControlPersist=yes -fN root@{x.address}",
                           shell=True, check=True)
        mux_env = {**os.environ, "PDSH_SSH_ARGS_APPEND": f"{mux} -o ControlMaster=no -o BatchMode=yes"}
        py = [sys.executable, "-m", "clusterddp", "exec"]
        for n in args.hosts:
            nodes = bed.nodes[:n]
            inv = bed.write_inventory(root / f"inv{n}.yaml", nodes)
            addrs = ",".join(x.address for x in nodes)
            # Defaults bind this round's values (B023); the lambdas only run within the round anyway.
            tools = {
                "clusterddp": lambda inv=inv, n=n: timed([*py, str(inv), "--", "true"], cpu=f"clusterddp {n}"),
                "pdsh": lambda addrs=addrs, n=n: timed(["pdsh", "-R", "ssh", "-l", "root", "-w", addrs, "true"],
                                                       env=pdsh_env, cpu=f"pdsh {n}"),
                "paramiko pool": lambda nodes=nodes: timed([sys.executable, "-c", PARAMIKO_POOL, str(bed.identity_file),
                                                            str(bed.known_hosts), *(x.address for x in nodes)]),
                "mux floor": lambda addrs=addrs, n=n: timed(["pdsh", "-R", "ssh", "-l", "root", "-w", addrs, "true"],
                                                            env=mux_env, cpu=f"mux floor {n}", nodes=False),
            }
            if not args.no_sequential:
                tools["sequential"] = lambda inv=inv: timed([*py, str(inv), "--fanout", "1", "--", "true"])
                loop = f"for a in {' '.join(x.address for x in nodes)}; do ssh {ssh_opts} root@$a true || exit 1; done"
                tools["ssh loop"] = lambda loop=loop: timed(["bash", "-c", loop])
            for f in tools.values():  # warm up: page cache, sshd's first fork, known_hosts
                f()
            for k in ("clusterddp", "pdsh", "mux floor"):
                CPU.pop(f"{k} {n}", None)
                NODE_CPU.pop(f"{k} {n}", None)  # (none for the mux floor: its sessions are its masters')
            times: dict[str, list[float]] = {k: [] for k in tools}
            loads.setdefault(n, []).append(os.getloadavg()[0])
            for i in range(args.rounds):
                for k in (list(tools) if i % 2 == 0 else list(tools)[::-1]):  # who goes first alternates
                    times[k].append(tools[k]())
                loads[n].append(os.getloadavg()[0])
            results[n] = times
            print(f"{n} hosts: " + ", ".join(f"{k} {statistics.median(v):.2f}s" for k, v in times.items())
                  + f"; load {statistics.median(loads[n]):.1f}", flush=True)
        for x in bed.nodes:
            subprocess.run(f"ssh {mux} -O exit root@{x.address}", shell=True, stderr=subprocess.DEVNULL)
    shutil.rmtree(root, ignore_errors=True)
    report(results, args, load_before, loads)


def report(results: dict[int, dict[str, list[float]]], args: argparse.Namespace,
           load_before: tuple[float, float, float], loads: dict[int, list[float]]) -> None:
    med = {n: {k: statistics.median(v) for k, v in t.items()} for n, t in results.items()}
    print("\nthis machine's CPU (user + system, every process the command started; medians) and load average:")
    print("| hosts | load (median of the rounds) | clusterddp exec | per host | pdsh | per host "
          "| per-round ratio vs pdsh |")
    print("|---|---|---|---|---|---|---|")
    for n, t in results.items():
        ours, theirs = statistics.median(CPU[f"clusterddp {n}"]), statistics.median(CPU[f"pdsh {n}"])
        per = statistics.median(a / b for a, b in zip(t["clusterddp"], t["pdsh"], strict=True))
        print(f"| {n} | {statistics.median(loads[n]):.1f} | {ours:.2f} s | {ours / n * 1000:.1f} ms | {theirs:.2f} s | "
              f"{theirs / n * 1000:.1f} ms | {per:.2f} |")
    print("\nthe nodes' side (their sshd's sessions: each connection's handshake, login shell and command; "
          "medians), and what the CPU alone allows: on this bed the nodes and this machine share its cores, so a "
          "command that keeps them busy takes at least (here + nodes) / cores; on real machines each node's part "
          "runs on that node")
    print("| hosts | clusterddp: here + nodes | pdsh: here + nodes | mux floor: here + nodes | CPU ratio vs pdsh "
          "| the CPU's least wall time: clusterddp / pdsh | its measured wall |")
    print("|---|---|---|---|---|---|---|")
    cores = os.cpu_count() or 1
    for n in results:
        here = {k: statistics.median(CPU[f"{k} {n}"]) for k in ("clusterddp", "pdsh", "mux floor")}
        there = {k: statistics.median(NODE_CPU[f"{k} {n}"]) for k in ("clusterddp", "pdsh")}
        total = {k: here[k] + there[k] for k in there}
        print(f"| {n} | {here['clusterddp']:.2f} + {there['clusterddp']:.2f} s | {here['pdsh']:.2f} + "
              f"{there['pdsh']:.2f} s | {here['mux floor']:.2f} + (not seen) s | "
              f"{total['clusterddp'] / total['pdsh']:.2f} | {total['clusterddp'] / cores:.2f} / "
              f"{total['pdsh'] / cores:.2f} s | {med[n]['clusterddp']:.2f} / {med[n]['pdsh']:.2f} s |")
    print()
    load = os.getloadavg()
    lines = [f"nodes' ~/.bashrc: {args.node_bashrc}; cores: {os.cpu_count()}, "
             f"load average before the run: {load_before[0]:.1f}, after: "
             f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; median of {args.rounds} interleaved rounds, seconds", "",
             "| hosts | clusterddp exec | pdsh | ratio vs pdsh | bare paramiko pool (ratio) | mux floor (ratio) | "
             "sequential (--fanout 1) | ssh loop | ratio vs sequential |", "|---|---|---|---|---|---|---|---|---|"]
    for n, m in med.items():
        seq = m.get("sequential")
        lines.append(f"| {n} | {m['clusterddp']:.2f} | {m['pdsh']:.2f} | {m['clusterddp'] / m['pdsh']:.2f} | "
                     f"{m['paramiko pool']:.2f} ({m['paramiko pool'] / m['pdsh']:.2f}) | "
                     f"{m['mux floor']:.2f} ({m['mux floor'] / m['pdsh']:.2f}) | "
                     + (f"{seq:.2f} | {m['ssh loop']:.2f} | {m['clusterddp'] / seq:.2f} |" if seq else "- | - | - |"))
    print("\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results-exec.json").write_text(json.dumps(
        {"node_bashrc": args.node_bashrc, "cores": os.cpu_count(), "load_before": load_before, "load": load,
         "rounds": args.rounds, "loads": {str(n): v for n, v in loads.items()}, "cpu": CPU, "node_cpu": NODE_CPU,
         "seconds": {str(n): t for n, t in results.items()}}, indent=1))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no plot)")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    ns = list(med)
    for k, style in (("clusterddp", "o-"), ("pdsh", "s-"), ("paramiko pool", "x:"), ("mux floor", "+:"),
                     ("sequential", "^--"), ("ssh loop", "v--")):
        if all(k in med[n] for n in ns):
            ax.plot(ns, [med[n][k] for n in ns], style, label="clusterddp exec --fanout 1" if k == "sequential"
                    else "clusterddp exec" if k == "clusterddp" else k)
    ax.set_xlabel("hosts")
    ax.set_ylabel("wall time, s (median)")
    ax.set_title("`exec -- true` on N test-bed hosts")
    ax.set_xticks(ns)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "exec-fanout.png", dpi=100)
    print(f"plot: {args.out / 'exec-fanout.png'}")


if __name__ == "__main__":
    main()
