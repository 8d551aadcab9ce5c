"""The rough edges a new user hits first (issue 13): each message says what happened and what to do."""

from __future__ import annotations

import http.server
import re
import shlex
import socket
import struct
import threading

import pytest

from helpers import REPO, cddp, job_script, run_id_of

INV = "hosts:\n  - {name: gpu-01, address: gpu-01.invalid}\n  - {name: gpu-02, address: gpu-02.invalid}\n"


def test_script_options_before_the_double_dash_get_the_corrected_command(tmp_path):
    (tmp_path / "inv.yaml").write_text(INV)
    (tmp_path / "t.py").write_text("print('hi')\n")
    r = cddp("up", "inv.yaml", "t.py", "--epochs", "1", "--dry-run", "--lr", "0.1 x", cwd=tmp_path, timeout=30)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    said, fix = r.stderr.splitlines()
    assert said == "error: `python -m clusterddp up` has no option --epochs; the script's own arguments go after `--`:"
    assert "Possible options" not in r.stderr  # click's guess (--detach) pointed at the wrong fix
    # the printed command, run as printed, passes both options to the script and keeps up's own
    argv = shlex.split(fix)
    assert argv[:3] == ["python", "-m", "clusterddp"]
    ok = cddp(*argv[3:], cwd=tmp_path, check_rc=0, timeout=30)
    assert argv[3:] == ["up", "inv.yaml", "t.py", "--dry-run", "--", "--epochs", "1", "--lr", "0.1 x"]
    assert "t.py --epochs 1 --lr '0.1 x'" in ok.stdout

    # a typo of up's own option is named as such, the script reading still offered
    r = cddp("up", "inv.yaml", "t.py", "--detch", cwd=tmp_path, timeout=30)
    assert r.returncode == 2 and "has no option --detch (did you mean --detach?)" in r.stderr, r.stderr
    # schedule add takes a script too
    r = cddp("schedule", "add", "n", "--cron", "0 2 * * *", "inv.yaml", "t.py", "--epochs", "1", cwd=tmp_path,
             timeout=30)
    assert r.returncode == 2 and r.stderr.splitlines()[-1] == (
        "  python -m clusterddp schedule add n --cron '0 2 * * *' inv.yaml t.py -- --epochs 1"), r.stderr


def test_a_folder_given_as_the_script_is_named_a_directory_with_the_scripts_it_holds(tmp_path):
    (tmp_path / "inv.yaml").write_text(INV)
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "train.py").write_text("print('hi')\n")
    (tmp_path / "proj" / "notes.txt").write_text("")
    r = cddp("up", "inv.yaml", "proj", "--dry-run", cwd=tmp_path, timeout=30)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.splitlines() == ["error: script proj: is a directory, not a script",
                                     "  hint: pass the training script inside it (one of: proj/train.py); the script's "
                                     "whole folder is uploaded with it"]
    assert not r.stdout  # no run id for a run that never started


@pytest.mark.integration
def test_a_run_the_preflight_refuses_shows_no_run_id_and_leaves_no_record(bed, tmp_path):
    job = job_script(tmp_path, "t.py", "print('never runs')\n")
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    inv = bed.write_inventory(tmp_path / "inv.yaml", defaults_extra={"known_hosts": str(empty)})
    runs = tmp_path / "runs"
    r = cddp("up", str(inv), str(job), "--runs-dir", str(runs), timeout=120)
    assert r.returncode == 1 and "node1: host key of" in r.stderr, r.stdout + r.stderr
    assert not re.search(r"^run ", r.stdout, re.M), r.stdout  # no id that `clusterddp logs` would not find
    listed = cddp("runs", "--runs-dir", str(runs), check_rc=0, timeout=60).stdout
    assert listed.startswith("no runs in"), listed
    # a run that starts prints its id first, and `logs` finds it
    inv = bed.write_inventory(tmp_path / "inv.yaml")
    r = cddp("up", str(inv), str(job), "--runs-dir", str(runs), "--gpus", "1", check_rc=0, timeout=240)
    run_id = run_id_of(r.stdout)
    assert "never runs" in cddp("logs", run_id, "--runs-dir", str(runs), check_rc=0, timeout=60).stdout


