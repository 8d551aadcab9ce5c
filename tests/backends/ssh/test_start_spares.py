"""A run's hosts that cannot be used when it starts (issue 39 section 6): which unreachable hosts a
spare may stand in for (pure), and a quarantined host's spare said, with the command that lets the
host back, before anything starts (before the preflight, which here fails: nothing answers).
On real sshd hosts (a host down at the start, its spare used): test_leftovers_ssh.py."""

from __future__ import annotations

import time

from clusterddp.backends.ssh import attempts as next_attempts
from clusterddp.errors import HostError, HostErrorKind
from helpers import cddp


def test_only_a_host_that_is_down_is_replaced_not_one_that_answers_wrongly():
    failed = {
        "a": HostError("a", "cannot connect: timed out after 3s", kind=HostErrorKind.TIMEOUT),
        "b": HostError("b", "cannot connect: no route to host", kind=HostErrorKind.UNREACHABLE),
        "c": HostError("c", "the connection was lost", kind=HostErrorKind.CONNECTION_LOST),
        "d": HostError("d", "its host key changed", kind=HostErrorKind.HOST_KEY_CHANGED),
        "e": HostError("e", "the login was refused", kind=HostErrorKind.AUTH_REFUSED),
        "f": HostError("f", "not an SSH server"),
        "g": RuntimeError("a bug"),
    }
    assert next_attempts.down_hosts(failed) == {
        "a": "cannot connect: timed out after 3s",
        "b": "cannot connect: no route to host",
        "c": "the connection was lost",
    }


def test_a_quarantined_hosts_spare_is_said_with_the_release_command_before_the_preflight(tmp_path):
    """Nothing answers (port 1 of this machine: refused at once), so the preflight fails; the line
    saying that the spare stands in for the quarantined host, and how to let it back, comes first."""
    inv = tmp_path / "inv.yaml"
    inv.write_text("defaults: {user: me, gpus: 1, workdir: /w, port: 1, connect_timeout: 3}\n"
                   "hosts: [{name: a, address: 127.0.0.1}, {name: b, address: 127.0.0.2}]\n"
                   "spares: [{name: s, address: 127.0.0.3}]\n")
    (tmp_path / "t.py").write_text("print(1)\n")
    cddp("quarantine", "add", str(inv), "b", "--for", "1h", "--why", "lost twice", check_rc=0)
    t0 = time.monotonic()
    r = cddp("up", str(inv), str(tmp_path / "t.py"), "--runs-dir", str(tmp_path / "runs"), check_rc=1)
    note = ("[clusterddp] b is quarantined until ", " (lost twice): spare s runs in its place "
            "(`clusterddp quarantine release b` lets it back)")
    first = r.stderr.splitlines()[0]
    assert first.startswith(note[0]) and first.endswith(note[1]), r.stderr
    assert "preflight check failed" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert time.monotonic() - t0 < 60
