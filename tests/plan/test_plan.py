"""Planning is pure: the rendered per-node scripts and commands are compared to golden files.

Regenerate after an intended change with ``UPDATE_GOLDEN=1 pytest tests/plan/test_plan.py`` (never in
CI: there it fails) and read the diff before committing it; the tests that rewrote a file xfail,
naming it.
"""

from __future__ import annotations

import difflib
import os
import subprocess
from pathlib import Path

import pytest

from clusterddp import inventory, node, plan
from clusterddp import nodescript as node_script
from clusterddp.check import probe_command, reach_command
from clusterddp.collective import collective_command
from clusterddp.envdiff import envinfo_command
from clusterddp.exec_ import exec_command
from clusterddp.leases import lease_command, lease_release_command, queue_leave_command
from clusterddp.mirror import seed_command
from clusterddp.nodescript import NodeCommand, q, qpath, shell_word, torchrun_start, worker_command
from clusterddp.plan import build_plan
from clusterddp.runspec import RunSpec
from helpers import resolved

GOLDEN = Path(__file__).parent.parent / "golden"
RUN_ID = "20261129-120000-abcd"
INV = """
defaults:
  user: ubuntu
  gpus: 2
  python: /opt/venv/bin/python
  workdir: ~/cddp work
  env: {NCCL_DEBUG: WARN, QUOTED: "it's $HOME; `x`"}
  setup: ["source ~/venv/bin/activate", "export A=1"]
collect: ["checkpoints/**"]
hosts:
  - {name: gpu-01, address: 10.0.0.11}
  - {name: gpu-02, address: 10.0.0.12, gpus: auto, env: {GLOO_SOCKET_IFNAME: eth9}}
"""
HOSTILE = ("--msg", "two words", "it's", '"dq"', "$(touch /tmp/pwned)", "a;b|c&d", "naïve ü", "", "*")


def _flag(name: str) -> bool:
    """Set, and not 0/false/no (tests/conftest.py reads CI the same way)."""
    return os.environ.get(name, "").lower() not in ("", "0", "false", "no")


def golden(name: str, text: str) -> None:
    """Compare ``text`` with tests/golden/<name>. With UPDATE_GOLDEN (outside CI) rewrite the file
    instead and xfail, so a run that rewrote golden files never reads as a passing one."""
    path = GOLDEN / name
    if _flag("UPDATE_GOLDEN"):
        if _flag("CI"):  # else a CI run with UPDATE_GOLDEN compares every file with itself and passes
            pytest.fail(f"UPDATE_GOLDEN={os.environ['UPDATE_GOLDEN']!r} with CI={os.environ['CI']!r}: golden files "
                        "are never rewritten in CI; regenerate them on your machine and commit the reviewed diff",
                        pytrace=False)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            pytest.xfail(f"UPDATE_GOLDEN rewrote tests/golden/{name}: review `git diff tests/golden` before committing")
        return
    if not path.exists():
        pytest.fail(f"tests/golden/{name} is missing: write it with UPDATE_GOLDEN=1 (outside CI) and review it",
                    pytrace=False)
    want = path.read_text()
    if text != want:
        diff = difflib.unified_diff(want.splitlines(True), text.splitlines(True), f"tests/golden/{name}",
                                    "rendered now")
        pytest.fail(f"{name} differs from its golden file; if the change is intended, rerun with UPDATE_GOLDEN=1 "
                    f"(outside CI) and review the diff:\n{''.join(diff)}", pytrace=False)


def two_node_plan(**spec):
    inv = inventory.parse(INV, "inv.yaml")
    return build_plan(inv, resolved(RunSpec("train/t.py", HOSTILE, collect=("logs/*.txt",), **spec), inv), RUN_ID)


def test_two_node_plan_matches_golden():
    golden("two_nodes.txt", plan.render(two_node_plan()))


def test_two_node_plan_summary_matches_golden():
    """`up --dry-run`'s summary (issue 39, section 5); the full scripts stay golden-tested above."""
    golden("two_nodes_summary.txt", plan.summary(two_node_plan()))