@pytest.fixture
def not_ssh_listeners():
    """Four real loopback listeners that are not SSH servers: a real HTTP server (it answers the
    client's SSH version line with a 400 page), one that closes at once, one that resets the
    connection at once (what a client whose version line reached a closed socket reads), one
    that never speaks."""
    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    closer, mute = socket.create_server(("127.0.0.1", 0)), socket.create_server(("127.0.0.1", 0))
    resetter = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve(srv: socket.socket, keep: bool, reset: bool = False) -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            if reset:  # linger 0: close sends RST, not FIN
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            held.append(conn) if keep else conn.close()
    threads = [threading.Thread(target=web.serve_forever, daemon=True),
               threading.Thread(target=serve, args=(closer, False), daemon=True),
               threading.Thread(target=serve, args=(mute, True), daemon=True),
               threading.Thread(target=serve, args=(resetter, False, True), daemon=True)]
    for t in threads:
        t.start()
    yield {"web": web.server_address[1], "closer": closer.getsockname()[1], "mute": mute.getsockname()[1],
           "resetter": resetter.getsockname()[1]}
    stop.set()
    web.shutdown()
    for t in threads:
        t.join(10)
    for s in (web.socket, closer, mute, resetter, *held):
        s.close()


def test_a_port_that_is_not_ssh_is_reported_with_what_it_said(tmp_path, not_ssh_listeners):
    ports = not_ssh_listeners
    hosts = "".join(f"  - {{name: {n}, address: 127.0.0.1, port: {p}}}\n" for n, p in ports.items())
    # 10 s: the listeners are threads of this loaded process; the closer must get to close in time
    (tmp_path / "inv.yaml").write_text(f"defaults: {{known_hosts: {tmp_path}/kh, connect_timeout: 10}}\n"
                                       f"hosts:\n{hosts}")
    r = cddp("exec", "inv.yaml", "--", "true", cwd=tmp_path, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    said = {line.split(":", 1)[0].strip(): line for line in r.stderr.splitlines() if line.startswith("  ")}
    # what the HTTP server sent (its error page: it read paramiko's version line as an HTTP/0.9
    # request), escaped (newlines as \n) and cut at 64 bytes
    assert (f"web: root@127.0.0.1:{ports['web']} is not an SSH server: it answered "
            "'<!DOCTYPE HTML>\\n<html lang=\"en\">\\n") in said["web"], r.stderr
    assert said["web"].endswith("'..."), said["web"]
    assert said["closer"].endswith("accepted the connection, then closed it without an SSH greeting"), r.stderr
    # a reset may come while connecting or while our version line is sent: either way it is said as such
    assert said["resetter"].endswith(("accepted the connection, then closed it without an SSH greeting",
                                      "Connection reset by peer")), r.stderr
    assert said["mute"].endswith("accepted the connection but sent nothing within 10s (an SSH server greets at once)")


def test_running_the_main_command_twice_says_the_second_run_resumes(tmp_path):
    # README's main command, smaller: `up local` runs in the current folder, so the second run finds
    # the first one's checkpoints/ and resumes from them; its output says so, with the file's path
    cmd = ("up", "local", str(REPO / "examples" / "ddp_train.py"), "--gpus", "1", "--runs-dir", "runs", "--",
           "--epochs", "1")
    first = cddp(*cmd, cwd=tmp_path, check_rc=0).stdout
    assert "resumed" not in first and "[local] done world_size=1 final_step=16" in first, first
    second = cddp(*cmd, cwd=tmp_path, check_rc=0).stdout
    assert (f"[local] resumed from step 16: {tmp_path / 'checkpoints' / 'step-16.pt'} (to start afresh instead, "
            f"move {tmp_path / 'checkpoints'} away or pass another checkpoint folder)\n") in second, second


# torch's own words (torch 2.x), as nodes print them
NOISE = ("[W1130 14:02:11.000000000 socket.cpp:752] [c10d] The hostname of the client socket cannot be retrieved. "
         "err=-3\n"
         "*****************************************\n"
         "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system "
         "being overloaded, please further tune the variable for optimal performance in your application as needed. \n"
         "*****************************************\n"
         "/venv/lib/python3.11/site-packages/torch/_subclasses/functional_tensor.py:368: UserWarning: Failed to "
         "initialize NumPy: No module named 'numpy' (Triggered internally at tensor_numpy.cpp:84.)\n"
         "  cpu = _conversion_method_template(device=torch.device(\"cpu\"))\n")


def test_quiet_hides_known_torch_noise_on_the_terminal_and_the_log_keeps_it(tmp_path):
    script = job_script(tmp_path, "noisy.py", "import sys\n"
                        f"sys.stderr.write({NOISE!r})\n"
                        "print('epoch 0 loss 1.0')\n"
                        "print('  indented, mine')\n"  # not a warning's tail: shown
                        "print('*** my own stars ***')\n")
    runs = tmp_path / "runs"
    out = cddp("up", "local", str(script), "--gpus", "1", "--runs-dir", str(runs), "--quiet", cwd=tmp_path,
               check_rc=0)
    shown = [line for line in out.stdout.splitlines() if line.startswith("[local]") and "[clusterddp]" not in line]
    assert shown == ["[local] epoch 0 loss 1.0", "[local]   indented, mine", "[local] *** my own stars ***"], shown
    run_id = run_id_of(out.stdout)
    logs = runs / run_id / "logs"
    # the script's 6 lines, and torchrun's own when it imports torch without numpy
    hid = re.search(rf"--quiet hid (\d+) line\(s\) of known torch noise; {re.escape(str(logs))}/ keeps them",
                    out.stderr)
    assert hid and int(hid.group(1)) >= 6, out.stderr
    assert NOISE in (logs / "local.log").read_text()  # the file on disk is whole
    # logs shows it all, unless asked to be quiet too
    assert NOISE.splitlines()[0] in cddp("logs", run_id, "--runs-dir", str(runs), check_rc=0).stdout
    quiet = cddp("logs", run_id, "--runs-dir", str(runs), "-q", check_rc=0)
    assert "socket.cpp" not in quiet.stdout and "OMP_NUM_THREADS" not in quiet.stdout
    assert "[local] epoch 0 loss 1.0" in quiet.stdout and f"hid {hid.group(1)} line(s)" in quiet.stderr


def test_the_commands_table_is_one_table_and_the_readmes_python_is_pyprojects():
    text = (REPO / "README.md").read_text()
    page = (REPO / "docs" / "commands.md").read_text()
    section = page.split("\n## The commands at a glance\n", 1)[1].split("\n## ", 1)[0]
    rows = [i for i, line in enumerate(section.splitlines()) if line.startswith("| `clusterddp ")]
    assert len(rows) >= 9 and rows == list(range(rows[0], rows[0] + len(rows))), "a blank line splits the table"
    need = re.search(r'requires-python = ">=(3\.\d+)"', (REPO / "pyproject.toml").read_text())
    assert need and f"(Python {need.group(1)} or newer" in text


def test_a_failed_up_names_each_node_in_the_words_status_prints(tmp_path):
    script = job_script(tmp_path, "bad.py", "import sys; sys.exit(7)\n")
    runs = tmp_path / "runs"
    r = cddp("up", "local", str(script), "--gpus", "1", "--runs-dir", str(runs), cwd=tmp_path, check_rc=1)
    # The root cause names the rank and its own exit code (torchrun itself exits 1 for a failed rank)
    assert "\n  root cause: local, rank 0 (local rank 0): exited with code 7" in r.stderr, r.stderr
    status = cddp("status", run_id_of(r.stdout), "--runs-dir", str(runs), check_rc=0).stdout
    assert "\n  local: failed (exit code 1)\n" in status, status
