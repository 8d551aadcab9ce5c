"""The first build of a `packages:` environment on N nodes from pushed wheels, against doing it by hand.

Starts a network-namespace test bed (tests/testbed.py; root needed), makes a bare base Python (no pip,
no torch), fetches the lock's wheels into the launcher's cache once (an untimed warm-up build), then
times, interleaved round by round, every node starting empty (its environments, wheel store and uv
cache removed before each run):

  by hand, uv     `scp` of the lock's wheels and the lock to every node, then on every node
                  `uv venv` + `uv pip install --offline --no-index --find-links`, all nodes in parallel
                  (uv already on the nodes: a hand-typer installed it once; its copy is not timed)
  by hand, uv, then imported
                  the same, then `env/bin/python -c 'import torch'` on every node: the check env build makes
                  before it takes an environment (the first import of torch compiles its modules: 5-25 s
                  on a loaded machine, which the job's first start pays otherwise)
  by hand, pip    the same copy, then `python -m venv` + `pip install --no-index --find-links`
  env build       `clusterddp env build INVENTORY` (wheels sent over its own connections, sha256-checked
                  on arrival, uv sent too, the environment built in a temporary folder, verified,
                  renamed into place)

Goal (issue 42): env build <= 1.0x by hand with uv; by hand with pip: reported.

    python bench/envs_build.py [--nodes 4] [--rounds 3] [--lock torch|small] [--no-pip]
    python bench/envs_build.py --bytes 1 4 16 --lock small     # bytes sent and time for N nodes
    python bench/envs_build.py --trace [--nodes 4]             # where one build's time goes

``--trace``: one `env build` run in this process with its phases timed (the launcher's start, the look at
every node, each node's wheels sent, each node's build and, inside it, what the node says it took).

``--lock small``: a few small wheels (numpy, the test's tiny wheel) instead of CPU torch and its
dependencies (about 420 MiB a node); for the bytes table at 16 nodes where torch would need ~18 GiB.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "envs"), str(REPO / "bench")]

from _common import STOCK_BASHRC, interleave  # noqa: E402
from envbed import TORCH_LOCK  # noqa: E402
from testbed import TestBed, session_slot  # noqa: E402
from tinywheel import make_wheel  # noqa: E402

LOCKS = {
    "torch": TORCH_LOCK,
    "small": """\