def test_the_summary_command_reads_as_torchrun_and_names_clusterddps_own_python():
    argv = (*torchrun_start("/py"), "--nnodes", "2", "--no-python",
            *worker_command("/py", "t.py", ["a b"], "--local_rank"))
    assert plan.readable_command(argv) == ("/py -m torch.distributed.run --nnodes 2 --no-python /py -S "
                                           "<clusterddp's Python: --dry-run --full shows it> --local_rank t.py 'a b'")


def test_local_plan_matches_golden():
    inv = inventory.local(gpus=2, python="/usr/bin/python3")
    p = build_plan(inv, resolved(RunSpec("t.py", ("--epochs", "1")), inv), RUN_ID, local_run_dir="/home/me/proj",
                   local_control_dir="/home/me/proj/runs/x/node")
    golden("local.txt", plan.render(p))


def test_node_ranks_master_and_flags():
    p = two_node_plan(gpus=3, master_port=29999, env=(("NCCL_DEBUG", "INFO"),))
    a, b = p.nodes
    assert (a.node_rank, b.node_rank) == (0, 1)
    for n in (a, b):
        argv = list(n.argv)
        assert argv[argv.index("--master-addr") + 1] == "10.0.0.11"
        assert argv[argv.index("--master-port") + 1] == "29999"
        assert argv[argv.index("--nproc-per-node") + 1] == "3"  # --gpus beats host and defaults
        assert argv[argv.index("--max-restarts") + 1] == "0"
        assert dict(n.env)["NCCL_DEBUG"] == "INFO"  # -e beats the inventory
    assert p.collect == ("checkpoints/**", "logs/*.txt")


def test_a_local_run_meets_on_a_static_rendezvous_unless_it_restarts():
    inv = inventory.local(gpus=2, python="/usr/bin/python3")
    where = dict(local_run_dir="/home/me/proj", local_control_dir="/home/me/proj/runs/x/node")
    argv = list(build_plan(inv, resolved(RunSpec("t.py", (), master_port=40123), inv), RUN_ID, **where).nodes[0].argv)
    assert "--standalone" not in argv and "--rdzv-backend" not in argv
    assert argv[argv.index("--master-addr") + 1] == "127.0.0.1" and argv[argv.index("--master-port") + 1] == "40123"
    # A static store hands a restarted group the last attempt's keys (gloo's connectFullMesh then
    # fails once more): restarts keep c10d's rounds, on a port torchrun finds itself.
    argv = list(build_plan(inv, resolved(RunSpec("t.py", (), max_restarts=1), inv), RUN_ID, **where).nodes[0].argv)
    assert "--standalone" in argv and "--master-port" not in argv


def test_the_master_is_node_rank_0_wherever_the_inventory_lists_it():
    inv = inventory.parse(INV + "master: {host: gpu-02}\n", "inv.yaml")
    p = build_plan(inv, resolved(RunSpec("t.py", ()), inv), RUN_ID)
    assert [(n.host.name, n.node_rank) for n in p.nodes] == [("gpu-02", 0), ("gpu-01", 1)]
    for n in p.nodes:
        argv = list(n.argv)
        assert argv[argv.index("--node-rank") + 1] == str(n.node_rank)
        assert argv[argv.index("--master-addr") + 1] == "10.0.0.12"


