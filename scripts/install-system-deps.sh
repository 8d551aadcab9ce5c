#!/usr/bin/env bash
# Install the system packages the integration test bed (tests/testbed.py) needs,
# on Debian/Ubuntu, as root. Idempotent: apt is only touched when something is missing.
# It deliberately does not enable or start the system sshd or cron services: the test
# bed runs its own sshd per node, and a system sshd on port 22 would only get in the way.
set -euo pipefail

# slurmctld slurmd slurm-client munge: the Slurm test bed (tests/slurmbed.py) starts its own daemons;
# iptables: check --collective's test blocks a node's traffic to the master port.
# chromium: the `report` test opens the HTML report in a headless browser, network off.
PACKAGES=(openssh-server cron pdsh iproute2 procps rsync iptables slurmctld slurmd slurm-client munge chromium)

if [[ $EUID -ne 0 ]]; then
    echo "install-system-deps.sh: must run as root" >&2
    exit 1
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
    # dpkg -s also succeeds for removed packages whose config files remain: check Status.
    # (grep without -q reads all input, so dpkg never gets SIGPIPE under pipefail.)
    if ! dpkg -s "$pkg" 2>/dev/null | grep -x 'Status: install ok installed' >/dev/null; then
        missing+=("$pkg")
    fi
done

if ((${#missing[@]})); then
    echo "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # policy-rc.d exit 101 stops the packages' postinst scripts from starting services.
    policy=/usr/sbin/policy-rc.d
    created_policy=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        created_policy=1
    fi
    trap 'if [[ $created_policy == 1 ]]; then rm -f "$policy"; fi' EXIT
    apt-get update
    apt-get install -y --no-install-recommends "${missing[@]}"
else
    echo "system packages already installed: ${PACKAGES[*]}"
fi

# sshd's privilege separation refuses to start without this directory.
install -d -m 0755 /run/sshd