cddptiny==1.0
numpy==2.3.5
""",
}


def sh(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}{r.stderr}")
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lock", choices=sorted(LOCKS), default="torch")
    ap.add_argument("--no-pip", action="store_true", help="leave the `pip install` by hand out")
    ap.add_argument("--bytes", type=int, nargs="*", metavar="N",
                    help="instead: one `env build` on N nodes for each N given; bytes sent and time")
    ap.add_argument("--trace", action="store_true", help="instead: one `env build` with its phases timed")
    ap.add_argument("--cache", help="the launcher's wheel cache (default: a fresh one)")
    ap.add_argument("--traced-build", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.traced_build:
        return traced_build(a.traced_build)
    n = max([a.nodes, *(a.bytes or [])])
    root = Path(tempfile.mkdtemp(prefix="bench-envb-"))
    base = root / "base"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(base)], check=True)
    make_wheel(root / "wheels")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CLUSTERDDP_CACHE": a.cache or str(root / "cache"),
           "PIP_FIND_LINKS": " ".join(x for x in (os.environ.get("PIP_FIND_LINKS", ""), str(root / "wheels")) if x)}
    cache = Path(env["CLUSTERDDP_CACHE"])
    lock = root / "requirements.txt"
    lock.write_text(LOCKS[a.lock])
    slot = session_slot()
    try:
        with TestBed(n, root / "bed", prefix=f"cd{slot}b", subnet=f"10.{100 + slot}.0", login_rc=STOCK_BASHRC) as bed:
            nodes = bed.nodes
            workdir = {x.name: root / x.name for x in nodes}

            def inventory(hosts: int) -> Path:
                inv = bed.write_inventory(root / f"inv{hosts}.yaml", nodes[:hosts],
                                          defaults_extra={"python": str(base / "bin" / "python"),
                                                          "packages": lock.name})
                doc = yaml.safe_load(inv.read_text())
                for h in doc["hosts"]:
                    h["workdir"] = str(workdir[h["name"]])
                inv.write_text(yaml.safe_dump(doc, sort_keys=False))
                return inv

            def wipe() -> None:
                for w in workdir.values():
                    subprocess.run(["rm", "-rf", str(w)], check=True)
                    w.mkdir()
                    (w / "bin").mkdir()
                    if uv_bin:
                        os.link(uv_bin, w / "bin" / "uv")  # the hand-typer's uv, there before the clock starts

            def env_build(hosts: int) -> str:
                return sh([sys.executable, "-m", "clusterddp", "env", "build", str(inventory(hosts))], env=env).stdout

            # warm-up: the launcher's cache gets every wheel (pip download), untimed
            uv_bin = None
            wipe()
            print(env_build(1).strip())
            listed = [p for p in (cache / "locks").glob("*.json") if not p.name.startswith("uv-")]
            wheels = [cache / "wheels" / s / f for s, f, _ in json.loads(listed[0].read_text())]
            uv_wheel = next((cache / "wheels").glob("*/uv-*.whl"))
            sh(["python", "-m", "zipfile", "-e", str(uv_wheel), str(root / "uvwheel")])
            uv_bin = next((root / "uvwheel").glob("*.data/scripts/uv"))
            uv_bin.chmod(0o755)
            size = sum(w.stat().st_size for w in wheels)
            wipe()
            uv_size = uv_wheel.stat().st_size
            print(f"the lock: {len(wheels)} wheels, {size / 2**20:.1f} MiB; uv {uv_size / 2**20:.1f} MiB")
            ssh = ["-i", str(bed.identity_file), "-o", f"UserKnownHostsFile={bed.known_hosts}",
                   "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"]

            check = "import torch" if a.lock == "torch" else "import cddptiny, numpy"

            def by_hand(installer: str, hosts: int, verify: bool = False) -> None:
                def one(x) -> None:
                    w = workdir[x.name]
                    sh(["scp", "-q", *ssh, *map(str, wheels), str(lock), f"root@{x.address}:{w}/"])
                    if installer == "uv":
                        cmd = (f"cd {w} && export UV_CACHE_DIR={w}/uvcache && bin/uv venv -q -p {base}/bin/python env"
                               f" && bin/uv pip install -q --offline --no-index --find-links . -r requirements.txt"
                               f" --python env/bin/python")
                    else:
                        cmd = (f"cd {w} && {sys._base_executable} -m venv env && env/bin/pip install -q"  # type: ignore[attr-defined]
                               f" --no-index --no-cache-dir --find-links . -r requirements.txt")
                    if verify:  # what env build does before it takes an environment: its modules imported
                        cmd += f" && env/bin/python -c '{check}'"
                    sh(["ssh", *ssh, f"root@{x.address}", cmd])
                with concurrent.futures.ThreadPoolExecutor(hosts) as pool:
                    list(pool.map(one, nodes[:hosts]))

            if a.trace:
                t = time.perf_counter()
                out = subprocess.run([sys.executable, __file__, "--traced-build", str(inventory(a.nodes))], env=env,
                                     capture_output=True, text=True)
                print(out.stdout + out.stderr + f"whole command: {time.perf_counter() - t:.2f} s (load "
                      f"{os.getloadavg()[0]:.1f})")
                return
            if a.bytes:
                print("| nodes | sent | time |")
                print("|---|---|---|")
                for k in a.bytes:
                    wipe()
                    t = time.perf_counter()
                    out = env_build(k)
                    took = time.perf_counter() - t
                    sent = out.split("sent ")[-1].strip().rstrip(")") if "sent " in out else "?"
                    print(f"| {k} | {sent} | {took:.1f} s |")
                return
            by_hand("uv", a.nodes)  # the hand-typed commands warmed up too
            tools = {"by hand, uv": lambda: by_hand("uv", a.nodes), "env build": lambda: env_build(a.nodes),
                     "by hand, uv, then imported": lambda: by_hand("uv", a.nodes, verify=True)}
            if not a.no_pip:
                tools["by hand, pip"] = lambda: by_hand("pip", a.nodes)
            print(f"{a.nodes} nodes, load {os.getloadavg()[0]:.1f}")
            interleave(tools, a.rounds, before_each=wipe)
            print(f"load after: {os.getloadavg()[0]:.1f}")
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)


def traced_build(inventory: str) -> None:
    """`clusterddp env build INVENTORY` in this process, each phase's wall time printed as it ends."""
    t0 = time.perf_counter()
    import clusterddp.envs.nodes as nodes
    from clusterddp.cli.app import app
    print(f"imports: {time.perf_counter() - t0:.2f} s")

    def timed(name: str, fn, label):
        def wrapper(*args, **kw):
            t = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                print(f"{label(*args)} {name}: {time.perf_counter() - t:.2f} s (at {time.perf_counter() - t0:.2f} s)")
        return wrapper
    nodes.survey = timed("look (every node)", nodes.survey, lambda *a: "")
    nodes.push = timed("wheels sent", nodes.push, lambda fleet, plan, *a: plan.host.name)
    real_build = nodes.build

    def build(fleet, plan, *a, **kw):
        ans = real_build(fleet, plan, *a, **kw)
        print(f"{plan.host.name} the node's own build: {ans.get('seconds')} s")
        return ans
    nodes.build = timed("build", build, lambda fleet, plan, *a: plan.host.name)
    try:
        app(["env", "build", inventory], standalone_mode=False)
    finally:
        print(f"in process: {time.perf_counter() - t0:.2f} s")


if __name__ == "__main__":
    main()
