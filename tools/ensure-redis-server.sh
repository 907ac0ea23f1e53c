#!/usr/bin/env bash
# The tests start their own private redis-server from the binary. Install it when missing and we can.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "redis-server is missing: installing it with apt-get..."
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  command -v redis-server >/dev/null 2>&1 && exit 0
fi
echo "make test needs the redis-server binary on PATH and could not install it (not root or no apt-get): install redis-server (e.g. 'sudo apt-get install redis-server') and run make test again." >&2
exit 1