def test_restarts_use_c10d_rendezvous_and_a_fresh_store_per_attempt():
    p = two_node_plan(max_restarts=2)
    for n in p.nodes:
        argv = list(n.argv)
        assert argv[argv.index("--max-restarts") + 1] == "2"
        assert argv[argv.index("--rdzv-backend") + 1] == "c10d"
        assert argv[argv.index("--rdzv-endpoint") + 1] == "10.0.0.11:29500"
        assert argv[argv.index("--rdzv-id") + 1] == RUN_ID and "--node-rank" not in argv
        assert dict(n.env)["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
        assert '--local-addr "$LOCAL_ADDR"' in n.launch_script and "LOCAL_ADDR=$(ip" in n.launch_script
    golden("two_nodes_restarts.txt", plan.render(p))


def test_only_the_nodes_that_do_not_serve_the_rendezvous_store_wait_for_it(tmp_path):
    """Node 0 (the master) serves the store; every other node's torchrun line waits for it
    (tests/nodescript/test_torchrun_start.py runs that line); a local run has no one to wait for."""
    for p in (two_node_plan(), two_node_plan(max_restarts=1)):
        a, b = p.nodes
        start = " ".join(map(shell_word, torchrun_start(a.host.python)))

        def line(node: plan.NodeLaunch, start: str = start) -> str:
            return next(ln for ln in node.launch_script.splitlines() if start in ln)
        assert line(a).startswith(start) and line(b).startswith(f"CLUSTERDDP_STORE=10.0.0.11:29500 {start}")
        assert all(f"{node_script.TORCHRUN_VAR}=" in n.launch_script for n in p.nodes)
    inv = inventory.parse(INV, "inv.yaml")
    local = build_plan(inv, resolved(RunSpec("t.py", ()), inv), RUN_ID, local_run_dir=str(tmp_path),
                       local_control_dir=str(tmp_path))
    assert "CLUSTERDDP_STORE=" not in local.nodes[0].launch_script

def test_interface_detection_only_for_variables_the_inventory_leaves_unset():
    a, b = two_node_plan().nodes
    assert 'export GLOO_SOCKET_IFNAME="$IFACE"' in a.launch_script
    assert 'export GLOO_SOCKET_IFNAME="$IFACE"' not in b.launch_script
    assert "export GLOO_SOCKET_IFNAME=eth9" in b.launch_script
    assert 'export NCCL_SOCKET_IFNAME="$IFACE"' in b.launch_script


def test_rendered_argv_survives_the_shell_byte_for_byte(tmp_path):
    """Run the rendered torchrun line through bash with a fake python that prints its argv."""
    fake = tmp_path / "py"
    fake.write_text("#!/bin/sh\nfor a in \"$@\"; do printf '%s\\0' \"$a\"; done\n")
    fake.chmod(0o755)
    inv = inventory.parse(INV.replace("/opt/venv/bin/python", str(fake)), "inv.yaml")
    node = build_plan(inv, resolved(RunSpec("t.py", HOSTILE), inv), RUN_ID).nodes[0]
    # the torchrun line (the rank sampler's line starts with the same python)
    line = next(ln for ln in node.launch_script.splitlines() if ln.startswith(q(str(fake)) + " -c "))
    out = subprocess.run(["bash", "-c", line], capture_output=True, check=True, cwd=tmp_path).stdout
    argv = out.split(b"\0")[:-1]
    assert [a.decode() for a in argv[-len(HOSTILE):]] == list(HOSTILE)
    assert not Path("/tmp/pwned").exists()


def test_only_clusterddps_own_words_expand_a_script_argument_nproc_stays_literal(tmp_path):
    """launch.sh double-quotes its own $NPROC and $LOCAL_ADDR so they expand; the same words given as
    script arguments are user words, quoted like any other, and reach the script as typed."""
    fake = tmp_path / "py"
    fake.write_text("#!/bin/sh\nfor a in \"$@\"; do printf '%s\\0' \"$a\"; done\n")
    fake.chmod(0o755)
    inv = inventory.parse(INV.replace("/opt/venv/bin/python", str(fake)), "inv.yaml")
    user = ("$NPROC", "$LOCAL_ADDR", "${NPROC}")
    node = build_plan(inv, resolved(RunSpec("t.py", user, max_restarts=1), inv), RUN_ID).nodes[1]  # gpus: auto
    line = next(ln for ln in node.launch_script.splitlines() if f" {q(str(fake))} -c " in ln)
    assert line.startswith("CLUSTERDDP_STORE=10.0.0.11:29500 ")  # node 1 waits for the master's store
    out = subprocess.run(["bash", "-c", f"NPROC=7 LOCAL_ADDR=10.9.9.9\n{line}"], capture_output=True, check=True,
                         cwd=tmp_path).stdout
    argv = [a.decode() for a in out.split(b"\0")[:-1]]
    assert argv[argv.index("--nproc-per-node") + 1] == "7" and argv[argv.index("--local-addr") + 1] == "10.9.9.9"
    assert argv[-len(user):] == list(user)
    # without restarts nothing of clusterddp's reads LOCAL_ADDR: a user's word must not make launch.sh probe it
    plain = build_plan(inv, resolved(RunSpec("t.py", ("$LOCAL_ADDR",)), inv), RUN_ID).nodes[0]
    assert "LOCAL_ADDR=" not in plain.launch_script and any(  # the torchrun line (the rank sampler's end after it)
        ln.endswith("t.py '$LOCAL_ADDR'") for ln in plain.launch_script.rstrip().splitlines()[-3:])


def test_env_values_survive_the_shell_byte_for_byte():
    node = two_node_plan().nodes[0]
    exports = "\n".join(ln for ln in node.launch_script.splitlines() if ln.startswith("export QUOTED="))
    out = subprocess.run(["bash", "-c", exports + '\nprintf %s "$QUOTED"'], capture_output=True, check=True)
    assert out.stdout.decode() == "it's $HOME; `x`"


@pytest.mark.parametrize("path, rendered", [
    ("~/a b", '"$HOME"/\'a b\''), ("~", '"$HOME"'), ("/abs/x", "/abs/x"), ("rel;x", "'rel;x'"),
])
def test_qpath_expands_only_a_leading_home(path, rendered):
    assert qpath(path) == rendered


def test_launch_script_is_valid_bash():
    for n in two_node_plan().nodes:
        subprocess.run(["bash", "-n"], input=n.launch_script.encode(), check=True)


def test_golden_never_rewrites_in_ci_and_a_rewrite_never_passes(tmp_path, monkeypatch):
    monkeypatch.setitem(globals(), "GOLDEN", tmp_path)
    (tmp_path / "g.txt").write_text("old\n")
    monkeypatch.setenv("UPDATE_GOLDEN", "1")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="golden files are never rewritten in CI"):
        golden("g.txt", "new\n")
    assert (tmp_path / "g.txt").read_text() == "old\n"
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.xfail.Exception, match="rewrote tests/golden/g.txt"):
        golden("g.txt", "new\n")
    assert (tmp_path / "g.txt").read_text() == "new\n"
    golden("g.txt", "new\n")  # nothing to rewrite: passes
    monkeypatch.delenv("UPDATE_GOLDEN")
    with pytest.raises(pytest.fail.Exception, match=r"(?s)differs from its golden file.*-new\n\+newer"):
        golden("g.txt", "newer\n")


