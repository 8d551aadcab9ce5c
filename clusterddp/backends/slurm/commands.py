"""The shell a `slurm:` inventory's login host runs (:mod:`.login`): Slurm's client
commands after the login host's setup lines and env, and the reads and writes of the shared folder.
Pure text, quoted through :mod:`clusterddp.nodescript`; golden-tested (tests/golden/slurm_login_commands.txt).
"""

from __future__ import annotations

from collections.abc import Sequence

from ...inventory import Host
from ...nodescript import NodeCommand, env_stdin, preamble, q

LOGIN_SETUP_FAILED = 98  # what login_command exits with when one of the login host's setup lines failed
NO_FILE = 3  # what file_read_command exits with when the file is not there


def login_command(host: Host, words: Sequence[str]) -> NodeCommand:
    """A Slurm client command (sbatch, scontrol, scancel, sinfo, srun) on the login host: after its setup
    lines (their output discarded: sbatch --parsable's answer must stay alone on stdout) and its env (on
    stdin: values never on a command line), each word quoted."""
    lines = preamble(host, host.env, stdout_to=">/dev/null", env_on_stdin=True,
                      on_fail=lambda line: f"echo {q('[clusterddp] setup failed: ' + line)} >&2; "
                                           f"exit {LOGIN_SETUP_FAILED}")
    lines.append("exec " + " ".join(q(w) for w in words))
    return NodeCommand("\n".join(lines), env_stdin(host.env))


def home_command() -> str:
    """The login user's home there, which a shared_dir of ``~/...`` (or a relative one) is under."""
    return "printf '%s\\n' \"$HOME\""


def file_read_command(path: str, offset: int, limit: int) -> str:
    """At most ``limit`` bytes of the file at ``path`` from byte ``offset`` (a node log growing in the
    shared folder, read a piece at a time); exit NO_FILE when there is none."""
    p = q(path)
    return f"[ -f {p} ] || exit {NO_FILE}; tail -c +{int(offset) + 1} {p} | head -c {int(limit)}"


def small_files_command(paths: Sequence[str], most: int = 32) -> str:
    """For each of ``paths`` that exists, one line: its index, its mtime (s, fractional) and its first
    ``most`` bytes on that line (each node's exit code file)."""
    words = " ".join(q(p) for p in paths)
    return (f"i=0; for f in {words}; do [ -f \"$f\" ] && printf '%s %s %s\\n' \"$i\" \"$(stat -c %.9Y \"$f\")\" "
            f"\"$(head -c {int(most)} \"$f\" | tr -d '\\n')\"; i=$((i+1)); done; exit 0")


def stage_command(run_dir: str, control_dir: str) -> str:
    """Create a Slurm run's folder and its private control folder (0700, refused when it exists: a run
    folder is never reused), then unpack standard input (a gzip tar of the script's folder and the
    0600 job.sbatch and node.sh) into the run folder with the modes it carries."""
    ctl = q(control_dir)
    return (f"mkdir -p {q(run_dir)} && cd {q(run_dir)} || exit 1; "
            f"mkdir -m 700 {ctl} || {{ echo {q(run_dir + ' already holds a run')} >&2; exit {NO_FILE}; }}; "
            f"mkdir -m 700 {q(control_dir + '/nodes')} && tar -xzpf - --no-same-owner")


def stop_mark_command(control_dir: str, name: str) -> str:
    """Leave `clusterddp stop`'s mark (``name``, empty, 0600) in a run's control folder: a batch
    script that tells the run's end (:func:`.plan.notify_lines`) then tells it as stopped."""
    return f"(umask 077 && : > {q(control_dir + '/' + name)})"


def remove_tree_command(path: str) -> str:
    """Remove a folder clusterddp made on the login host (check's probe folder)."""
    return f"rm -rf -- {q(path)}"


STEP_KILL_AFTER = 5  # seconds between the TERM and the KILL of a node step that outlived its bound


def node_step_command(job_id: str, host: str, command: str, limit: float, most: int) -> list[str]:
    """The words (for :meth:`Login.run <.login.Login.run>`) that run ``command`` on node ``host`` of
    the running job ``job_id``: one job step of one task there, beside the job's own step
    (``--overlap``: it takes no resources from it, and waits for none), its standard input none. Ended
    after ``limit`` seconds (coreutils' timeout: exit 124; srun passes the TERM on to the step's task);
    its standard output cut at ``most`` bytes (a node's answer is untrusted)."""
    srun = ["srun", f"--jobid={job_id}", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={host}",
            "--job-name=clusterddp-node", "--input=none", "--quiet", "bash", "-c", command]
    line = (f"set -o pipefail; timeout -k {STEP_KILL_AFTER} {limit:g} {' '.join(q(w) for w in srun)} "
            f"| head -c {int(most)}")
    return ["bash", "-c", line]
