"""How the SSH transport resolves a host from ssh_config and the inventory, before any connection.

The same promises are tested on real hosts in test_transport_ssh.py and test_ssh_promises.py;
these check the resolved route itself, fast, including cases a test bed cannot show (a loop).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from clusterddp.errors import HostError, HostErrorKind
from clusterddp.transport import ssh
from test_transport_process import a_host


@pytest.fixture
def ssh_config(tmp_path, monkeypatch):
    """Write ~/.ssh/config in a fresh HOME."""
    (tmp_path / ".ssh").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path))

    def write(text: str) -> None:
        (tmp_path / ".ssh" / "config").write_text(text)
    return write


def route(host) -> list[str]:
    """The hops to `host` as user@host:port, first jump host first, and a ProxyCommand if any."""
    t = ssh.SSHTransport(host)
    t._conn = conn = ssh._Hop(host.address, t, config=ssh._fabric_config(host), user=host.user, port=host.port)
    hops = []
    while isinstance(conn, ssh._Hop):
        hops.insert(0, conn.where)
        conn = conn.gateway
    return ([f"proxy: {conn}"] if conn else []) + hops


def test_proxyjump_lists_and_a_jump_hosts_own_proxyjump_give_openssh_order(ssh_config):
    ssh_config("Host b\n  HostName 10.0.0.2\n  ProxyJump a\n"
               "Host listed\n  HostName 10.0.0.9\n  ProxyJump x@10.0.0.1,b:2200\n"
               "Host nested\n  HostName 10.0.0.9\n  ProxyJump b\n"
               "Host off\n  HostName 10.0.0.9\n  ProxyJump none\n"
               "Host bastion\n  ProxyJump bastion\n"  # as a `Host *` ProxyJump reads for the bastion itself
               "Host *\n  User u\n")
    assert route(replace(a_host(), address="nested")) == ["u@a:22", "u@10.0.0.2:22", "u@10.0.0.9:22"]
    # the listed hops in order; b, not first in the list, is reached through x@10.0.0.1, not its own ProxyJump
    assert route(replace(a_host(), address="listed")) == ["x@10.0.0.1:22", "u@10.0.0.2:2200", "u@10.0.0.9:22"]
    assert route(replace(a_host(), address="off")) == ["u@10.0.0.9:22"]
    assert route(replace(a_host(), address="bastion")) == ["u@bastion:22"]


def test_the_inventorys_user_and_port_are_a_proxycommands_r_and_p(ssh_config):
    ssh_config("Host gpu\n  HostName 10.0.0.5\n  User cfg-user\n  Port 2222\n  ProxyCommand nc -X %r %h %p\n")
    assert route(replace(a_host(), address="gpu")) == ["proxy: nc -X cfg-user 10.0.0.5 2222", "cfg-user@10.0.0.5:2222"]
    assert route(replace(a_host(), address="gpu", user="root", port=22)) == ["proxy: nc -X root 10.0.0.5 22",
                                                                           "root@10.0.0.5:22"]


def test_a_proxyjump_loop_is_a_config_error_naming_the_host(ssh_config):
    ssh_config("Host a\n  ProxyJump b\nHost b\n  ProxyJump a\n")
    with pytest.raises(HostError, match="cannot use the ssh_config entry for a: its ProxyJump hosts jump through "
                                        "each other in a loop") as e:
        ssh.open(replace(a_host(), address="a"))
    assert e.value.kind is HostErrorKind.CONFIG and "~/.ssh/config" in e.value.hint


def test_ssh_config_is_parsed_once_and_again_when_it_changes(ssh_config, monkeypatch):
    ssh_config("Host gpu\n  HostName 10.0.0.5\n")
    first = ssh._ssh_config()
    assert ssh._ssh_config() is first
    ssh_config("Host gpu\n  HostName 10.0.0.6\n")
    assert ssh._ssh_config().lookup("gpu")["hostname"] == "10.0.0.6"