# ---- every command sent to a node ----

# Hosts whose setup lines, env values, workdir and python path hold what a shell could misread.
CMD_INV = r"""
defaults:
  user: ubuntu
  gpus: 2
  python: /opt/venv/bin/python
  workdir: ~/cddp work
  env: {NCCL_DEBUG: WARN, QUOTED: "it's $HOME; `x`", DQ: '"dq" \ $(touch /tmp/pwned-env) 50%'}
  setup: ["source ~/venv/bin/activate", "export STAGE=\"it's $HOME\" && test -n \"`echo x`\""]
hosts:
  - {name: gpu-01, address: 10.0.0.11}
  - {name: gpu-02, address: 10.0.0.12, workdir: "/srv/o'neil $USER", python: "/opt/my env/bin/python3",
     env: {GLOO_SOCKET_IFNAME: eth9}}
"""
# What a user passes to `clusterddp exec`: the remote shell interprets it, by design.
EXEC_WORDS = ("du", "-sh", "~/clusterddp/runs/*", "|", "sort", "-h")
# Node-side Python sent inside commands: shown once at the end of the golden file.
SNIPPETS = {f"clusterddp/node/{p}.py": node.source(p) for p in node.PROGRAMS}


COLLECTIVE_ARGS = {"rank": 1, "world": 2, "addr": "10.0.0.11", "port": 29500, "sizes": [1024], "gloo_max": 1024,
                   "join_s": 20.0, "op_s": 0.5, "budget_s": 0.1, "limit_s": 100.0}


