"""known_hosts read as OpenSSH reads it: odd lines skipped with a warning, @revoked keys refused."""

from __future__ import annotations

import logging
import re
from dataclasses import replace

import pytest

from clusterddp import inventory
from clusterddp.errors import HostError, HostErrorKind
from clusterddp.transport import connect
from helpers import cddp

pytestmark = pytest.mark.integration


def key_of(bed, node) -> str:
    keytype, blob = (bed.root / node.name / "ssh_host_ed25519_key.pub").read_text().split()[:2]
    return f"{keytype} {blob}"


def test_odd_known_hosts_lines_are_skipped_with_a_warning_and_listed_hosts_connect(bed, tmp_path, caplog):
    n1, n2 = bed.nodes
    known = tmp_path / "known_hosts"
    known.write_text(
        "# a comment\n"
        f"{n1.address} ssh-ed25519 not*base64!\n"                           # 2: damaged key
        "@cert-authority *.example.com ssh-ed25519 "
        "AAAAC3NzaC1lZDI1NTE5AAAAIE3rxjVw4HBuU3eiYxGRZfvqsGOYY8dp0Tm1eJvNFvUa\n"
        "just-a-name\n"                                                      # 4: too few fields
        f"{n1.address} sk-ssh-ed25519@openssh.com AAAA\n"                   # 5: a type paramiko lacks
        "@nonsense host ssh-ed25519 AAAA\n"                                  # 6: an unknown marker
        f"{n1.address},{n2.address} {key_of(bed, n1)}\n"                    # wrong key for n2, right for n1
        f"{n2.address} {key_of(bed, n2)}\n")
    inv = bed.write_inventory(tmp_path / "inv.yaml", defaults_extra={"known_hosts": str(known)})
    hosts = inventory.load(inv).hosts
    with caplog.at_level(logging.WARNING, logger="clusterddp"):
        t = connect(hosts[0])
        assert t.run("hostname").exit_code == 0
        t.close()
    warned = [r.getMessage() for r in caplog.records if r.name == "clusterddp"]
    for lineno, words in ((2, "not a valid known_hosts line"), (3, "cannot verify host certificates"),
                          (4, "not a valid known_hosts line"), (5, "not supported"), (6, "unknown marker")):
        assert any(m.startswith(f"warning: {known}:{lineno}: ") and words in m for m in warned), (lineno, warned)
    # n2's first matching line lists n1's key: a changed key, as paramiko's first-entry rule says
    with pytest.raises(HostError, match="CHANGED"):
        connect(hosts[1])

    # the CLI shows the warnings on stderr, once per file, and the command succeeds
    known.write_text(known.read_text().replace(f"{n1.address},{n2.address} ", f"{n1.address} "))
    r = cddp("exec", str(inv), "--", "true", cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"warning: {known}:3: @cert-authority" not in r.stderr  # the warning names line and why, not the text
    assert r.stderr.count(f"{known}:3: paramiko cannot verify host certificates") == 1, r.stderr
    assert "Traceback" not in r.stderr


def test_a_revoked_host_key_is_refused_and_named(bed, tmp_path):
    n1, n2 = bed.nodes
    known = tmp_path / "known_hosts"
    host = replace(inventory.load(bed.write_inventory(tmp_path / "inv.yaml")).hosts[0], known_hosts=str(known))
    listed = f"{n1.address} {key_of(bed, n1)}\n"
    cases = {
        "listed and revoked": listed + f"@revoked {n1.address} {key_of(bed, n1)}\n",
        "revoked by a pattern": f"@revoked 10.*,!{n2.address} {key_of(bed, n1)}\n" + listed,
        "revoked, another key listed": f"{n1.address} {key_of(bed, n2)}\n@revoked * {key_of(bed, n1)}\n",
    }
    for case, text in cases.items():
        known.write_text(text)
        lineno = 1 + next(i for i, line in enumerate(text.splitlines()) if line.startswith("@revoked"))
        for policy in ("strict", "accept-new"):
            with pytest.raises(HostError, match=re.escape(f"host key of {n1.address} is REVOKED "
                                                          f"({known}:{lineno}; refused)")) as e:
                connect(replace(host, host_key_policy=policy))
            assert e.value.kind is HostErrorKind.HOST_KEY_CHANGED, case
            assert "@revoked" in e.value.hint
            assert known.read_text() == text, case  # accept-new never records a revoked key
    # a revocation for another host's key, or negated for this host, leaves this host alone
    known.write_text(listed + f"@revoked {n2.address} {key_of(bed, n1)}\n@revoked * {key_of(bed, n2)}\n")
    connect(host).close()
    known.write_text(listed + f"@revoked *,!{n1.address} {key_of(bed, n1)}\n")
    connect(host).close()
