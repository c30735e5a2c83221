#!/usr/bin/env bash
# Install the single-node SLURM cluster the `slurm` tests start (Debian packages), when it is absent.
# The tests start munged, slurmctld and slurmd as their own processes from a throw-away config
# (tests/slurm/cluster.py); nothing here starts a service.
set -euo pipefail
if command -v sbatch >/dev/null && command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
   && command -v munged >/dev/null && command -v setfacl >/dev/null; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "SLURM is not installed and this is not root: apt-get install slurmctld slurmd slurm-client munge acl" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# Package scripts must not start the daemons: the tests run their own.
policy=/usr/sbin/policy-rc.d
created=0
if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"; created=1; fi
apt-get update -qq
# acl: setfacl lets the unprivileged job user traverse to an interpreter under /root (tests/slurm/cluster.py)
apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge acl >/dev/null
if [ "$created" = 1 ]; then rm -f "$policy"; fi
echo "installed: slurm $(dpkg-query -W -f='${Version}' slurmctld)"
