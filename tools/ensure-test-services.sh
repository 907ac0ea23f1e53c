#!/usr/bin/env bash
# The tests start their own private redis-server and docker-registry from the binaries (on free loopback ports).
# Install what is missing when we can (root + apt-get); otherwise say exactly what to install.
set -euo pipefail
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v docker-registry >/dev/null 2>&1 || missing+=(docker-registry)
command -v git >/dev/null 2>&1 || missing+=(git)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "Installing ${missing[*]} with apt-get (the tests run them on loopback)..."
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  still=()
  for bin in "${missing[@]}"; do command -v "$bin" >/dev/null 2>&1 || still+=("$bin"); done
  [ ${#still[@]} -eq 0 ] && exit 0
  missing=("${still[@]}")
fi
echo "make test needs ${missing[*]} on PATH and could not install them (not root, or apt-get failed): install them (e.g. 'sudo apt-get install ${missing[*]}') and run make test again." >&2
exit 1
