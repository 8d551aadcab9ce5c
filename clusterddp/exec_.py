"""`clusterddp exec`: the user's command on every host, as the node runs it (after the host's setup
lines, with its env on stdin). Pure: the CLI (``cli/exec_.py``) sends it through the fleet."""

from __future__ import annotations

from .inventory import Host
from .nodescript import MARKER, NodeCommand, env_stdin, preamble, q

EXEC_TIMED_OUT = 124  # what coreutils' timeout exits with when it ended the command


def exec_command(host: Host, words: list[str] | tuple[str, ...], limit: float | None = None,
                 marker: str | None = None) -> NodeCommand:
    """The user's command for ``clusterddp exec``, after the host's setup lines and env.

    Like ssh and pdsh, the words are joined with spaces and the remote shell interprets
    them (pipes, globs, ``$VAR``): ``exec inv -- 'ls runs | wc -l'`` works, and arguments
    that must stay one word need quoting for the remote shell. The env arrives on stdin, which
    is read to its end first: the user's command finds its stdin empty (it never was interactive).

    With ``limit`` (``exec --timeout``) the node ends the command itself after that many seconds
    (coreutils' ``timeout``: SIGTERM to its whole process group, SIGKILL 5 s later), since closing
    the connection does not stop a command that has no terminal. It then runs in a child of the
    same shell (bash where the node's shell is bash), which sees the exported env and PATH but
    not shell functions the setup lines did not export.

    With ``marker`` every process the command starts carries ``CLUSTERDDP_JOB=marker`` in its
    environment, so :func:`kill_marked_command` can end them after a Ctrl-C.
    """
    lines = [f"export CLUSTERDDP_HOST={q(host.name)}"]
    if marker is not None:
        lines.append(f"export {MARKER}={q(marker)}")
    lines += preamble(host, host.env, stdout_to=">/dev/null", env_on_stdin=True,
                       on_fail=lambda line: f"echo {q('[clusterddp] setup failed: ' + line)} >&2; exit 98")
    text = " ".join(words)
    if limit is not None:
        text = f'timeout -k 5 {limit:.3f} "${{BASH:-sh}}" -c {q(text)}'
    lines.append(text)
    return NodeCommand("\n".join(lines), env_stdin(host.env))