def node_commands() -> list[tuple[str, str | NodeCommand]]:
    """(header naming the function and its arguments, the command) for every command clusterddp
    sends to a node: a run's steps (supervisor, control, artifacts), check's and up's probe, exec
    (those two with the stdin that carries their env)."""
    inv = inventory.parse(CMD_INV, "cmd.yaml")
    p = build_plan(inv, resolved(RunSpec("train/t.py", HOSTILE, env=(("RUN_ONLY", "-e's $value"),)), inv), RUN_ID)
    out = []
    for n in p.nodes:
        h = n.host.name
        out += [
            (f"start_node_command({h}, upload=True, leased=True, 1234)  # a leased run's start",
             plan.start_node_command(n, True, True, 1234)[0]),
            (f"start_node_command({h}, upload=False, leased=False, 1234)  # up local",
             plan.start_node_command(n, False, False, 1234)[0]),
            (f"follow_command({h})", plan.follow_command(n)),
            (f"follow_command({h}, from_line=42, poll=0.5)", plan.follow_command(n, 42, 0.5)),
            (f"status_command({h})", plan.status_command(n)),
            (f"teardown_command({h})", plan.teardown_command(n)),
            (f"teardown_command({h}, grace=0.05)", plan.teardown_command(n, 0.05)),
            (f"teardown_command({h}, mark_stop=True)  # clusterddp stop", plan.teardown_command(n, mark_stop=True)),
            (f"notify_arm_command({h})  # up --detach, node 0", plan.notify_arm_command(n)),
            (f"collect_command({h})", plan.collect_command(n)),
            (f"seed_command({h}, 'checkpoints/step 8.pt', <sha256>)",
             seed_command(n, "checkpoints/step 8.pt", "0123456789abcdef" * 4)),
            (f"node_log_command({h})", plan.node_log_command(n)),
            (f"lease_release_command({h}, {RUN_ID!r}, <control dir>)",
             lease_release_command(n.host, RUN_ID, n.control_dir)),
        ]
    (a, b), addr = inv.hosts, inv.master.addr
    ea, eb = (n.env for n in p.nodes)
    out += [
        (f"probe_command({a.name}, {addr!r}, 29500)  # check, master", probe_command(a, addr, 29500)),
        (f"probe_command({b.name}, {addr!r}, None)  # check, not the master", probe_command(b, addr, None)),
        (f"probe_command({a.name}, {addr!r}, 29500, full=False, env=<node env>)  # up's preflight, master",
         probe_command(a, addr, 29500, full=False, env=ea)),
        (f"probe_command({b.name}, {addr!r}, None, full=False, env=<node env>)  # up's preflight, not the master",
         probe_command(b, addr, None, full=False, env=eb)),
        (f"exec_command({a.name}, {EXEC_WORDS!r})", exec_command(a, EXEC_WORDS)),
        (f"exec_command({b.name}, {EXEC_WORDS!r})", exec_command(b, EXEC_WORDS)),
        (f"exec_command({a.name}, {EXEC_WORDS!r}, limit=2.5)", exec_command(a, EXEC_WORDS, 2.5)),
        (f"lease_command({a.name}, 'hold')", lease_command(a, "hold")),
        (f"lease_command({b.name}, 'queue')", lease_command(b, "queue")),
        (f"lease_command({b.name}, 'list')", lease_command(b, "list")),
        (f"queue_leave_command({a.name}, <ticket>)", queue_leave_command(a, f"{'1' * 19}-{RUN_ID}")),
        (f"collective_command({b.name}, {addr!r}, {COLLECTIVE_ARGS})  # check --collective",
         collective_command(b, addr, COLLECTIVE_ARGS)),
        (f"envinfo_command({a.name})  # check --diff, no previous run", envinfo_command(a)),
        (f"reach_command({a.name}, 'hooks.example.org', 443, 5)  # check, a notify: webhook",
         reach_command(a, "hooks.example.org", 443, 5)),
        (f"envinfo_command({b.name}, {p.nodes[1].run_dir!r}, ['t.py', 'lib/a b.py'])  # check --diff",
         envinfo_command(b, p.nodes[1].run_dir, ["t.py", "lib/a b.py"])),
    ]
    return out


