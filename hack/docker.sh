#!/usr/bin/env bash
# Makes sure a Docker engine answers on this machine, for `make images` and
# the Docker tests (tests/integration/test_images_docker.py, tests/localkube). Idempotent: with an engine that answers, it does nothing.
#
#   hack/docker.sh
#
# Without dockerd it installs Debian's docker.io and iptables (hack/sysdeps/install.sh); with dockerd installed but
# not running it starts it in the background, in its own session (no systemd needed: CI and
# these machines have none), logging to $DOCKERD_LOG, and waits until `docker info` answers.
# Needs root for either. The engine keeps running afterwards.
#
#   DOCKERD_FLAGS   extra dockerd flags (default: none, i.e. Docker's defaults)
#   DOCKERD_LOG     dockerd's log (default /var/log/dockerd.log)
#   DOCKER_WAIT     seconds to wait for the engine (default 60)
#
# Docker's defaults switch net.ipv4.ip_forward on, set the iptables FORWARD policy to DROP and
# load br_netfilter: bridged traffic of other bridges is dropped from then on unless a rule
# accepts it. The local cluster adds such rules for its bridge (cluster/localkube/network.py).
set -euo pipefail

log=${DOCKERD_LOG:-/var/log/dockerd.log}
wait_s=${DOCKER_WAIT:-60}

answers() { docker info >/dev/null 2>&1; }

if command -v docker >/dev/null && answers; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "hack/docker.sh: no Docker engine answers, and installing or starting one needs root" >&2
  exit 1
fi

if ! command -v dockerd >/dev/null || ! command -v docker >/dev/null || ! command -v iptables >/dev/null; then
  # docker.io and iptables (which Docker's engine and our fixtures run) from the one list.
  "$(dirname "$0")/sysdeps/install.sh" dockerd iptables
  # The package's own service start (where an init system allowed it) may have done the rest.
  if answers; then
    exit 0
  fi
fi

if ! pgrep -x dockerd >/dev/null; then
  echo "[docker] starting dockerd${DOCKERD_FLAGS:+ $DOCKERD_FLAGS} (log: $log)" >&2
  mkdir -p "$(dirname "$log")"
  # setsid: the engine outlives the shell, make or pytest that asked for it.
  # shellcheck disable=SC2086  # DOCKERD_FLAGS is a list of flags
  setsid dockerd ${DOCKERD_FLAGS:-} >>"$log" 2>&1 </dev/null &
fi

for _ in $(seq "$((wait_s * 4))"); do
  if answers; then
    exit 0
  fi
  sleep 0.25
done
echo "hack/docker.sh: dockerd did not answer within ${wait_s}s; the end of $log:" >&2
tail -n 30 "$log" >&2 || true
exit 1