def test_a_leased_plan_runs_one_process_per_slot_on_its_gpus_and_port():
    inv = inventory.parse(INV, "lab.yaml")
    p = build_plan(inv, resolved(RunSpec("t.py", master_port=29517), inv), RUN_ID,
                   grants={"gpu-01": (1, 3), "gpu-02": (0,)})
    assert p.leased and p.master_port == 29517
    for n, want in zip(p.nodes, ("1,3", "0"), strict=True):
        assert dict(n.env)["CUDA_VISIBLE_DEVICES"] == want and n.nproc == len(want.split(","))
        assert dict(n.env)["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # the order nvidia-smi numbers GPUs in
        assert f"--nproc-per-node {n.nproc} " in n.launch_script and "--master-port 29517 " in n.launch_script
        assert f"export CUDA_VISIBLE_DEVICES={want}" in n.launch_script or \
            f"export CUDA_VISIBLE_DEVICES='{want}'" in n.launch_script
    assert not build_plan(inv, resolved(RunSpec("t.py"), inv), RUN_ID).leased


def test_node_commands_match_golden():
    parts = ["# Every command clusterddp sends to a node, rendered by tests/plan/test_plan.py:node_commands().",
             "# The node-side Python snippets are shown once, at the end, as sent (quoted)."]
    for header, command in node_commands():
        text, stdin = (command, None) if isinstance(command, str) else command
        for name, code in SNIPPETS.items():
            text = text.replace(q(code), f"<{name}>")
        parts += ["", f"== {header} ==", text]
        if stdin is not None:
            parts += ["-- stdin --", stdin.decode() + "-- end of stdin --"]
    for name, code in SNIPPETS.items():
        parts += ["", f"== <{name}> ==", q(code)]
    golden("node_commands.txt", "\n".join(parts) + "\n")


def test_node_commands_are_valid_bash():
    bad = []
    for header, command in node_commands():
        text = command if isinstance(command, str) else command.text
        r = subprocess.run(["bash", "-n"], input=text.encode(), capture_output=True)
        if r.returncode:
            bad.append(f"{header}: {r.stderr.decode().strip()}")
    assert not bad, "\n".join(bad)


def test_exec_runs_setup_first_and_keeps_env_values_byte_for_byte(tmp_path):
    Path("/tmp/pwned-env").unlink(missing_ok=True)
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "activate").write_text("ACTIVATED=yes\n")
    host = inventory.parse(CMD_INV, "cmd.yaml").hosts[0]
    words = ["printf", "'%s\\0'", '"$CLUSTERDDP_HOST"', '"$ACTIVATED"', '"$STAGE"', '"$QUOTED"', '"$DQ"']
    cmd = exec_command(host, words)
    for _, v in host.env:  # the values travel on stdin, never in the command's text (a process argument)
        assert v not in cmd.text and q(v) not in cmd.text
    out = subprocess.run(["bash", "-c", cmd.text], input=cmd.stdin, capture_output=True, check=True,
                         cwd=tmp_path, env={"HOME": str(tmp_path), "PATH": os.environ["PATH"]}).stdout
    assert out.decode().split("\0")[:-1] == [
        "gpu-01", "yes", f"it's {tmp_path}", "it's $HOME; `x`", '"dq" \\ $(touch /tmp/pwned-env) 50%']
    assert not Path("/tmp/pwned-env").exists()
